"""The SDK's part of the goodput ledger and the allocator view: resumed step, evaluation phase, running
phases, process start, the estimator's setup, the allocator read on the sender thread only (a fake
torch.cuda whose memory_stats() keys mirror real PyTorch's), and an older daemon refusing the new fields."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.helpers import ROOT, require_module
from support.poll import poll
from test_reporter import Server, sdk_logs

from gpumon.client import Reporter
from gpumon.client import protocol as P
from gpumon.client import transport as transport_module
from gpumon.client.process import start as start_module
from gpumon.client.process.allocator import AllocatorReader, cuda_ordinal
from gpumon.client.process.start import process_start_time

GIB = 1 << 30
# torch.cuda.memory_stats() of a real process (PyTorch 2.x): each stat per pool ("all", "large_pool",
# "small_pool") and per "current", "peak", "allocated", "freed"; the counters and limits besides
REAL_KEYS = {
    f"{stat}.{pool}.{kind}": 0
    for stat in (
        "active", "active_bytes", "allocated_bytes", "allocation", "inactive_split", "inactive_split_bytes",
        "requested_bytes", "reserved_bytes", "segment",
    )
    for pool in ("all", "large_pool", "small_pool")
    for kind in ("current", "peak", "allocated", "freed")
}  # fmt: skip
REAL_KEYS.update(
    {"max_split_size": -1, "num_alloc_retries": 0, "num_device_alloc": 0, "num_device_free": 0, "num_ooms": 0,
     "num_sync_all_streams": 0, "oversize_allocations.allocated": 0, "oversize_segments.current": 0}
)  # fmt: skip


class FakeCuda:
    """torch.cuda as far as the SDK may touch it; records which thread asked what."""

    def __init__(self, initialized: bool = True, devices: int = 8, nested: bool = True) -> None:
        self.initialized = initialized
        if nested:  # PyTorch >= 1.x has it; the SDK reads it rather than the flattened form
            self.memory_stats_as_nested_dict = self._nested
        self.devices = devices
        self.calls: list[tuple[str, object, str]] = []
        self.stats = dict(REAL_KEYS)
        self.fail = False

    def is_initialized(self) -> bool:
        self.calls.append(("is_initialized", None, threading.current_thread().name))
        return self.initialized

    def device_count(self) -> int:
        return self.devices

    def memory_stats(self, device: object = None) -> dict[str, Any]:
        self.calls.append(("memory_stats", device, threading.current_thread().name))
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return dict(self.stats)

    def _nested(self, device: object = None) -> dict[str, Any]:
        flat = self.memory_stats(device)
        out: dict[str, Any] = {}
        for key, value in flat.items():
            node = out
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return out

    def init(self) -> None:  # what the SDK must never call
        raise AssertionError("the SDK initialised CUDA")

    current_device = set_device = init


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    cuda = FakeCuda()
    module = types.ModuleType("torch")
    module.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", module)
    yield cuda


def test_every_memory_field_maps_to_a_real_memory_stats_key() -> None:
    assert set(P.MEMORY_FIELDS.values()) <= set(REAL_KEYS)


@pytest.mark.parametrize("nested", [True, False])
def test_the_reader_reports_every_field_from_the_allocator(fake_torch: FakeCuda, nested: bool) -> None:
    if not nested:
        del fake_torch.memory_stats_as_nested_dict  # an older torch: memory_stats() only
    values = {key: (i + 1) * GIB for i, key in enumerate(P.MEMORY_FIELDS.values())}
    values.update({"num_alloc_retries": 7, "num_ooms": 1})
    fake_torch.stats.update(values)
    out = AllocatorReader(ordinal=3, local_rank=None).read()
    assert out == {"device": 3, **{wire: values[key] for wire, key in P.MEMORY_FIELDS.items()}}
    assert [c[:2] for c in fake_torch.calls] == [("is_initialized", None), ("memory_stats", 3)]


@pytest.mark.parametrize(
    ("ordinal", "local_rank", "devices", "chosen"),
    [(5, 2, 8, 5), (None, 2, 8, 2), (None, 2, 1, 0), (None, None, 8, 0)],
)
def test_the_device_read(fake_torch: FakeCuda, ordinal: int | None, local_rank: int | None, devices: int,
                         chosen: int) -> None:  # fmt: skip
    """The sender thread's current device is always 0, so it is never asked: the Reporter's device, else the
    local rank's when visible (CUDA_VISIBLE_DEVICES of one GPU per rank leaves device 0)."""
    fake_torch.devices = devices
    assert AllocatorReader(ordinal, local_rank).read()["device"] == chosen  # type: ignore[index]


def test_nothing_is_read_before_cuda_is_initialised_or_without_torch(
    fake_torch: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_torch.initialized = False
    assert AllocatorReader(0, 0).read() is None
    assert [c[0] for c in fake_torch.calls] == ["is_initialized"]
    monkeypatch.delitem(sys.modules, "torch")
    assert AllocatorReader(0, 0).read() is None


def test_torch_still_importing_is_not_yet_initialised_rather_than_broken(
    fake_torch: FakeCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch is in sys.modules while the training thread imports it: no torch.cuda yet, then no functions."""
    half = types.ModuleType("torch")
    monkeypatch.setitem(sys.modules, "torch", half)
    reader = AllocatorReader(0, None)
    assert reader.read() is None
    half.cuda = types.SimpleNamespace()  # type: ignore[attr-defined]
    assert reader.read() is None
    half.cuda = fake_torch  # type: ignore[attr-defined]
    assert reader.read() is not None


def test_values_beyond_the_daemons_bounds_are_left_out(fake_torch: FakeCuda) -> None:
    """The daemon refuses a whole report with one: the rank would vanish from it."""
    fake_torch.stats.update({"allocated_bytes.all.current": 1 << 63, "reserved_bytes.all.current": 5})
    out = AllocatorReader(0, None).read()
    assert out is not None and "allocated_bytes" not in out and out["reserved_bytes"] == 5


def test_only_the_first_reporter_of_a_process_sends_its_start(
    server: Server, reporters: Callable[..., Reporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second Reporter (the next trial of a sweep, a second job in a notebook) starts its clock at its own
    creation: the process's earlier work is not its start-up."""
    monkeypatch.setattr(start_module, "_claimed", False)
    srv = server()
    first = reporters(url=srv.url, interval=60)
    second = reporters(url=srv.url, interval=60, job="second")
    assert first.process_started is not None and second.process_started is None
    assert first.flush() and second.flush()
    # each Reporter's thread also sends its own first report, in any order: look at each job's reports
    by_job = {job: [b for b in srv.bodies if b["job"] == job] for job in ("test-job", "second")}
    assert all("process_started" in b for b in by_job["test-job"]) and by_job["test-job"]
    assert not any("process_started" in b for b in by_job["second"]) and by_job["second"]


def test_a_reporter_that_could_not_be_set_up_leaves_the_process_start_to_the_next(
    server: Server, reporters: Callable[..., Reporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(start_module, "_claimed", False)
    broken = reporters(url="ftp://nowhere")
    assert not broken.enabled and broken.process_started is None
    assert reporters(url=server().url, interval=60).process_started is not None


def test_a_failing_read_is_logged_once_and_reading_stops(
    fake_torch: FakeCuda, caplog: pytest.LogCaptureFixture
) -> None:
    fake_torch.fail = True
    reader = AllocatorReader(0, 0)
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        assert reader.read() is None and reader.read() is None
    assert len(sdk_logs(caplog, "memory_stats")) == 1
    assert sum(c[0] == "memory_stats" for c in fake_torch.calls) == 1


@pytest.mark.parametrize(
    ("device", "ordinal"),
    [(2, 2), ("cuda:3", 3), ("cuda", None), (types.SimpleNamespace(type="cuda", index=None), None),
     (types.SimpleNamespace(type="cuda", index=1), 1),
     (types.SimpleNamespace(type="cpu", index=None), None), ("GPU-abc", None), (True, None), ([0, 1], None)],
)  # fmt: skip
def test_cuda_ordinal(device: object, ordinal: int | None) -> None:
    assert cuda_ordinal(device) == ordinal


def test_the_reporter_reads_the_allocator_on_its_own_thread_only(
    fake_torch: FakeCuda, server: Server, reporters: Callable[..., Reporter]
) -> None:
    srv = server()
    fake_torch.stats.update({"allocated_bytes.all.current": 5 * GIB, "num_alloc_retries": 2})
    r = reporters(url=srv.url, device=1)
    r.step(tokens=1)
    body = srv.wait_for(lambda b: "memory" in b)
    assert body["memory"]["device"] == 1 and body["memory"]["allocated_bytes"] == 5 * GIB
    assert body["memory"]["alloc_retries"] == 2
    r.flush()  # from this (the training) thread: sends the latest reading, reads nothing
    r.close()
    threads = {name for kind, _, name in fake_torch.calls if kind == "memory_stats"}
    assert threads == {"gpumon-reporter"}
    assert srv.bodies[-1]["final"] is True and srv.bodies[-1]["memory"]["allocated_bytes"] == 5 * GIB


def test_resumed_step_evaluation_and_running_phases_are_reported(
    server: Server, reporters: Callable[..., Reporter]
) -> None:
    srv = server()
    r = reporters(url=srv.url, resumed_step=1200, interval=60)
    srv.wait_for(lambda b: b["seq"] == 0)  # the thread's first report is in: each flush's is the last
    with r.evaluation():
        time.sleep(0.05)
        assert r.flush()
        running = srv.bodies[-1]
    assert running["resumed_step"] == 1200
    assert running["phases"] == {"evaluation": 0.0} and running["open_phases"]["evaluation"] >= 0.05
    assert r.flush()
    done = srv.bodies[-1]
    assert "open_phases" not in done and done["phases"]["evaluation"] >= 0.05
    r.resume(1300)  # a checkpoint loaded after the Reporter was made
    assert r.flush() and srv.bodies[-1]["resumed_step"] == 1300


def test_bad_resumed_steps_are_warned_about_and_ignored(
    server: Server, reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    srv = server()
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        r = reporters(url=srv.url, resumed_step=-5, interval=60)
        r.resume("12")  # type: ignore[arg-type]
        r.resume(True)  # type: ignore[arg-type]
    assert r.flush() and "resumed_step" not in srv.bodies[-1]
    assert sdk_logs(caplog, "resumed_step=-5") and len(sdk_logs(caplog, "resume(")) == 1


def test_the_estimators_setup_is_sent_from_a_preset(
    server: Server, reporters: Callable[..., Reporter]
) -> None:
    srv = server()
    r = reporters(url=srv.url, model="llama2-7b", micro_batch=4, zero_stage=1,
                  setup={"checkpointing": "full", "flash_attention": True}, interval=60)  # fmt: skip
    assert r.flush()
    setup = srv.bodies[-1]["setup"]
    assert setup["model"]["layers"] == 32 and setup["model"]["name"] == "llama2-7b"
    assert (setup["micro_batch"], setup["zero_stage"], setup["checkpointing"]) == (4, 1, "full")
    assert r.settings.flops_per_token is not None  # the preset also gives FLOPs per token


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"micro_batch": 4}, "need model="),
        ({"model": "llama2-7b", "micro_batch": 0}, "micro_batch=0"),
        ({"model": "llama2-7b", "micro_batch": 2, "zero_stage": 5}, "zero_stage=5"),
        ({"model": "llama2-7b", "micro_batch": 2, "setup": {"optimizer": "lion"}}, "setup['optimizer']"),
        ({"model": "nosuch-model", "micro_batch": 2}, "unknown model preset"),
        ({"model": "llama2-7b", "micro_batch": 2, "setup": {"optimizer": ["adamw"]}}, "setup['optimizer']"),
        ({"model": "llama2-7b", "micro_batch": 2, "setup": {"tp": 1 << 20}}, "setup['tp']"),
        ({"model": "llama2-7b", "micro_batch": 1 << 25}, "micro_batch=33554432"),
    ],
)
def test_a_bad_setup_is_warned_about_never_raised(
    kwargs: dict[str, Any], problem: str, reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        r = reporters(url="http://127.0.0.1:9", interval=60, **kwargs)
    assert r.enabled and sdk_logs(caplog, problem)


def test_an_older_daemon_gets_reports_without_the_new_fields(
    server: Server, reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    """A daemon older than the optional fields refuses them as unknown; the SDK resends without them."""
    srv = server()

    def old_daemon(body: dict[str, Any]) -> tuple[int, str]:
        unknown = sorted(set(body) & set(P.EXTENSIONS))
        # what every released daemon answers (gpumon/jobs/api.py: 422 for an invalid report)
        return (422, f"unknown field {unknown[0]!r} (protocol version 1)") if unknown else (204, "")

    srv.judge = old_daemon
    with caplog.at_level(logging.INFO, logger="gpumon.client"):
        r = reporters(url=srv.url, resumed_step=10, interval=0.02)
        r.step(tokens=5)
        poll(lambda: len(srv.accepted()) >= 3, 5, "three accepted reports", every=0.01)
    assert all(not set(b) & set(P.EXTENSIONS) for b in srv.accepted())
    assert srv.accepted()[-1]["totals"]["tokens"] == 5
    assert len([b for b in srv.bodies if "resumed_step" in b]) == 1  # refused once, then left out
    assert not sdk_logs(caplog, "rejected") and sdk_logs(caplog, "predates", logging.INFO)


def test_the_new_fields_are_tried_again_after_a_while_in_case_the_daemon_was_upgraded(
    server: Server, reporters: Callable[..., Reporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = server()
    upgraded = threading.Event()

    def daemon(body: dict[str, Any]) -> tuple[int, str]:
        if upgraded.is_set() or "resumed_step" not in body:
            return 204, ""
        return 422, "unknown field 'process_started' (protocol version 1)"

    srv.judge = daemon
    monkeypatch.setattr(transport_module, "CORE_RETRY", 0.3)
    r = reporters(url=srv.url, resumed_step=10, interval=0.02)
    poll(lambda: len(srv.accepted()) >= 2, 5, "two accepted reports", every=0.01)
    upgraded.set()
    srv.wait_for(lambda b: "resumed_step" in b and srv.accepted()[-1] is b)
    assert r.flush() and srv.bodies[-1]["resumed_step"] == 10


def test_process_start_time_reads_proc(tmp_path: Path) -> None:
    started = process_start_time()
    assert started is not None and time.time() - 600 < started <= time.time()  # this test process
    stat, uptime = tmp_path / "stat", tmp_path / "uptime"
    hertz = os.sysconf("SC_CLK_TCK")
    stat.write_text("4242 (a (weird) name) S " + " ".join(["0"] * 18) + f" {1000 * hertz} 0 0\n")
    uptime.write_text("1003.50 12.00\n")
    assert process_start_time(str(stat), str(uptime)) == pytest.approx(time.time() - 3.5, abs=0.1)
    uptime.write_text("999.0 1.0\n")  # started after now: a misread
    assert process_start_time(str(stat), str(uptime)) is None
    assert process_start_time(str(tmp_path / "none"), str(uptime)) is None


@pytest.mark.slow  # imports the real torch
def test_with_real_cpu_torch_nothing_is_read_and_cuda_is_never_initialised(server: Server) -> None:
    require_module("torch")
    srv = server()
    code = textwrap.dedent(
        f"""
        import torch
        from gpumon.client import Reporter
        r = Reporter(job="cpu-torch", url={srv.url!r}, interval=0.01, device=0)
        model = torch.nn.Linear(8, 8)
        for _ in range(20):
            model(torch.randn(4, 8)).sum().backward()
            r.step(tokens=32)
        assert r.flush()
        r.close()
        assert not torch.cuda.is_initialized(), "the SDK initialised CUDA"
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert srv.bodies and all("memory" not in b for b in srv.bodies)
    assert srv.bodies[-1]["totals"]["tokens"] == 640
