"""gpumon baseline, as a user runs it: a real CLI process against a real daemon app over loopback HTTP."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import run_gpumon
from support.poll import poll
from support.reports import report

from gpumon.baselines import library as B
from gpumon.baselines.history import JobHistory
from gpumon.baselines.watch import LibraryWatch
from gpumon.client import protocol as P
from gpumon.jobs.analysis import Analysis
from gpumon.jobs.api import IngestPolicy
from gpumon.jobs.collector import IngestStats
from gpumon.jobs.service import Training
from gpumon.jobs.store import JobStore
from gpumon.web.listen import bind
from gpumon.web.server import create_app

STEP = 0.05  # seconds per simulated step
TOKENS = 4096


class Node:
    """The daemon's app with a fast job history, a sampler over simulated GPUs, and one training rank
    posting a report after every few steps, as the SDK does."""

    def __init__(self, sampler, library: str) -> None:
        store = JobStore(max_jobs=4, max_ranks=8, ttl=600.0, window=2.0)
        analysis = Analysis(store, lambda: sampler.snapshot)
        history = JobHistory(interval=0.2, node="node-a")
        self.training = Training(analysis, IngestStats(), IngestPolicy(), LibraryWatch(library), history)
        sampler.listeners.append(self.training.observe)
        sampler.start()
        sock = bind("127.0.0.1:0")
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        app = create_app(lambda: sampler.snapshot, sampler.alive, backend="sim", training=self.training)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True).start()
        self.stop = threading.Event()
        self.started = time.time()
        self.rank = threading.Thread(target=self._train, daemon=True)

    def _train(self) -> None:
        with httpx.Client(base_url=self.url) as c:
            while not self.stop.wait(0.1):
                steps = int((time.time() - self.started) / STEP)
                r = report(
                    steps,
                    started=self.started,
                    step_seconds=STEP,
                    tokens_per_step=TOKENS,
                    seq=steps,
                    workload="llama3-8b",
                    t=time.time(),
                )
                c.post(P.PATH, content=json.dumps(r).encode(), headers={"Content-Type": "application/json"})

    def metrics(self) -> dict[str, list]:
        text = httpx.get(self.url + "/metrics").text
        return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture
def node(sims, samplers, tmp_path: Path) -> Iterator[Node]:
    n = Node(samplers(sims("1xH100-SXM"), interval=0.1), str(tmp_path / "baselines.toml"))
    n.rank.start()
    yield n
    n.stop.set()
    n.rank.join(10)  # its last post answered before the server goes: no exception left in a thread
    n.server.should_exit = True


def gpumon(node: Node, *args: str):
    lib = str(Path(node.training.library.path))  # type: ignore[union-attr]
    return run_gpumon("baseline", "--baselines", lib, *args, env={"GPUMON_URL": node.url})


@pytest.mark.slow
def test_record_compare_and_manage_a_baseline_end_to_end(node: Node, tmp_path: Path) -> None:
    # once the daemon has a history for the job, too little steady time in it is a one-line error (all of
    # it is warm-up here, so the answer does not depend on how fast this machine starts the CLI)
    poll(
        lambda: httpx.get(node.url + "/v1/history/llm").status_code == 200,
        15,
        "the daemon's history of job llm",
        every=0.1,
    )
    early = gpumon(node, "record", "--job", "llm", "--window", "10s", "--warmup", "60m")
    assert early.returncode == 2 and "steady interval" in early.stderr and "Traceback" not in early.stderr
    time.sleep(2.5)  # a dozen history samples

    done = gpumon(node, "record", "--job", "llm", "--window", "10s", "--warmup", "0.5s", "--note", "first")
    assert done.returncode == 0, done.stderr
    assert "llama3-8b/H100-80GB-HBM3/x1/bf16/palm" in done.stdout and "stored in" in done.stdout
    (b,) = B.load(node.training.library.path).baselines  # type: ignore[union-attr]
    assert b.key == B.Key("llama3-8b", "NVIDIA H100 80GB HBM3", 1, "bf16", "palm")
    assert b.figures.tokens_per_second_per_gpu == pytest.approx(TOKENS / STEP, rel=0.1)
    assert b.figures.step_time_seconds == pytest.approx(STEP, rel=0.1)
    assert b.figures.mfu == pytest.approx(TOKENS / STEP * 6e9 / 989.5e12, rel=0.1)
    assert b.job_name == "llm" and b.note == "first" and b.intervals and b.intervals >= 3
    assert b.node == "node-a"
    assert b.recorded_by and b.recorded_at and "record --job llm" in b.source

    again = gpumon(node, "record", "--job", "llm", "--window", "10s", "--warmup", "0s")
    assert again.returncode == 2 and "pass --replace" in again.stderr

    # the daemon picks the file up by itself and exposes the baseline and the ratio
    def ratio():
        return node.metrics().get("gpumon_training_throughput_baseline_ratio")

    (r,) = poll(ratio, 15, "the daemon to export the baseline ratio", every=0.1)
    assert r.labels == {"job_name": "llm"} and r.value == pytest.approx(1.0, rel=0.15)
    (info,) = node.metrics()["gpumon_training_baseline_info"]
    assert info.labels["baseline"] == b.name and info.labels["gpus"] == "1"

    compare = gpumon(node, "compare", "--job", "llm")
    assert compare.returncode == 0 and f"against baseline {b.name}" in compare.stdout
    assert "tokens/s/GPU" in compare.stdout
    listing = gpumon(node, "list")
    assert listing.returncode == 0 and b.name in listing.stdout
    # without --baselines, the CLI works on the library the local daemon reads, whatever its own default
    env = {"GPUMON_URL": node.url, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path)}
    implicit = run_gpumon("baseline", "list", env=env)
    assert implicit.returncode == 0 and b.name in implicit.stdout
    env.pop("GPUMON_URL")
    implicit = run_gpumon("baseline", "list", "--url", node.url, env=env)
    assert implicit.returncode == 0 and b.name in implicit.stdout
    shown = json.loads(gpumon(node, "show", b.name, "--json").stdout)
    assert shown["job_name"] == "llm" and shown["gpus"] == 1

    exported = tmp_path / "export.toml"
    assert gpumon(node, "export", "-o", str(exported)).returncode == 0
    assert gpumon(node, "delete", b.name).returncode == 0
    assert B.load(node.training.library.path).baselines == ()  # type: ignore[union-attr]
    assert gpumon(node, "import", str(exported)).returncode == 0
    assert [x.name for x in B.load(node.training.library.path).baselines] == [b.name]  # type: ignore[union-attr]


def library_of(*names: str) -> B.Library:
    figures = B.Figures(1000.0, 0.5, 0.4, 2.0)
    key = "NVIDIA H100 80GB HBM3", 1, "bf16", "palm"
    return B.Library(tuple(B.Baseline(n, B.Key(n, *key), figures) for n in names))


@pytest.mark.slow
def test_a_write_never_goes_where_the_daemon_points_without_being_told(node: Node, tmp_path: Path) -> None:
    # whoever listens on the daemon's port answers GET /v1/baselines with a path; a root `gpumon baseline
    # delete` that wrote there would let any local user choose the file root overwrites
    lib = Path(node.training.library.path)  # type: ignore[union-attr]
    B.save(str(lib), library_of("kept"))
    before = lib.read_bytes()
    other = tmp_path / "import.toml"
    B.save(str(other), library_of("incoming"))
    home = tmp_path / "home"
    env = {"GPUMON_URL": node.url, "HOME": str(home), "XDG_DATA_HOME": str(home)}  # another default
    for args in (("delete", "kept"), ("import", str(other))):
        out = run_gpumon("baseline", *args, env=env)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert f"reads {str(lib)!r}" in lines[0] and "nothing was written" in lines[0], lines[0]
        assert "--baselines" in lines[0]
    assert lib.read_bytes() == before and not home.exists()
    # reading shows the daemon's library, and with --baselines the write goes where it was told
    listed = run_gpumon("baseline", "list", env=env)
    assert listed.returncode == 0 and "kept" in listed.stdout
    assert run_gpumon("baseline", "--baselines", str(lib), "delete", "kept", env=env).returncode == 0
    assert B.load(str(lib)).baselines == ()


@pytest.mark.slow
def test_mistakes_get_one_line_errors_and_lose_nothing(node: Node, tmp_path: Path) -> None:
    missing = gpumon(node, "record", "--job", "nope")
    assert missing.returncode == 1 and "no job 'nope' reports to the daemon" in missing.stderr
    assert gpumon(node, "show", "nope").returncode == 2
    assert "no baseline named 'nope'" in gpumon(node, "delete", "nope").stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[[baseline]]\nname = 'x'\n")
    out = gpumon(node, "import", str(bad))
    assert out.returncode == 2 and "bad.toml: baseline #1 ('x'): workload" in out.stderr
    lib = Path(node.training.library.path)  # type: ignore[union-attr]
    lib.write_text("not toml [")
    out = gpumon(node, "list")
    assert out.returncode == 2 and "not valid TOML" in out.stderr and "Traceback" not in out.stderr
    assert lib.read_text() == "not toml ["  # a broken library is reported, never overwritten
    out = gpumon(node, "delete", "x")
    assert out.returncode == 2 and lib.read_text() == "not toml ["
    # and the daemon keeps serving, flagging the file
    ok = poll(
        lambda: node.metrics().get("gpumon_training_baseline_library_ok"),
        15,
        "the baseline library status metric",
        every=0.1,
    )
    assert poll(
        lambda: node.metrics()["gpumon_training_baseline_library_ok"][0].value == 0,
        15,
        "the daemon to flag the broken library",
        every=0.1,
    )
    assert ok


def test_the_comparison_gives_each_figures_own_change_and_what_it_means() -> None:
    """A step 52.8 % longer is "+52.8 % worse", not "-52.8 % worse"; throughput 20 % lower "-20.0 % worse"."""
    from gpumon.cli.baseline_render import comparison

    section = {
        "key": {"workload": "llm", "gpus": 8, "gpu_model": "NVIDIA H100 80GB HBM3", "dtype": "bf16"},
        "baseline": {"name": "b", "tokens_per_second_per_gpu": 1000.0, "step_time_seconds": 1.0},
        "current": {"tokens_per_second_per_gpu": 800.0, "step_time_seconds": 1.528, "mfu": 0.41},
        "ratios": {"tokens_per_second_per_gpu": 0.8, "step_time_seconds": 1.528, "mfu": 1.07},
    }
    lines = {line.split()[0]: line for line in comparison("llm", section).splitlines()[2:]}
    assert lines["tokens/s/GPU"].endswith("-20.0 % worse")
    assert lines["step"].endswith("+52.8 % worse")
    assert lines["MFU"].endswith("+7.0 % better")


def test_deleting_a_name_that_is_not_there_leaves_no_lock_file(tmp_path: Path) -> None:
    lib = tmp_path / "lib" / "baselines.toml"
    out = run_gpumon("baseline", "--baselines", str(lib), "delete", "nosuch")
    assert out.returncode == 2 and "no baseline named 'nosuch'" in out.stderr
    assert not (tmp_path / "lib").exists()
    B.save(str(lib), library_of("kept"))
    assert run_gpumon("baseline", "--baselines", str(lib), "delete", "nosuch").returncode == 2
    assert sorted(p.name for p in lib.parent.iterdir()) == ["baselines.toml"]
