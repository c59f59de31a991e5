from __future__ import annotations

import threading

import pynvml
import pytest

from gpumon.gpu.sim import Fault, FaultSpecError


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("lost:3@10+30", dict(kind="lost", gpu=3, op=None, start=10.0, duration=30.0)),
        (
            "hang:2:nvmlDeviceGetPowerUsage@5",
            dict(kind="hang", gpu=2, op="nvmlDeviceGetPowerUsage", start=5.0),
        ),
        (
            "error:1:nvmlDeviceGetTemperature=Timeout",
            dict(kind="error", gpu=1, error=pynvml.NVML_ERROR_TIMEOUT),
        ),
        ("slow:*:*=0.02", dict(kind="slow", gpu=None, op=None, delay=0.02)),
        ("unsupported:0:nvmlDeviceGetFanSpeed", dict(kind="unsupported", gpu=0)),
        ("uninitialized", dict(kind="uninitialized", gpu=None)),
        ("slowdown:3=2.5@60+120", dict(kind="slowdown", gpu=3, factor=2.5, start=60.0, duration=120.0)),
        ("slowdown:*", dict(kind="slowdown", gpu=None, factor=2.0, start=0.0, duration=None)),
        ("slowdown:1@5", dict(kind="slowdown", gpu=1, factor=2.0, start=5.0)),
    ],
)
def test_fault_specs_parse(text: str, expect: dict) -> None:
    fault = Fault.parse(text)
    for key, value in expect.items():
        assert getattr(fault, key) == value


@pytest.mark.parametrize(
    "text",
    [
        "melt:1",
        "lost:x",
        "error:1:nvmlFoo=NoSuchError",
        "lost:1@soon",
        "slow:1:*=fast",
        "lost:1:*=3",
        "slowdown:1=1",
        "slowdown:1=0.5",
        "slowdown:1=fast",
        "slowdown:1:nvmlDeviceGetPowerUsage=2",
        "slowdown:1=200",
    ],
)
def test_bad_fault_specs_are_rejected(text: str) -> None:
    with pytest.raises(FaultSpecError):
        Fault.parse(text)


def test_faults_apply_in_their_window_and_to_their_gpu(sims, clock) -> None:
    sim = sims("2xH100-SXM", clock=clock, static=True)
    sim.nvmlInit()
    h0, h1 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    sim.faults.add("lost:1@10+5")
    sim.faults.add("error:0:nvmlDeviceGetTemperature=Unknown")
    sim.nvmlDeviceGetPowerUsage(h1)
    clock.t = 12
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetPowerUsage(h1)
    sim.nvmlDeviceGetPowerUsage(h0)  # the other GPU is unaffected
    assert sim.nvmlDeviceGetCount() == 2  # node-level calls are unaffected by a GPU's fault
    with pytest.raises(pynvml.NVMLError_Unknown):
        sim.nvmlDeviceGetTemperature(h0, 0)
    clock.t = 15
    sim.nvmlDeviceGetPowerUsage(h1)


def test_a_hung_call_blocks_until_released(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    fault = sim.faults.add("hang:0:nvmlDeviceGetPowerUsage")
    returned = threading.Event()
    t = threading.Thread(target=lambda: (sim.nvmlDeviceGetPowerUsage(h), returned.set()), daemon=True)
    t.start()
    assert not returned.wait(0.3)
    sim.nvmlDeviceGetTemperature(h, 0)  # other calls on the same GPU still answer
    sim.faults.remove(fault)
    assert returned.wait(5)


def test_a_slowdown_leaves_calls_alone_and_lasts_its_window(sims, clock) -> None:
    sim = sims("2xH100-SXM", clock=clock, static=True)
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(1)
    sim.faults.add("slowdown:1=3@10+5")
    clock.t = 12
    sim.nvmlDeviceGetPowerUsage(h)  # answers as usual: the GPU is slow, not its driver
    assert sim.faults.slowdown(1, 12) == 3.0 and sim.faults.slowdown(0, 12) == 1.0
    assert sim.faults.slowdown(1, 9.9) == sim.faults.slowdown(1, 15) == 1.0


def test_the_largest_slowdown_wins_and_windows_never_rewrite_the_past(sims, clock) -> None:
    sim = sims("2xH100-SXM", clock=clock, static=True)
    sim.faults.add("slowdown:*=2@0+100")
    clock.t = 50
    late = sim.faults.add("slowdown:0=4")  # START 0 is already past: it holds from now on
    assert sim.faults.slowdown(0, 49) == 2.0 and sim.faults.slowdown(0, 50) == 4.0
    assert sim.faults.slowdown(1, 60) == 2.0
    clock.t = 70
    sim.faults.remove(late)  # removed: it ends now, but its 20 s stay on record
    assert sim.faults.slowdown(0, 60) == 4.0 and sim.faults.slowdown(0, 70) == 2.0
    assert sorted(sim.faults.slowdown_windows([0])) == [(0.0, 100.0, 2.0), (50.0, 70.0, 4.0)]
    sim.faults.clear()
    assert sorted(sim.faults.slowdown_windows([0])) == [(0.0, 70.0, 2.0), (50.0, 70.0, 4.0)]
