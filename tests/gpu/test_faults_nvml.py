"""NVML faults, one at a time, against the sampler, the event watcher and the exposition users scrape.

For each fault the same promises are checked: the daemon keeps serving, the other GPUs keep fresh values,
the failure shows in metrics and logs, recovery needs nobody, and no thread or file descriptor is left
behind. docs/reliability.md lists each fault with what gpumon does about it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import ManualClock, require_tool
from support.poll import poll

from gpumon.gpu.events import EventWatcher
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml
from gpumon.gpu.types import BackendUnavailable
from gpumon.metrics.registry import DETAILS
from gpumon.web.exposition import Renderer
from gpumon.web.server import build_registry

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def gpumon_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("gpumon"))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Node:
    """A sampler with its event watcher over a simulated NVML, and the exposition a scrape would get."""

    def __init__(self, sim: SimNvml, *, interval: float = 0.2, clock: ManualClock | None = None) -> None:
        self.sim = sim
        self.clock = clock  # with one, tests sweep by hand and step time themselves
        # every opt-in detail: each call a daemon can make, and each series it can serve, meets the faults
        every = frozenset(DETAILS)
        kw: dict[str, Any] = {} if clock is None else {"clock": clock}
        backend = NvmlBackend(sim, details=every, **kw)
        self.sampler = Sampler(backend, interval=interval, timeout=interval, **kw)
        self.sampler.events = EventWatcher(sim, self.sampler.devices, wait_ms=20)
        self.registry = build_registry(lambda: self.sampler.snapshot, details=every)
        self.renderer = Renderer()

    def sweep(self, n: int = 1) -> None:
        for _ in range(n):
            if self.clock is not None:
                self.clock.advance(1.0)  # GPM wants a gap between samples; backoff counts in seconds
            self.sampler.sweep()

    def scrape(self) -> str:
        return self.renderer.render(self.registry.collect(), openmetrics_format=False).decode()

    def samples(self) -> Samples:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(self.scrape())
            for s in fam.samples
        }

    def value(self, name: str, **labels: str) -> float | None:
        want = tuple(sorted(labels.items()))
        for (n, lab), v in self.samples().items():
            if n == name and all(item in lab for item in want):
                return v
        return None

    def up(self) -> list[bool]:
        snap = self.sampler.snapshot
        return [] if snap is None else [g.up for g in snap.gpus]

    def fresh_after(self, t: float) -> Callable[[], bool]:
        """True once every GPU that is up was read after ``t`` (unix time)."""

        def check() -> bool:
            snap = self.sampler.snapshot
            return snap is not None and all(g.reading.timestamp > t for g in snap.gpus if g.up)

        return check


@pytest.fixture
def nodes() -> Iterator[Callable[..., Node]]:
    made: list[Node] = []

    def make(spec: str = "2xH100-SXM", **kw: Any) -> Node:
        node = Node(SimNvml(spec, static=True), **kw)
        made.append(node)
        return node

    yield make
    for node in made:
        node.sim.faults.clear()
        node.sampler.stop()


# -- the driver ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("driver_not_loaded", "DriverNotLoaded"),  # no kernel module yet: GPU operator, early boot
        ("error:*:nvmlInit=Unknown", "Unknown"),  # init itself failing, then succeeding
        ("error:*:nvmlInit=LibraryNotFound", "LibraryNotFound"),  # libnvidia-ml.so not mounted yet
    ],
)
def test_a_driver_absent_at_start_is_waited_for_and_then_sampled(
    nodes, caplog, fault: str, kind: str
) -> None:
    caplog.set_level(logging.INFO, logger="gpumon")
    fds_before = open_fds()
    node = nodes()
    if fault == "driver_not_loaded":
        node.sim.driver_loaded = False
    else:
        injected = node.sim.faults.add(fault)
    node.sampler.open(wait=True)
    node.sampler.start()

    poll(lambda: node.sampler.snapshot is not None, 15, "a first snapshot")
    assert node.sampler.alive(), "/healthz must stay 200 while the driver is missing"
    assert node.up() == []
    assert node.value("gpumon_collector_success", collector="gpu") == 0
    assert node.value("gpumon_collector_success", collector="host") == 1
    assert node.value("gpumon_errors_total", op="nvmlInit", error=kind) == 1
    assert node.value("gpumon_driver_info") is None, "no driver info without a driver"
    assert node.value("gpumon_gpu_up") is None
    assert any("serving without GPUs and trying again with backoff" in m for m in caplog.messages)
    assert "gpumon-events" not in gpumon_threads(), "events wait for NVML, not fail against it"

    poll(lambda: (node.value("gpumon_errors_total", op="nvmlInit", error=kind) or 0) >= 2, 15, "a retry")
    if fault == "driver_not_loaded":
        node.sim.driver_loaded = True
    else:
        node.sim.faults.remove(injected)

    # the backoff is 1, 2, 4 s: the driver is found within the next few seconds
    poll(lambda: node.up() == [True, True], 15, "the GPUs once the driver is there")
    assert node.value("gpumon_collector_success", collector="gpu") == 1
    assert node.value("gpumon_driver_info", driver_version=node.sim.driver_version) == 1
    assert node.value("gpumon_gpu_power_watts", gpu="1") is not None
    poll(lambda: node.value("gpumon_collector_success", collector="events") == 1, 15, "the event watcher")
    assert any("started after" in m for m in caplog.messages)
    assert gpumon_threads() == ["gpumon-events", "gpumon-gpu-0", "gpumon-gpu-1", "gpumon-sampler"]
    node.sampler.stop()
    assert open_fds() <= fds_before


@pytest.mark.slow
def test_a_driver_that_never_loads_costs_one_attempt_per_backoff_and_no_threads(nodes) -> None:
    node = nodes(interval=0.02)
    node.sim.driver_loaded = False
    node.sampler.open(wait=True)
    node.sampler.start()
    time.sleep(2.5)  # sweeps every 20 ms: 125 sweeps, but attempts only at t = 0, 1, 3 s (backoff)
    attempts = node.value("gpumon_errors_total", op="nvmlInit", error="DriverNotLoaded")
    assert attempts is not None and 1 <= attempts <= 3
    assert set(gpumon_threads()) <= {"gpumon-sampler", "gpumon-open"}


def test_auto_and_one_shot_commands_still_refuse_without_a_driver(nodes) -> None:
    node = nodes()
    node.sim.driver_loaded = False
    with pytest.raises(BackendUnavailable, match="DriverNotLoaded"):
        node.sampler.open()


# -- GPUs ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("lost:1", "GpuIsLost"),  # fell off the bus (XID 79)
        ("error:1:*=GpuIsLost", "GpuIsLost"),
        ("uninitialized:1", "Uninitialized"),  # the driver reloaded under us
        ("hang:1:nvmlDeviceGetTemperature", "exceeded its deadline"),  # a call that never returns
        ("hang:1:nvmlDeviceGetUtilizationRates", "exceeded its deadline"),
    ],
)
def test_a_gpu_lost_or_hung_mid_run_comes_back_and_leaves_nothing_behind(
    nodes, fault: str, reason: str
) -> None:
    node = nodes("3xH100-SXM")
    node.sampler.open()
    node.sampler.start()
    poll(lambda: node.up() == [True] * 3, 15, "three GPUs up")
    kind = "deadline_exceeded" if fault.startswith("hang") else reason
    after: list[tuple[list[str], int]] = []
    for cycle in (1, 2):  # a leak grows with every cycle; the first may open what stays open for good
        threads = gpumon_threads()
        injected = node.sim.faults.add(fault)
        poll(lambda: node.up() == [True, False, True], 15, "GPU 1 down")
        for _ in range(3):  # many sweeps while it is down: the others stay fresh, nothing piles up
            t = time.time()
            poll(node.fresh_after(t), 15, "fresh values from GPUs 0 and 2")
        snap = node.sampler.snapshot
        assert reason in (snap.gpus[1].down_reason or "")
        assert node.value("gpumon_gpu_up", gpu="1") == 0
        assert node.value("gpumon_gpu_up", gpu="0") == node.value("gpumon_gpu_up", gpu="2") == 1
        assert node.value("gpumon_gpu_power_watts", gpu="1") is None, "no stale values for a down GPU"
        errors = [
            v
            for (n, lab), v in node.samples().items()
            if n == "gpumon_errors_total" and ("error", kind) in lab
        ]
        assert sum(errors) >= cycle, "each episode is counted"
        assert gpumon_threads() == threads, "no thread may pile up behind a lost or hung GPU"

        node.sim.faults.remove(injected)  # releases a hung call, as a driver that answers at last would
        poll(lambda: node.up() == [True] * 3, 40, "GPU 1 back")  # backoff: 1, 2, 4... s
        assert node.value("gpumon_gpu_power_watts", gpu="1") is not None
        after.append((gpumon_threads(), open_fds()))
    assert after[1][0] == after[0][0] == threads
    assert after[1][1] <= after[0][1], "file descriptors grew from one lost-and-back episode to the next"


@pytest.mark.slow
def test_every_gpu_lost_at_once_and_back_reinitialises_nvml(nodes) -> None:
    node = nodes("2xH100-SXM")
    node.sampler.open()
    node.sampler.start()
    poll(lambda: node.up() == [True, True], 15, "two GPUs up")
    threads = gpumon_threads()
    injected = node.sim.faults.add("uninitialized:*")
    poll(lambda: node.up() == [False, False], 15, "both GPUs down")
    assert node.sampler.alive() and node.value("gpumon_collector_success", collector="host") == 1
    node.sim.faults.remove(injected)
    poll(lambda: node.up() == [True, True], 20, "both GPUs back")
    assert gpumon_threads() == threads


# -- one quantity at a time --------------------------------------------------------------------------------


def device_calls(spec: str = "1xH100-SXM") -> list[str]:
    """Every NVML function a sweep calls for one GPU, learnt by watching the simulator."""
    sim = SimNvml(spec, static=True)
    seen: list[str] = []
    check = sim.faults.check

    def record(op: str, gpu: int | None) -> None:
        if gpu == 0 and op not in seen:
            seen.append(op)
        check(op, gpu)

    node = Node(sim, interval=10.0, clock=ManualClock())
    node.sampler.open()
    node.sweep(12)  # what is asked once (support, identity) is learnt by now
    sim.faults.check = record  # type: ignore[method-assign]
    node.sweep(12)  # NVLink link state is read every 10th sweep
    node.sampler.stop()
    return seen


DEVICE_CALLS = device_calls()


def test_the_per_call_faults_below_cover_what_a_sweep_calls() -> None:
    assert {"nvmlDeviceGetTemperature", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetFieldValues"} <= set(
        DEVICE_CALLS
    )
    assert len(DEVICE_CALLS) >= 12  # the rest fold into nvmlDeviceGetFieldValues


@pytest.mark.parametrize("kind", ["unsupported", "Unknown"])
@pytest.mark.parametrize("op", DEVICE_CALLS)
def test_one_call_failing_on_one_gpu_costs_that_gpu_only_what_the_call_reads(
    nodes, op: str, kind: str
) -> None:
    node = nodes("2xH100-SXM", interval=10.0, clock=ManualClock())  # a generous deadline: a noisy CI
    node.sampler.open()
    node.sweep(12)  # every call a sweep makes, the every-few-sweeps ones too
    healthy = node.samples()
    known = dict(node.sampler.snapshot.gpus[0].capabilities)
    node.sim.faults.add(f"unsupported:0:{op}" if kind == "unsupported" else f"error:0:{op}={kind}")
    counts = []
    for _ in range(24):
        node.sweep()
        counts.append(node.value("gpumon_errors_total", gpu="0", op=op, error=kind) or 0)
    after = node.samples()

    assert node.up() == [True, True], f"{op} failing must not take GPU 0 down"
    gpu1 = {k for k in healthy if ("gpu", "1") in k[1]}
    assert gpu1 and gpu1 <= set(after), "GPU 1 lost series when a call failed on GPU 0"
    lost = {k[0] for k in healthy if ("gpu", "0") in k[1] and k not in after}
    assert "gpumon_gpu_up" not in lost
    if kind == "Unknown":
        assert counts == sorted(counts) and counts[-1] >= 2, f"{op} failed once and was never asked again"
    else:
        assert counts[-1] == 0, "NOT_SUPPORTED is a capability, not an error"
        # what the call read is now known as not supported (the fan and encoder were before the fault)
        caps = node.sampler.snapshot.gpus[0].capabilities
        newly = {q for q, s in caps.items() if s == "not_supported" and known.get(q) != "not_supported"}
        assert bool(lost) <= bool(newly), f"{op}: lost {lost} but no capability became not_supported"


@pytest.mark.parametrize("ret", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_UNKNOWN])
def test_one_field_value_failing_costs_only_that_field(nodes, ret: int) -> None:
    node = nodes("2xH100-SXM")
    node.sampler.open()
    node.sampler.sweep()
    healthy = node.samples()
    original = node.sim._field
    failing = pynvml.NVML_FI_DEV_MEMORY_TEMP

    def field(gpu: Any, fid: int, scope: int) -> tuple[int, int, float]:
        got = original(gpu, fid, scope)
        return (ret, got[1], 0) if gpu.index == 0 and fid == failing else got

    node.sim._field = field  # type: ignore[method-assign]
    for _ in range(2):
        node.sampler.sweep()
    after = node.samples()
    assert node.up() == [True, True]
    lost = {k for k in healthy if k not in after and k[0] != "gpumon_errors_total"}
    assert {k[0] for k in lost} == {"gpumon_gpu_memory_temperature_celsius"}
    assert all(("gpu", "0") in labels for _, labels in lost)
    counted = [v for (n, lab), v in after.items() if n == "gpumon_errors_total" and ("gpu", "0") in lab]
    assert counted == ([2] if ret == pynvml.NVML_ERROR_UNKNOWN else [])


# -- the event API ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("op", ["nvmlEventSetCreate", "nvmlEventSetWait_v2", "nvmlDeviceRegisterEvents"])
def test_the_event_api_failing_is_visible_and_retried_while_sampling_goes_on(nodes, op: str) -> None:
    node = nodes("2xH100-SXM")
    node.sampler.open()
    at_start = op != "nvmlEventSetWait_v2"  # creating and registering happen when the watcher (re)starts
    if at_start:
        injected = node.sim.faults.add(f"error:*:{op}=Unknown")
    node.sampler.start()
    poll(lambda: node.up() == [True, True], 15, "two GPUs")
    if not at_start:
        poll(lambda: node.value("gpumon_collector_success", collector="events") == 1, 15, "events running")
        injected = node.sim.faults.add(f"error:*:{op}=Unknown")
    threads, fds = gpumon_threads(), open_fds()
    poll(lambda: node.value("gpumon_collector_success", collector="events") == 0, 15, "events failing")
    t = time.time()
    poll(node.fresh_after(t), 15, "GPU values while events fail")
    assert node.up() == [True, True]
    errors = [v for (n, lab), v in node.samples().items() if n == "gpumon_errors_total" and ("op", op) in lab]
    assert errors and errors[0] >= 1

    node.sim.faults.remove(injected)
    poll(lambda: node.value("gpumon_collector_success", collector="events") == 1, 20, "events again")
    node.sim.inject_xid(0, 79)
    poll(
        lambda: node.value("gpumon_gpu_xid_errors_total", gpu="0", xid="79") == 1,
        15,
        "the XID after recovery",
    )
    assert gpumon_threads() == threads
    assert open_fds() <= fds, "a freed event set must not leave its descriptor behind"


# -- everything at once, through the exposition promtool reads ---------------------------------------------


def test_the_exposition_stays_valid_with_every_kind_of_fault_active(nodes, tmp_path) -> None:
    promtool = require_tool("promtool")
    import subprocess

    node = nodes("4xH100-SXM")
    node.sampler.open()
    node.sampler.start()
    poll(lambda: node.up() == [True] * 4, 15, "four GPUs")
    for fault in (
        "lost:0",
        "hang:1:nvmlDeviceGetTemperature",
        "error:2:nvmlDeviceGetPowerUsage=Unknown",
        "unsupported:2:nvmlDeviceGetClockInfo",
        "error:*:nvmlEventSetWait_v2=Unknown",
    ):
        node.sim.faults.add(fault)
    poll(lambda: node.up() == [False, False, True, True], 15, "GPUs 0 and 1 down")
    poll(lambda: node.value("gpumon_collector_success", collector="events") == 0, 15, "events failing")
    text = node.scrape()
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_the_daemon_serves_while_it_waits_for_the_driver_and_finds_the_gpus_when_it_loads(daemon) -> None:
    # the simulated driver refuses nvmlInit for its first 3 s, as a node does before the GPU operator's driver
    # container has loaded the kernel module
    d = daemon("--simulate", "2xH100-SXM", "--sim-fault", "error:*:nvmlInit=DriverNotLoaded@0+3")

    def scrape() -> Samples:
        text = httpx.get(f"{d.url}/metrics").text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }

    assert httpx.get(f"{d.url}/healthz").status_code == 200
    waiting = scrape()
    assert waiting[("gpumon_collector_success", (("collector", "gpu"),))] == 0
    init = (("error", "DriverNotLoaded"), ("gpu", ""), ("op", "nvmlInit"), ("uuid", ""))
    assert waiting[("gpumon_errors_total", init)] >= 1
    assert not [k for k in waiting if k[0] == "gpumon_gpu_up"]
    poll(lambda: len([k for k in scrape() if k[0] == "gpumon_gpu_up"]) == 2, 30, "two GPUs")
    assert scrape()[("gpumon_collector_success", (("collector", "gpu"),))] == 1
    assert any("serving without GPUs" in line for line in d.log)
    assert any("started after" in line for line in d.log)
