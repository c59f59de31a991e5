"""ProcessResolver over a fake /proc tree in tmp_path, and once over the real one."""

from __future__ import annotations

import builtins
import errno
import os
import pwd
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpumon.gpu.attribution import proc as proc_mod
from gpumon.gpu.attribution.proc import ProcessOwner, ProcessResolver

CID = "d7dfb4a21fe1703a8537e60d5af248af729315d187b24a538102d14874c8117d"
POD = "1e597579-417e-482f-bf65-5fe170c3aebd"
POD_CGROUP = (
    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
    f"{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
)
SLURM_CGROUP = "0::/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0\n"
HOST_CGROUP = "0::/user.slice/user-1000.slice/session-2.scope\n"
NO_SUCH_UID = 2_000_000_123


def make_proc(
    root: Path,
    pid: int,
    *,
    comm: str = "python3",
    uid: int = 0,
    start: int = 4242,
    cgroup: str = HOST_CGROUP,
    environ: bytes = b"PATH=/usr/bin\0HOME=/root\0",
) -> Path:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # fields 3..21, then starttime (22), vsize, rss: the layout of proc(5)
    after = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "0", "0", "0", "0"]
    after += ["5", "3", "0", "0", "20", "0", "1", "0", str(start), "1000000", "100"]
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(after)}\n")
    (d / "comm").write_text(comm[:15] + "\n")
    (d / "status").write_text(
        f"Name:\t{comm[:15]}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t1\n"
        f"Uid:\t{uid}\t{uid + 1}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n"
    )
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(environ)
    return d


def set_start(root: Path, pid: int, start: int) -> None:
    stat = root / str(pid) / "stat"
    head, _, tail = stat.read_text().rpartition(")")
    fields = tail.split()
    fields[19] = str(start)
    stat.write_text(f"{head}) {' '.join(fields)}\n")


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[str]]:
    """Record (and optionally sabotage) every file the resolver opens."""
    paths: list[str] = []
    failures: dict[str, OSError] = {}
    hooks: dict[str, Callable[[], None]] = {}

    def fake_open(path: str, *args: Any, **kwargs: Any) -> Any:
        paths.append(path)
        name = os.path.basename(path)
        if name in hooks:
            hooks.pop(name)()
        if name in failures:
            raise failures[name]
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(proc_mod, "open", fake_open, raising=False)

    def control(fail: dict[str, OSError] | None = None, hook: dict[str, Callable[[], None]] | None = None):
        failures.update(fail or {})
        hooks.update(hook or {})
        return paths

    return control


def test_container_and_pod(tmp_path: Path) -> None:
    make_proc(tmp_path, 100, comm="vllm", cgroup=POD_CGROUP)
    assert ProcessResolver(str(tmp_path)).resolve(100) == ProcessOwner(
        100, "vllm", "root", CID, "containerd", POD, None
    )


def test_slurm_from_the_cgroup_wins_over_the_environment(tmp_path: Path, opened) -> None:
    make_proc(tmp_path, 101, cgroup=SLURM_CGROUP, environ=b"SLURM_JOB_ID=7\0")
    owner = ProcessResolver(str(tmp_path)).resolve(101)
    assert owner is not None and owner.slurm_job_id == "1392969" and owner.container_id is None
    assert not any(p.endswith("environ") for p in opened())  # the cgroup said enough


def test_slurm_from_the_environment_only(tmp_path: Path) -> None:
    make_proc(tmp_path, 102, environ=b"PATH=/usr/bin\0SLURM_JOB_ID=555\0SLURM_STEP_ID=0\0")
    owner = ProcessResolver(str(tmp_path)).resolve(102)
    assert owner is not None and owner.slurm_job_id == "555"


@pytest.mark.parametrize("environ", [b"", b"SLURM_JOB_IDX=5\0", b"SLURM_JOB_ID=\0", b"SLURM_JOB_ID=abc\0"])
def test_no_usable_slurm_job_in_the_environment(tmp_path: Path, environ: bytes) -> None:
    make_proc(tmp_path, 103, environ=environ)
    owner = ProcessResolver(str(tmp_path)).resolve(103)
    assert owner is not None and owner.slurm_job_id is None


def test_unreadable_environ_leaves_the_rest(tmp_path: Path, opened) -> None:
    make_proc(tmp_path, 104, comm="torchrun", environ=b"SLURM_JOB_ID=9\0")
    opened(fail={"environ": PermissionError(errno.EACCES, "Permission denied")})
    assert ProcessResolver(str(tmp_path)).resolve(104) == ProcessOwner(
        104, "torchrun", "root", None, None, None, None
    )


def test_unreadable_status_gives_no_user(tmp_path: Path, opened) -> None:
    make_proc(tmp_path, 105, comm="a", cgroup=POD_CGROUP)
    opened(fail={"status": PermissionError(errno.EACCES, "Permission denied")})
    owner = ProcessResolver(str(tmp_path)).resolve(105)
    assert owner is not None and owner.user is None and owner.pod_uid == POD and owner.name == "a"


def test_unreadable_stat_still_gives_what_can_be_read(tmp_path: Path, opened) -> None:
    make_proc(tmp_path, 118, comm="b", cgroup=POD_CGROUP)
    paths = opened(fail={"stat": PermissionError(errno.EACCES, "Permission denied")})
    resolver = ProcessResolver(str(tmp_path))
    assert resolver.resolve(118) == ProcessOwner(118, "b", "root", CID, "containerd", POD, None)
    paths.clear()
    resolver.resolve(118)
    assert len(paths) > 1  # no start time to key a cache entry on


def test_a_missing_file_in_a_live_process_is_just_missing(tmp_path: Path) -> None:
    (make_proc(tmp_path, 106, comm="x") / "cgroup").unlink()
    owner = ProcessResolver(str(tmp_path)).resolve(106)
    assert owner == ProcessOwner(106, "x", "root", None, None, None, None)


def test_no_such_pid(tmp_path: Path) -> None:
    assert ProcessResolver(str(tmp_path)).resolve(999) is None


def test_vanished_after_caching(tmp_path: Path) -> None:
    resolver = ProcessResolver(str(tmp_path))
    make_proc(tmp_path, 107)
    assert resolver.resolve(107) is not None
    shutil.rmtree(tmp_path / "107")
    assert resolver.resolve(107) is None


def test_vanished_while_reading(tmp_path: Path, opened) -> None:
    make_proc(tmp_path, 108)
    opened(hook={"status": lambda: shutil.rmtree(tmp_path / "108")})
    assert ProcessResolver(str(tmp_path)).resolve(108) is None


def test_esrch_means_gone(tmp_path: Path, opened) -> None:
    make_proc(tmp_path, 109)
    opened(fail={"comm": ProcessLookupError(errno.ESRCH, "No such process")})
    assert ProcessResolver(str(tmp_path)).resolve(109) is None


def test_pid_reused_while_reading_is_not_cached(tmp_path: Path, opened) -> None:
    make_proc(tmp_path, 110, comm="old")
    opened(hook={"cgroup": lambda: set_start(tmp_path, 110, 9999)})
    resolver = ProcessResolver(str(tmp_path))
    assert resolver.resolve(110) is None
    assert resolver.resolve(110) is not None  # the next sample reads the new process cleanly


def test_a_cached_hit_reads_only_stat(tmp_path: Path, opened) -> None:
    make_proc(tmp_path, 111, cgroup=POD_CGROUP)
    resolver = ProcessResolver(str(tmp_path))
    first = resolver.resolve(111)
    paths = opened()
    paths.clear()
    assert resolver.resolve(111) is first
    assert paths == [str(tmp_path / "111" / "stat")]


def test_pid_reuse_is_noticed(tmp_path: Path) -> None:
    resolver = ProcessResolver(str(tmp_path))
    make_proc(tmp_path, 112, comm="old", start=100, cgroup=POD_CGROUP)
    assert resolver.resolve(112).name == "old"  # type: ignore[union-attr]
    make_proc(tmp_path, 112, comm="new", start=100, cgroup=HOST_CGROUP)
    assert resolver.resolve(112).name == "old"  # type: ignore[union-attr]  # same start time: cached
    set_start(tmp_path, 112, 101)
    owner = resolver.resolve(112)
    assert owner is not None and owner.name == "new" and owner.container_id is None


def test_prune_forgets_the_dead(tmp_path: Path, opened) -> None:
    resolver = ProcessResolver(str(tmp_path))
    for pid in (113, 114):
        make_proc(tmp_path, pid)
        resolver.resolve(pid)
    resolver.prune([113])
    paths = opened()
    paths.clear()
    resolver.resolve(113)
    assert len(paths) == 1  # still cached
    paths.clear()
    resolver.resolve(114)
    assert len(paths) > 2  # read afresh


def test_unknown_uid_is_reported_by_number(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        pwd.getpwuid(NO_SUCH_UID)
    make_proc(tmp_path, 115, uid=NO_SUCH_UID)
    owner = ProcessResolver(str(tmp_path)).resolve(115)
    assert owner is not None and owner.user == str(NO_SUCH_UID)  # the real uid, not the effective


def test_comm_with_spaces_and_parentheses(tmp_path: Path) -> None:
    resolver = ProcessResolver(str(tmp_path))
    make_proc(tmp_path, 116, comm="a) 1 2 (b", start=10)
    assert resolver.resolve(116).name == "a) 1 2 (b"  # type: ignore[union-attr]
    make_proc(tmp_path, 116, comm="a) 1 2 (b", start=11)
    (tmp_path / "116" / "comm").write_text("c\n")
    assert resolver.resolve(116).name == "c"  # type: ignore[union-attr]  # start time parsed correctly


@pytest.mark.parametrize("stat", ["", "116 (x\n", "116 (x) S 1\n", "116 (x) " + "z " * 30])
def test_garbage_stat_is_no_process(tmp_path: Path, stat: str) -> None:
    (make_proc(tmp_path, 117) / "stat").write_text(stat)
    assert ProcessResolver(str(tmp_path)).resolve(117) is None


def test_the_real_proc() -> None:
    owner = ProcessResolver().resolve(os.getpid())
    assert owner is not None and owner.pid == os.getpid()
    assert owner.name == psutil.Process().name()[:15]
    try:
        expected_user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        expected_user = str(os.getuid())
    assert owner.user == expected_user
    # container, pod and job depend on where the tests run: only their types are certain
    for value in (owner.container_id, owner.runtime, owner.pod_uid, owner.slurm_job_id):
        assert value is None or isinstance(value, str)
