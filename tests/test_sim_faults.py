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
    ],
)
def test_fault_specs_parse(text: str, expect: dict) -> None:
    fault = Fault.parse(text)
    for key, value in expect.items():
        assert getattr(fault, key) == value


@pytest.mark.parametrize(
    "text", ["melt:1", "lost:x", "error:1:nvmlFoo=NoSuchError", "lost:1@soon", "slow:1:*=fast", "lost:1:*=3"]
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
