"""The SDK's Reporter against a real recording HTTP server on loopback: format, totals, outages, hot path."""

from __future__ import annotations

import gc
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from support.helpers import free_port
from support.poll import poll
from test_transport import RecordingServer

from gpumon.client import NULL_PHASE, Reporter
from gpumon.client import phases as phases_module
from gpumon.client import reporter as reporter_module
from gpumon.client.process import start as start_module
from gpumon.client.protocol import BUCKETS, MAX_BODY_BYTES, MAX_PHASES, NAME_PATTERN, PHASE_PATTERN, TOTALS

REPORT_KEYS = [
    "v", "job", "rank", "world_size", "local_rank", "kind", "workload", "incarnation", "pid", "seq", "time",
    "started", "devices", "dtype", "flops_per_token", "flops_convention", "peak_flops", "totals", "updated",
    "anchor", "step_seconds", "request_seconds", "phases", "final",
]  # fmt: skip
Server = Callable[..., RecordingServer]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sdk_logs(caplog: pytest.LogCaptureFixture, about: str = "", level: int = logging.WARNING) -> list[str]:
    """The SDK's log lines at ``level`` that mention ``about``: a Reporter of an earlier test may still log
    about its own (stopped) server from its thread while this test runs."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "gpumon.client" and r.levelno == level and about in r.getMessage()
    ]


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class StandInModel:
    def flops_per_token(self, train: bool = True, convention: str = "palm") -> float:
        return 6e9 if train else 2e9


class GpuTensor:
    """Reading it would synchronise a GPU: the SDK must never try."""

    def _sync(self, *args: object) -> Any:
        raise AssertionError("the SDK read a tensor")

    __bool__ = __float__ = __int__ = __index__ = __lt__ = __le__ = __gt__ = __ge__ = _sync


def test_report_matches_the_protocol(
    server: Server, reporters: Callable[..., Reporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = server()
    monkeypatch.setattr(start_module, "_claimed", False)  # as in a process whose first Reporter this is
    r = reporters(
        url=srv.url, rank=3, world_size=8, local_rank=1, device=["GPU-abc", 2], workload="llama-7b",
        dtype="bfloat16", model=StandInModel(), peak_flops=989.5e12,
    )  # fmt: skip
    for _ in range(3):
        with r.data_wait():
            pass
        r.step(tokens=4096, samples=8)
    r.add_phase("communication", 0.25)
    assert r.flush()
    body = srv.bodies[-1]
    # Linux: the OS says when the process started; the host name joins NCCL's Inspector dumps
    assert list(body) == [*REPORT_KEYS, "process_started", "hostname"]
    assert body["hostname"] == socket.gethostname()
    assert body["process_started"] <= body["started"]
    assert body["v"] == 1 and body["final"] is False
    assert (body["job"], body["rank"], body["world_size"], body["local_rank"]) == ("test-job", 3, 8, 1)
    assert (body["kind"], body["workload"], body["dtype"]) == ("train", "llama-7b", "bf16")
    assert (body["flops_per_token"], body["flops_convention"], body["peak_flops"]) == (6e9, "palm", 989.5e12)
    assert body["devices"] == ["GPU-abc", "2"]
    assert re.fullmatch(r"[0-9a-f]{16}", body["incarnation"]) and body["pid"] == os.getpid()
    assert isinstance(body["seq"], int) and body["seq"] >= 1  # seq 0 went out at construction
    assert body["started"] <= body["anchor"]["time"] <= body["updated"] <= body["time"] <= time.time()
    assert body["totals"] == {"steps": 3, "tokens": 3 * 4096, "samples": 24, "requests": 0}
    assert list(body["totals"]) == list(TOTALS)
    assert body["anchor"] == {**body["anchor"], "steps": 1, "tokens": 4096, "samples": 8, "requests": 0}
    assert len(body["step_seconds"]["counts"]) == len(BUCKETS) + 1
    assert sum(body["step_seconds"]["counts"]) == 2  # the first step only starts the clock
    assert isinstance(body["step_seconds"]["sum"], float)
    assert body["request_seconds"] is None
    assert set(body["phases"]) == {"data_wait", "communication"}
    assert body["phases"]["communication"] == 0.25
    assert all(re.match(PHASE_PATTERN, p) for p in body["phases"]) and re.match(NAME_PATTERN, body["job"])
    assert int(srv.requests[-1]["headers"]["Content-Length"]) < MAX_BODY_BYTES


def test_first_report_goes_out_before_any_step(server: Server, reporters: Callable[..., Reporter]) -> None:
    srv = server()
    r = reporters(url=srv.url)
    first = srv.wait_for(lambda b: True)
    assert first["seq"] == 0 and first["totals"] == dict.fromkeys(TOTALS, 0)
    assert first["updated"] is None and first["anchor"] is None
    poll(lambda: len(srv.bodies) > 1, 5, "a second report of unchanged data", every=0.01)
    seqs = [b["seq"] for b in srv.bodies]
    assert len(seqs) > 1 and seqs == list(range(len(seqs))), "unchanged data is still sent: the heartbeat"
    r.step()
    srv.wait_for(lambda b: b["totals"]["steps"] == 1)


def test_histograms_and_time_conversion(
    monkeypatch: pytest.MonkeyPatch, reporters: Callable[..., Reporter]
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(reporter_module, "_perf", clock)
    r = reporters(url=f"http://127.0.0.1:{free_port()}", kind="inference")
    for dt in (0.0, 0.5, 1.0, 0.002, 199.5):  # 0.5 and 1.0 are exact: bucket bounds are inclusive ("le")
        clock.t += dt
        r.step(tokens=1)
    r.request(tokens=10, latency=0.001)
    r.request(tokens=5)
    report = r._report(False)
    counts = report["step_seconds"]["counts"]
    assert counts[BUCKETS.index(0.5)] == counts[BUCKETS.index(1.0)] == counts[BUCKETS.index(0.0025)] == 1
    assert counts[-1] == 1 and sum(counts) == 4
    assert report["step_seconds"]["sum"] == pytest.approx(201.002)
    assert report["request_seconds"]["counts"][0] == 1 and report["request_seconds"]["sum"] == 0.001
    assert report["totals"] == {"steps": 5, "tokens": 20, "samples": 0, "requests": 2}
    assert report["anchor"]["time"] == pytest.approx(r.started)
    assert report["updated"] - report["anchor"]["time"] == pytest.approx(201.002)


def test_totals_exact_after_the_daemon_was_down_all_along(
    server: Server, reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    with caplog.at_level(logging.INFO, logger="gpumon.client"):
        r = reporters(url=f"http://127.0.0.1:{port}")
        for i in range(1000):
            r.step(tokens=i, samples=1)
            r.request(tokens=2)
        r.add_phase("data_wait", 1.5)
        time.sleep(0.5)  # several failed attempts, with backoff
        srv = server(port=port)
        body = srv.wait_for(lambda b: b["totals"]["steps"] == 1000)
        # the server recorded the report before the SDK read the answer: the info line may lag a little
        poll(
            lambda: sdk_logs(caplog, srv.url + " accepts reports again", logging.INFO),
            5,
            "the SDK to log that the daemon accepts reports again",
            every=0.01,
        )
    tokens = sum(range(1000)) + 2 * 1000  # steps' and requests'
    assert body["totals"] == {"steps": 1000, "tokens": tokens, "samples": 1000, "requests": 1000}
    assert body["phases"] == {"data_wait": 1.5}
    warnings = sdk_logs(caplog, srv.url)
    assert len(warnings) == 1 and "not taking reports" in warnings[0]


def test_daemon_restarted_mid_run_on_the_same_port(
    server: Server, reporters: Callable[..., Reporter]
) -> None:
    srv = server()
    r = reporters(url=srv.url)
    for _ in range(10):
        r.step(tokens=5)
    before = srv.wait_for(lambda b: b["totals"]["steps"] == 10)
    srv.stop()
    for _ in range(20):
        r.step(tokens=5)
    time.sleep(0.2)
    srv2 = server(port=srv.port)
    after = srv2.wait_for(lambda b: b["totals"]["steps"] == 30)
    assert after["totals"]["tokens"] == 150 and after["incarnation"] == before["incarnation"]
    assert after["seq"] > before["seq"]


def test_a_slow_daemon_never_slows_the_loop(server: Server, reporters: Callable[..., Reporter]) -> None:
    srv = server()
    srv.sleep = 3.0
    r = reporters(url=srv.url, interval=0.01)
    srv.wait_for(lambda b: True)  # the thread is now stuck in a 3 s answer
    start = time.perf_counter()
    for _ in range(10_000):
        r.step(tokens=128, samples=1)
        with r.forward_backward():
            pass
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"10k steps took {elapsed:.2f} s"
    assert r.totals["steps"] == 10_000
    start = time.monotonic()
    r.close(timeout=0.5)
    assert time.monotonic() - start < 1.5, "close() must respect its timeout"


def test_5xx_then_recovery(
    server: Server, reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    srv = server()
    srv.status, srv.detail = 503, "starting"
    with caplog.at_level(logging.INFO, logger="gpumon.client"):
        r = reporters(url=srv.url)
        for _ in range(7):
            r.step(tokens=1)
        assert not r.flush()
        srv.wait_for(lambda b: b["totals"]["steps"] == 7)
        seqs = {b["seq"] for b in srv.bodies if b["totals"]["steps"] == 7}
        assert len(seqs) == 1, "retries of unchanged data keep their seq"
        srv.status = 204
        assert r.flush()
    assert srv.accepted()[-1]["totals"]["steps"] == 7
    assert len(sdk_logs(caplog, srv.url)) == 1
    assert sdk_logs(caplog, srv.url + " accepts reports again", logging.INFO)


def test_4xx_is_logged_once_with_detail_and_does_not_spin(
    server: Server, reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    srv = server()
    srv.status, srv.detail = 429, "node limit of 64 jobs reached"
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        r = reporters(url=srv.url, interval=0.05)
        for _ in range(40):
            r.step(tokens=1)
            time.sleep(0.0125)
    assert len(srv.requests) <= 0.5 / 0.05 + 3
    assert len(sdk_logs(caplog, srv.url)) == 1
    assert "node limit of 64 jobs reached" in caplog.text and "429" in caplog.text


def test_401_is_logged_once(
    server: Server, reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    srv = server()
    srv.status, srv.detail = 401, "bad or missing ingest token"
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        r = reporters(url=srv.url, token="wrong")
        for _ in range(3):
            r.step()
            r.flush()
    assert len(sdk_logs(caplog, srv.url)) == 1 and "ingest token" in caplog.text


def test_bad_arguments_warn_once_per_kind_and_never_raise(
    reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    r = reporters(url=f"http://127.0.0.1:{free_port()}")
    tensor = GpuTensor()
    calls: list[Callable[[], object]] = [
        lambda: r.step(tokens=-1),
        lambda: r.step(tokens=-5),  # same kind: silent
        lambda: r.step(tokens=math.nan),
        lambda: r.step(tokens=math.inf),  # also "not finite": silent
        lambda: r.step(samples="8"),  # type: ignore[arg-type]
        lambda: r.step(tokens=tensor),  # type: ignore[arg-type]
        lambda: r.step(tokens=None),  # type: ignore[arg-type]  # "not a number" again: silent
        lambda: r.step(tokens=True),
        lambda: r.request(tokens=-2),
        lambda: r.request(latency=math.nan),
        lambda: r.request(latency="1s"),  # type: ignore[arg-type]
        lambda: r.add_phase("data_wait", -0.1),
        lambda: r.add_phase("Bad Name", 1.0),
        lambda: r.phase("Bad Name"),
        lambda: r.phase(["unhashable"]),  # type: ignore[arg-type]
        lambda: r.add_phase(["unhashable"], 1.0),  # type: ignore[arg-type]
        *[lambda i=i: r.phase(f"custom_{i}") for i in range(MAX_PHASES + 3)],
    ]
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        for call in calls:
            call()
        with r.phase("Bad Name"):
            pass
    messages = sdk_logs(caplog, "ignored")  # not the dead daemon's warning
    kinds = [
        "step(tokens=-1) ignored: negative", "step(tokens=nan) ignored: not finite",
        "step(samples='8') ignored: not a number", "step(tokens=<", "request(tokens=-2) ignored: negative",
        "request(latency=nan) ignored: not finite", "request(latency='1s') ignored: not a number",
        "add_phase('data_wait', -0.1) ignored: negative", "phase 'Bad Name' ignored", "phases",
    ]  # fmt: skip
    assert len(messages) == len(kinds), messages
    for kind, message in zip(kinds, messages, strict=True):
        assert kind in message, (kind, message)
    # "step(tokens=True)" is "not a number" like samples='8', already logged for step; and nothing counted
    assert r.totals == {
        "steps": 0, "tokens": 0, "samples": 0, "requests": 0,
        "phases": {f"custom_{i}": 0.0 for i in range(MAX_PHASES)},
    }  # fmt: skip
    assert r.phase("Bad Name") is NULL_PHASE and r.phase(f"custom_{MAX_PHASES}") is NULL_PHASE


def test_good_numbers_of_other_types_are_counted(reporters: Callable[..., Reporter]) -> None:
    r = reporters(url=f"http://127.0.0.1:{free_port()}")
    r.step(tokens=2.0, samples=1)
    r.step(tokens=0.5)
    r.add_phase("optimizer", 1)
    r.request(tokens=3, latency=1)
    assert r.totals == {"steps": 2, "tokens": 5.5, "samples": 1, "requests": 1, "phases": {"optimizer": 1.0}}


def test_phases_are_cached_and_nesting_counts_once(
    monkeypatch: pytest.MonkeyPatch, reporters: Callable[..., Reporter]
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(phases_module, "_perf", clock)  # the phase timers read their own module's clock
    r = reporters(url=f"http://127.0.0.1:{free_port()}")
    assert r.phase("data_wait") is r.data_wait() is r.phase("data_wait")
    assert r.checkpoint() is r.phase("checkpoint") and r.optimizer() is r.phase("optimizer")
    assert r.communication() is r.phase("communication")
    assert r.forward_backward() is r.phase("forward_backward")
    with r.data_wait():
        clock.t += 1.0
        with r.data_wait():
            clock.t += 2.0
        clock.t += 4.0
    with pytest.raises(KeyError), r.optimizer():  # exceptions pass through, the time still counts
        clock.t += 0.5
        raise KeyError
    assert r.totals["phases"]["data_wait"] == 7.0 and r.totals["phases"]["optimizer"] == 0.5


@pytest.mark.parametrize("off", [{"env": "0"}, {"env": "false"}, {"enabled": False}])
def test_disabled_reporter_does_nothing(
    server: Server, monkeypatch: pytest.MonkeyPatch, off: dict[str, Any], reporters: Callable[..., Reporter]
) -> None:
    srv = server()
    if "env" in off:
        monkeypatch.setenv("GPUMON_REPORT", off["env"])
        r = reporters(url=srv.url)
    else:
        r = reporters(url=srv.url, enabled=False)
    assert not r.enabled and r._shipper is None
    r.step(tokens=10)
    r.request(tokens=1, latency=0.1)
    r.add_phase("data_wait", 1.0)
    assert r.phase("data_wait") is NULL_PHASE and r.data_wait() is NULL_PHASE
    with r.data_wait():
        pass
    assert not r.flush()
    r.close()
    assert r.totals == {"steps": 0, "tokens": 0, "samples": 0, "requests": 0, "phases": {}}
    time.sleep(0.1)
    assert srv.bodies == []


def test_explicit_enabled_beats_the_env(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = server()
    monkeypatch.setenv("GPUMON_REPORT", "0")
    with Reporter(url=srv.url, job="x", enabled=True) as r:
        assert r.enabled and r.flush()


def test_close_sends_final_once_and_is_idempotent(server: Server) -> None:
    srv = server()
    with Reporter(url=srv.url, job="closing", interval=0.05) as r:
        r.step(tokens=1)
        r.step(tokens=2)
        thread = r._shipper.thread if r._shipper else None
    assert thread is not None and not thread.is_alive()
    finals = [b for b in srv.bodies if b["final"]]
    assert len(finals) == 1 and finals[0]["totals"]["tokens"] == 3
    assert finals[0]["seq"] == max(b["seq"] for b in srv.bodies)
    r.close()
    r.step(tokens=100)
    assert not r.flush() and not r.enabled
    time.sleep(0.1)
    assert len([b for b in srv.bodies if b["final"]]) == 1 and r.totals["tokens"] == 3


def test_close_without_a_daemon_is_bounded(reporters: Callable[..., Reporter]) -> None:
    r = reporters(url="http://10.255.255.1:9478", interval=5)  # unroutable: connects hang until timeout
    start = time.monotonic()
    r.close(timeout=0.3)
    assert time.monotonic() - start < 1.0


def test_fork_child_is_disabled_and_parent_keeps_reporting(
    server: Server, reporters: Callable[..., Reporter]
) -> None:
    srv = server()
    r = reporters(url=srv.url)
    r.step(tokens=1)
    phase = r.data_wait()
    pid = os.fork()
    if pid == 0:  # the child: exit status tells the parent what it saw; never return into pytest
        code = 1
        try:
            said: list[str] = []
            handler = logging.Handler()
            handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
            logging.getLogger("gpumon.client").addHandler(handler)
            r.step(tokens=1000)
            r.step(tokens=1000)
            with phase:
                pass
            seen = [
                len([m for m in said if "step() in a forked child" in m]) == 1,  # said once, not silently
                not r.enabled,
                r.phase("optimizer") is NULL_PHASE,
                not r.flush(),
                not any(t.name == "gpumon-reporter" for t in threading.enumerate()),
                r.totals["steps"] == 1,
            ]
            r.close()
            code = sum(1 << i for i, ok in enumerate(seen) if not ok)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    r.step(tokens=2)
    assert r.enabled and r.flush()
    assert srv.accepted()[-1]["totals"] == {"steps": 2, "tokens": 3, "samples": 0, "requests": 0}
    assert {b["pid"] for b in srv.bodies} == {os.getpid()}


def test_an_unreferenced_reporter_is_collected_and_its_thread_ends(server: Server) -> None:
    srv = server()
    r = Reporter(url=srv.url, job="gc", interval=0.05)
    thread, ref = r._shipper.thread if r._shipper else None, weakref.ref(r)
    srv.wait_for(lambda b: True)
    del r

    def collected() -> bool:
        gc.collect()
        return ref() is None

    # the thread holds it for a moment while sending
    poll(collected, 2, "the unreferenced reporter to be garbage-collected", every=0.01)
    assert thread is not None
    thread.join(2)
    assert not thread.is_alive()


SCRIPT = """
import sys, time
from gpumon.client import Reporter
r = Reporter(url=sys.argv[1], job="exiting", interval=5)
for _ in range(3):
    r.step(tokens=10)
print("done", flush=True)
"""


def test_interpreter_exit_sends_the_final_report(server: Server) -> None:
    srv = server()
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, srv.url], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    final = srv.wait_for(lambda b: b["final"], timeout=2)
    assert final["totals"]["tokens"] == 30


SIGTERMED = """
import os, signal, sys, time
from gpumon.client import Reporter
r = Reporter(url=sys.argv[1], job="preempted", interval=5)
for _ in range(3):
    r.step(tokens=10)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
"""


def test_sigterm_sends_the_final_report_and_still_ends_the_process(server: Server) -> None:
    """scancel, preemption, torchrun stopping workers: a stopped rank is finished, not lost."""
    srv = server()
    out = subprocess.run(
        [sys.executable, "-c", SIGTERMED, srv.url], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert out.returncode == -signal.SIGTERM, out.stderr  # it still dies of the signal
    final = srv.wait_for(lambda b: b["final"], timeout=2)
    assert final["totals"]["tokens"] == 30


def test_a_programs_own_sigterm_handler_is_left_alone() -> None:
    code = """
import signal
seen = []
signal.signal(signal.SIGTERM, lambda *a: seen.append(a))
mine = signal.getsignal(signal.SIGTERM)
from gpumon.client import Reporter
Reporter(url="http://127.0.0.1:9", job="j", interval=60)
assert signal.getsignal(signal.SIGTERM) is mine
print("kept")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 0 and "kept" in out.stdout, out.stderr


@pytest.mark.slow
def test_interpreter_exit_does_not_hang_on_a_slow_daemon(server: Server) -> None:
    srv = server()
    srv.sleep = 10.0
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, srv.url], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - start < reporter_module.AT_EXIT_TIMEOUT + 4.0


def test_hot_path_does_not_grow_memory(reporters: Callable[..., Reporter]) -> None:
    r = reporters(url=f"http://127.0.0.1:{free_port()}", interval=60)
    for _ in range(1000):  # warm up: phases created, histograms touched
        r.step(tokens=1, samples=1)
        with r.data_wait():
            pass
        r.add_phase("communication", 0.001)
    time.sleep(0.2)  # the thread's first (failed) report and its log line happen now, not below
    growth = []
    # three rounds: the sender thread's retries (exceptions, a log line) can land inside one round on a
    # busy machine; a leak in the hot path grows every round
    for _ in range(3):
        gc.collect()
        before = sys.getallocatedblocks()
        for _ in range(50_000):
            r.step(tokens=1, samples=1)
            with r.data_wait():
                pass
            r.add_phase("communication", 0.001)
            r.request(tokens=1, latency=0.01)
        growth.append(sys.getallocatedblocks() - before)
    assert min(growth) < 100, growth


def test_reporter_works_without_the_model_module(reporters: Callable[..., Reporter]) -> None:
    """flops come from any object with flops_per_token(); gpumon.client.model is never needed."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["gpumon.client.model"] = None  # importing it would fail
        from gpumon.client import Reporter
        class M:
            def flops_per_token(self, train=True, convention="palm"):
                return 1.0e9
        r = Reporter(model=M(), enabled=True, url="http://127.0.0.1:9", job="m", interval=60)
        assert r.settings.flops_per_token == 1.0e9, r.settings.flops_per_token
        r.close(timeout=0.1)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_numpy_numbers_are_counted(
    reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    np = pytest.importorskip("numpy")
    r = reporters(url=f"http://127.0.0.1:{free_port()}")
    r.step(tokens=np.int64(4096), samples=np.int32(8))
    r.step(tokens=np.float32(2.5))
    r.step(tokens=np.float64("nan"))
    r.request(tokens=np.uint16(3), latency=np.float32(0.25))
    assert r.totals["steps"] == 2 and r.totals["tokens"] == 4096 + 2.5 + 3 and r.totals["samples"] == 8
    assert type(r.totals["tokens"]) is float and sdk_logs(caplog, "not finite")


def test_values_beyond_the_protocol_s_bounds_are_refused_once_and_never_sent(
    reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    """A finite but absurd value (1e19 tokens in one step, a phase of 1e9 s) would make the daemon refuse
    every later report of the rank; the SDK drops that one call instead."""
    r = reporters(url=f"http://127.0.0.1:{free_port()}")
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        r.step(tokens=10**19)
        r.step(tokens=2e13)
        r.add_phase("data_wait", 1e9)
        r.request(tokens=1, latency=1e12)
        r.step(tokens=5, samples=1)
    assert r.totals["tokens"] == 5 and r.totals["steps"] == 1 and r.totals["phases"].get("data_wait", 0) == 0
    too_large = [rec for rec in caplog.records if "too large" in rec.getMessage()]
    assert len(too_large) == 3, [rec.getMessage() for rec in caplog.records]
