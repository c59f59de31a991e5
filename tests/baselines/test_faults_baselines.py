"""Faults of the baseline library file: many writers at once, a writer killed mid-write, a corrupted file.

Concurrent writers are real ``gpumon baseline`` processes, as on a node where two engineers record at once.
A writer is SIGKILLed (what kill -9, the OOM killer or a reboot does to it) at every file-system call it
makes while it holds the lock, and the real command at the rename that commits it. What was committed is
never lost, a reader never sees half a file, and a file that is not a library is refused in one line
naming it, by every command and by the daemon, which keeps the library it read before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import ROOT, gpumon_cmd, run_gpumon, start_daemon
from support.poll import poll
from test_baseline_cli import Node

from gpumon.baselines import library as B
from gpumon.baselines.watch import LibraryWatch
from gpumon.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

H100 = "NVIDIA H100 80GB HBM3"


def entry(name: str, gpus: int) -> B.Baseline:
    """A distinct key per GPU count, so entries never collide."""
    key = B.Key("llama3-8b", H100, gpus, "bf16", "palm")
    return B.Baseline(name, key, B.Figures(1000.0 + gpus, 2.0, 0.4, 2.5), recorded_at="2026-11-22T14:00:00")


def library(*names_and_gpus: tuple[str, int]) -> B.Library:
    return B.Library(tuple(sorted((entry(n, g) for n, g in names_and_gpus), key=lambda b: b.name)))


def names(path: Path | str) -> list[str]:
    return [b.name for b in B.load(str(path)).baselines]


def gpumon(lib: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    # no daemon is asked: --baselines names the file, and nothing listens on the URL
    return run_gpumon("baseline", "--baselines", str(lib), *args, env={"GPUMON_URL": "http://127.0.0.1:9"})


def temp_files(directory: Path) -> list[str]:
    return sorted(p for p in os.listdir(directory) if p.endswith(".tmp"))


# --- many writers ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_many_concurrent_writer_processes_lose_no_committed_entry_and_readers_never_see_half_a_file(
    tmp_path: Path,
) -> None:
    lib = tmp_path / "baselines.toml"
    B.save(str(lib), library(*((f"old{i}", 100 + i) for i in range(4))))
    sources = []
    for i in range(6):
        src = tmp_path / f"import{i}.toml"
        B.save(str(src), library((f"new{i}", i + 1)))
        sources.append(src)
    universe = {f"old{i}" for i in range(4)} | {f"new{i}" for i in range(6)}

    seen: list[frozenset[str]] = []
    torn: list[str] = []
    done = threading.Event()

    def read() -> None:  # what the daemon does, as often as it can
        while not done.is_set():
            try:
                seen.append(frozenset(names(lib)))
            except B.LibraryError as exc:
                torn.append(str(exc))
            time.sleep(0.005)  # leave the writers some CPU

    reader = threading.Thread(target=read)
    reader.start()
    try:
        # hold the lock while every writer starts, so that they queue on it rather than run one by one
        with B.editing(str(lib)):
            procs = [
                subprocess.Popen(
                    gpumon_cmd("baseline", "--baselines", str(lib), *args),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=ROOT,
                )
                for args in [("import", str(s)) for s in sources] + [("delete", f"old{i}") for i in range(2)]
            ]
            time.sleep(1.0)
            assert names(lib) == sorted(f"old{i}" for i in range(4))  # nothing written while it is held
        for p in procs:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
    finally:
        done.set()
        reader.join(30)
    assert names(lib) == sorted({"old2", "old3"} | {f"new{i}" for i in range(6)})
    tomllib.loads(lib.read_text())
    assert not torn, torn[:3]
    assert seen and all(s <= universe for s in seen)
    assert temp_files(tmp_path) == []


# --- a writer killed mid-write -----------------------------------------------------------------------

# Wraps the file-system calls a writer makes once it holds the lock (from its flock on), to SIGKILL the
# process at the chosen one: the STOP-th such call, or the first of that name; before the call ("before";
# a write is cut in half first, a torn temporary file) or just after it ("after"). What it was killed at
# goes to REPORT_FD first. A writer that makes fewer calls completes normally.
HOOKS = r"""
import fcntl, os, signal

def arm(stop, when, report_fd):
    real_write, calls, armed = os.write, [0], [False]

    def die(what):
        real_write(report_fd, what.encode() + b"\n")
        os.kill(os.getpid(), signal.SIGKILL)

    def hook(name, real):
        def call(*a, **kw):
            if name == "flock":
                armed[0] = True
            if not armed[0]:
                return real(*a, **kw)
            calls[0] += 1
            here = calls[0] == stop or name == stop
            if here and when == "before":
                if name == "write" and len(a[1]) > 1:
                    real(a[0], bytes(a[1])[: len(a[1]) // 2])
                die(f"killed before {name}")
            result = real(*a, **kw)
            if here and when == "after":
                die(f"killed after {name}")
            return result
        return call

    for name in ("open", "close", "read", "write", "pwrite", "fstat", "stat", "lstat", "fsync", "fdatasync",
                 "fchmod", "fchown", "chmod", "chown", "replace", "rename", "link", "unlink", "ftruncate",
                 "makedirs", "mkdir", "listdir", "scandir", "lseek"):
        if hasattr(os, name):
            setattr(os, name, hook(name, getattr(os, name)))
    fcntl.flock = hook("flock", fcntl.flock)
"""

OLD = library(("a", 1), ("b", 2))
NEW = library(("a", 1), ("b", 2), ("c", 3))


def _killed_writer(lib: Path, stop: int, when: str) -> str | None:
    """A forked writer adding ``c`` with the kill armed; what it was killed at, or None if it finished."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(r)
            hooks: dict[str, object] = {}
            exec(HOOKS, hooks)
            hooks["arm"](stop, when, w)  # type: ignore[operator]
            with B.editing(str(lib)) as box:
                box[0], _ = box[0].put(entry("c", 3))
        except BaseException:
            os._exit(1)
        os._exit(0)
    os.close(w)
    try:
        with _no_longer_than(30, f"a writer armed to die at call {stop} ({when})"), os.fdopen(r) as fh:
            said = fh.read().strip()
            _, status = os.waitpid(pid, 0)
    except BaseException:
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL and said, said
        return said
    assert os.WEXITSTATUS(status) == 0 and not said
    return None


def test_a_writer_killed_at_any_point_of_a_write_leaves_the_old_or_the_new_library_and_no_debris(
    tmp_path: Path,
) -> None:
    killed_at: list[str] = []
    outcomes: set[str] = set()
    for stop in range(1, 200):
        finished = 0
        for when in ("before", "after"):
            d = tmp_path / f"{stop}-{when}"
            d.mkdir()
            lib = d / "baselines.toml"
            B.save(str(lib), OLD)
            (d / ".baselines.toml.0123456789ab.tmp").write_text("left by an earlier kill")
            said = _killed_writer(lib, stop, when)
            if said is None:
                finished += 1
                assert lib.read_text() == B.render(NEW) and temp_files(d) == []
                continue
            killed_at.append(said)
            # the file is one library or the other, whole: never empty, never torn
            text = lib.read_text()
            assert text in (B.render(OLD), B.render(NEW)), f"{said}: {text!r}"
            outcomes.add("old" if text == B.render(OLD) else "new")
            # the next writer gets the lock at once (the kernel dropped the dead one's), commits, and
            # clears what the dead one left behind
            with _no_longer_than(30, f"the next writer after the one {said}"), B.editing(str(lib)) as box:
                box[0], _ = box[0].put(entry("d", 4))
            assert set(names(lib)) >= {"a", "b", "d"}
            assert temp_files(d) == [], f"left behind by the writer {said}"
        if finished == 2:
            break
    else:
        pytest.fail("the writer never finished")
    points = {k.split()[-1] for k in killed_at}
    assert {"flock", "open", "unlink", "write", "fsync", "replace"} <= points, killed_at
    assert "killed before write" in killed_at  # a temporary file cut in half
    assert outcomes == {"old", "new"}  # killed both before and after the rename


@pytest.mark.slow
def test_a_gpumon_baseline_import_killed_mid_write_loses_nothing_committed(tmp_path: Path) -> None:
    """The same through the real command, killed just before and just after the rename commits it."""
    src = tmp_path / "fleet.toml"
    B.save(str(src), library(("c", 3)))
    for when, expected in (("before", OLD), ("after", NEW)):
        lib = tmp_path / when / "baselines.toml"
        B.save(str(lib), OLD)
        script = (
            HOOKS + f"arm('replace', {when!r}, 2)\nfrom gpumon.cli import main\nraise SystemExit(main())\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", script, "baseline", "--baselines", str(lib), "import", str(src)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert proc.returncode == -signal.SIGKILL and f"killed {when} replace" in proc.stderr, proc.stderr
        assert lib.read_text() == B.render(expected)
        again = gpumon(lib, "import", str(src), "--replace")
        assert again.returncode == 0, again.stderr
        assert names(lib) == ["a", "b", "c"] and temp_files(lib.parent) == []


@contextlib.contextmanager
def _no_longer_than(seconds: float, what: str) -> Iterator[None]:
    """Fail (rather than hang the suite) when the block blocks; the bound only catches a lock never freed."""
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGALRM))
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail(f"{what} blocked for {seconds} s"))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGALRM, previous)


def test_a_writer_that_holds_the_lock_and_hangs_makes_the_next_one_fail_clearly_not_wait_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "baselines.toml"
    B.save(str(lib), library(("a", 1)))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom gpumon.baselines import library as B\n"
            "with B.editing(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)\n",
            str(lib),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        os.kill(holder.pid, signal.SIGSTOP)  # a writer stuck on a hung disk or a stopped terminal
        monkeypatch.setattr(B, "LOCK_TIMEOUT", 0.5)
        with pytest.raises(B.LibraryError) as e, B.editing(str(lib)) as box:
            box[0], _ = box[0].put(entry("b", 2))
        message = str(e.value)
        assert (
            f"{lib}.lock" in message and f"pid {holder.pid}" in message and "nothing was written" in message
        )
        assert names(lib) == ["a"]
    finally:
        holder.kill()
        holder.wait()
    with _no_longer_than(30, "the writer after the holder died"), B.editing(str(lib)) as box:
        box[0], _ = box[0].put(entry("b", 2))
    assert names(lib) == ["a", "b"]


# --- durability --------------------------------------------------------------------------------------


def test_save_fsyncs_the_new_file_before_the_rename_and_the_directory_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A power cut cannot be simulated here; what makes the write survive one is this order of calls."""
    lib = tmp_path / "baselines.toml"
    B.save(str(lib), library(("a", 1)))
    events: list[tuple[str, object]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        events.append(("fsync dir" if stat.S_ISDIR(st.st_mode) else "fsync file", (st.st_dev, st.st_ino)))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append(("replace", dst))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    B.save(str(lib), library(("a", 1), ("b", 2)))
    kinds = [k for k, _ in events]
    assert kinds == ["fsync file", "replace", "fsync dir"], events
    st, dst = os.stat(lib), os.stat(tmp_path)
    assert events[0][1] == (st.st_dev, st.st_ino)  # the file now at the path is the one flushed
    assert events[1][1] == str(lib) and events[2][1] == (dst.st_dev, dst.st_ino)
    assert names(lib) == ["a", "b"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can write a file another user owns")
def test_root_rewriting_a_library_keeps_its_owner_so_the_daemon_can_still_read_it(tmp_path: Path) -> None:
    lib = tmp_path / "baselines.toml"
    B.save(str(lib), library(("a", 1)))
    os.chown(lib, 65534, 65534)  # the daemon's user (systemd DynamicUser, say)
    os.chmod(lib, 0o600)
    B.save(str(lib), library(("a", 1), ("b", 2)))
    st = os.stat(lib)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o600)


# --- a corrupted file --------------------------------------------------------------------------------

GOOD = B.render(library(("a", 1), ("b", 2)))

# name -> (how to break the file at PATH, what the one-line error must say)
CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (lambda p: p.write_text(GOOD[: GOOD.index('gpu_model = "') + 20]), "not valid TOML"),
    "binary": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x80"), "not UTF-8 text"),
    "wrong shape": (
        lambda p: p.write_text('version = 1\nbaseline = "llama"\n'),
        "must be an array of tables",
    ),
    "wrong entry": (lambda p: p.write_text("[[baseline]]\nname = 'a'\nworkload = 3\n"), "workload must be"),
    "duplicates": (lambda p: p.write_text(GOOD + GOOD[GOOD.index("[[baseline]]") :]), "named 'a'"),
    "nested": (lambda p: p.write_text("a = " + "[" * 100_000), "not valid TOML"),
    "directory": (lambda p: p.mkdir(), "is a directory"),
    "fifo": (lambda p: os.mkfifo(p), "is not a regular file"),
    # valid TOML (one comment) that only the size cap refuses: read whole, it cost ~4x its size in RSS
    "too large": (lambda p: p.write_bytes(b"#" + b"x" * B.MAX_BYTES), "is larger than 16 MiB"),
}


def corrupt(path: Path, case: str) -> None:
    if path.is_dir():
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
    CORRUPTIONS[case][0](path)


def snapshot(path: Path) -> object:
    return path.read_bytes() if path.is_file() else stat.S_IFMT(os.lstat(path).st_mode)


def cli(capsys: pytest.CaptureFixture[str], lib: Path, *args: str) -> tuple[int, str, str]:
    """``gpumon baseline ARGS`` in this process (the matrix below is too large to start a process each)."""
    capsys.readouterr()
    with _no_longer_than(30, f"gpumon baseline {' '.join(args)}"):  # a pipe in the file's place
        rc = main(["baseline", "--baselines", str(lib), *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_every_command_refuses_a_corrupted_library_in_one_line_and_never_overwrites_it(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lib = tmp_path / "baselines.toml"
    corrupt(lib, case)
    before = snapshot(lib)
    src = tmp_path / "fleet.toml"
    B.save(str(src), library(("c", 3)))
    expected = CORRUPTIONS[case][1]
    for args in [
        ("list",),
        ("list", "--json"),
        ("show", "a"),
        ("delete", "a"),
        ("import", str(src)),
        ("import", str(src), "--replace"),
        ("export",),
        ("export", "-o", str(tmp_path / "out.toml")),
    ]:
        what = f"gpumon baseline {' '.join(args)} on a {case} library"
        rc, out, err = cli(capsys, lib, *args)
        lines = err.strip().splitlines()
        assert rc == 2 and out == "", f"{what}: {rc} {err}"
        assert len(lines) == 1 and "internal error" not in err, f"{what}: {err}"
        assert str(lib) in lines[0] and expected in lines[0], f"{what}: {lines[0]}"
        if args[0] in ("delete", "import"):
            assert "nothing was written" in lines[0], f"{what}: {lines[0]}"
    assert snapshot(lib) == before  # the file as it was: nothing committed is lost
    assert not (tmp_path / "out.toml").exists() and temp_files(tmp_path) == []


def test_a_real_gpumon_baseline_process_refuses_a_corrupted_library_without_a_traceback(
    tmp_path: Path,
) -> None:
    src = tmp_path / "fleet.toml"
    B.save(str(src), library(("c", 3)))
    libs = []
    for case in ("binary", "nested", "directory"):
        lib = tmp_path / case / "baselines.toml"
        lib.parent.mkdir()
        corrupt(lib, case)
        libs.append((case, lib, snapshot(lib)))
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda c: gpumon(c[1], "import", str(src)), libs))
    for (case, lib, before), out in zip(libs, results, strict=True):
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
        assert lines[0].startswith(f"gpumon baseline: error: {lib}: {CORRUPTIONS[case][1]}"), lines[0]
        assert snapshot(lib) == before


@pytest.mark.slow
def test_an_unreadable_library_is_refused_in_one_line_by_readers_and_writers(tmp_path: Path) -> None:
    lib, src = tmp_path / "baselines.toml", tmp_path / "fleet.toml"
    B.save(str(lib), library(("a", 1)))
    B.save(str(src), library(("c", 3)))
    os.chmod(lib, 0o000)
    for args in (("list",), ("import", str(src)), ("delete", "a")):
        out = subprocess.run(
            gpumon_cmd("baseline", "--baselines", str(lib), *args),
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            env={**os.environ, "GPUMON_URL": "http://127.0.0.1:9"},
            preexec_fn=_subject_to_file_permissions,
        )
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert str(lib) in lines[0] and "Permission denied" in lines[0], lines[0]
    os.chmod(lib, 0o644)
    assert names(lib) == ["a"]


def _subject_to_file_permissions() -> None:
    """Root reads any file: drop the capabilities that let it (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)
    from the bounding set, so that the command run next has neither and the file's mode applies."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_an_import_from_a_broken_file_names_that_file_and_leaves_the_library_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lib = tmp_path / "baselines.toml"
    B.save(str(lib), library(("a", 1)))
    before = lib.read_bytes()
    for case in CORRUPTIONS:
        src = tmp_path / f"{case}.toml"
        CORRUPTIONS[case][0](src)
        rc, _, err = cli(capsys, lib, "import", str(src))
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1, err
        assert str(src) in lines[0] and CORRUPTIONS[case][1] in lines[0], lines[0]
    assert lib.read_bytes() == before


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_the_library_watch_keeps_the_last_good_library_through_a_corruption_and_takes_the_fixed_one(
    tmp_path: Path, case: str
) -> None:
    path = tmp_path / "baselines.toml"
    B.save(str(path), library(("a", 1), ("b", 2)))
    t = [0.0]
    w = LibraryWatch(str(path), clock=lambda: t[0])
    assert w.ok and len(w.library().baselines) == 2
    corrupt(path, case)
    for _ in range(2):  # a scrape never blocks on it (a pipe) nor fails with it (nested too deeply)
        t[0] += 10
        with _no_longer_than(10, f"reading a {case} library"):
            assert [b.name for b in w.library().baselines] == ["a", "b"]
    assert not w.ok and str(path) in (w.error or "") and CORRUPTIONS[case][1] in (w.error or ""), w.error
    if path.is_dir():
        path.rmdir()
    else:
        path.unlink()
    B.save(str(path), library(("c", 3)))
    t[0] += 10
    assert [b.name for b in w.library().baselines] == ["c"] and w.ok and w.error is None


def test_text_that_cannot_be_written_as_utf8_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A --note with bytes the terminal could not decode arrives as a lone surrogate, as does a job's
    workload sent as JSON "\\udcff": refused by name, not an internal error halfway through a write."""
    lib = tmp_path / "baselines.toml"
    B.save(str(lib), library(("a", 1)))
    before = lib.read_bytes()
    bad = B.Baseline("b", B.Key("llama\udcff", H100, 2, "", ""), B.Figures(5.0), note="caf\udce9")
    with pytest.raises(B.LibraryError, match="workload is not valid Unicode text"):
        B.validate(bad)
    with pytest.raises(B.LibraryError, match="is not valid Unicode text"), B.editing(str(lib)) as box:
        box[0], _ = box[0].put(bad)
    assert lib.read_bytes() == before and temp_files(tmp_path) == []


@pytest.mark.slow
def test_record_into_a_corrupted_library_measures_then_refuses_and_keeps_the_file(
    sims, samplers, tmp_path: Path
) -> None:
    lib = tmp_path / "baselines.toml"
    corrupt(lib, "truncated")
    before = lib.read_bytes()
    node = Node(samplers(sims("1xH100-SXM"), interval=0.1), str(lib))
    node.rank.start()
    try:
        poll(
            lambda: httpx.get(node.url + "/v1/history/llm").status_code == 200,
            15,
            "the daemon's history of job llm",
            every=0.1,
        )
        time.sleep(2.5)  # a dozen history samples: enough steady intervals to get as far as the write
        out = run_gpumon(
            "baseline",
            "--baselines",
            str(lib),
            "record",
            "--job",
            "llm",
            "--window",
            "10s",
            "--warmup",
            "0.5s",
            env={"GPUMON_URL": node.url},
        )
    finally:
        node.stop.set()
        node.rank.join(10)
        node.server.should_exit = True
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert f"{lib}: not valid TOML" in lines[0] and "nothing was written" in lines[0], lines[0]
    assert "llama3-8b/H100-80GB-HBM3/x1/bf16/palm" in out.stdout  # it measured, then refused to write
    assert lib.read_bytes() == before


# --- the daemon --------------------------------------------------------------------------------------


def _library_state(url: str) -> tuple[bool, str | None, list[str], float, float]:
    doc = httpx.get(url + "/v1/baselines", timeout=10).json()
    metrics = {
        s.name: s.value
        for f in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text)
        for s in f.samples
    }
    return (
        doc["ok"],
        doc["error"],
        [b["name"] for b in doc["baselines"]],
        metrics["gpumon_training_baseline_library_ok"],
        metrics["gpumon_training_baseline_library_entries"],
    )


@pytest.mark.slow
def test_the_daemon_survives_a_corrupted_library_keeps_the_last_good_one_says_so_and_recovers(
    tmp_path: Path,
) -> None:
    lib = tmp_path / "baselines.toml"
    corrupt(lib, "nested")  # broken from the start: the daemon starts anyway
    d = start_daemon("--simulate", "1xH100-SXM", "--baselines", str(lib))
    try:
        ok, error, got, ok_metric, entries = _library_state(d.url)
        assert (ok, got, ok_metric, entries) == (False, [], 0, 0) and "not valid TOML" in (error or "")
        B.save(str(lib), library(("a", 1), ("b", 2)))
        poll(
            lambda: _library_state(d.url)[:3] == (True, None, ["a", "b"]),
            20,
            "the daemon to load the fixed library",
            every=0.2,
        )
        for case in ("wrong shape", "fifo", "directory"):
            corrupt(lib, case)
            poll(
                lambda: CORRUPTIONS[case][1] in (_library_state(d.url)[1] or ""),  # noqa: B023
                20,
                f"the daemon to report the {case} file",
                every=0.2,
            )
            ok, error, got, ok_metric, entries = _library_state(d.url)
            assert (ok, got, ok_metric, entries) == (False, ["a", "b"], 0, 2), case
            assert d.proc.poll() is None and d.get("/readyz").status_code == 200
        lib.rmdir()
        B.save(str(lib), library(("c", 3)))
        poll(
            lambda: _library_state(d.url)[:3] == (True, None, ["c"]),
            20,
            "the daemon to load the library written again",
            every=0.2,
        )
        assert _library_state(d.url)[3:] == (1, 1)
    finally:
        assert d.stop() == 0
    said = [line for line in d.log if "baseline library not loaded" in line]
    assert len(said) == 4 and all(str(lib) in line for line in said), said  # once per distinct problem
    assert "keeping the 2 baseline(s) read before" in said[-1]


def test_an_empty_file_is_an_empty_library_as_toml_says(tmp_path: Path) -> None:
    # an empty document is valid TOML; `: > baselines.toml` and an empty ConfigMap key mean "no baselines"
    lib = tmp_path / "baselines.toml"
    lib.write_bytes(b"")
    assert B.load(str(lib)).baselines == ()
    with B.editing(str(lib)) as edit:
        edit[0] = library(("a", 1))
    assert [b.name for b in B.load(str(lib)).baselines] == ["a"]
