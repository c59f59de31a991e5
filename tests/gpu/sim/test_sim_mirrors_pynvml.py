"""The simulated NVML must be indistinguishable from nvidia-ml-py where gpumon looks: names, signatures,
return structures, exception classes and units. A test that passed against a fake NVML would contradict is
a defect, so these tests compare with the installed ``pynvml`` itself."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pynvml
import pytest

import gpumon.gpu
from gpumon.gpu.sim import SimNvml
from gpumon.gpu.sim.catalog import MiB

SIM_FUNCTIONS = sorted(n for n, v in inspect.getmembers(SimNvml) if n.startswith("nvml") and callable(v))


def backend_calls() -> dict[str, set[str]]:
    """Every nvidia-ml-py function named in gpumon's NVML side (the capture tools, which name calls to
    record and replay them, and the simulator itself left out), with the files that name it."""
    gpu = Path(gpumon.gpu.__file__).parent
    named: dict[str, set[str]] = {}
    for path in gpu.rglob("*.py"):
        if {"sim", "capture"} & set(path.relative_to(gpu).parts):
            continue
        for name in re.findall(r"\b(nvml[A-Z]\w*)\b", path.read_text()):
            if callable(getattr(pynvml, name, None)):
                named.setdefault(name, set()).add(path.name)
    return named


def test_the_simulator_implements_what_the_backend_calls() -> None:
    called = backend_calls()
    assert len(called) >= 50 and "nvmlDeviceGetFieldValues" in called  # the scan finds the calls
    missing = {name: sorted(files) for name, files in called.items() if name not in SIM_FUNCTIONS}
    assert missing == {}, f"the backend calls NVML functions the simulator lacks: {missing}"


@pytest.mark.parametrize("name", SIM_FUNCTIONS)
def test_every_function_exists_in_nvidia_ml_py_with_the_same_parameters(name: str) -> None:
    real = getattr(pynvml, name, None)
    assert real is not None, f"{name} is not an nvidia-ml-py function"
    real_params = list(inspect.signature(inspect.unwrap(real)).parameters)
    sim_params = list(inspect.signature(getattr(SimNvml, name)).parameters)[1:]  # drop self
    assert sim_params == real_params


def test_constants_structures_and_exceptions_are_nvidia_ml_pys_own() -> None:
    sim = SimNvml("1xH100-SXM")
    assert sim.NVMLError is pynvml.NVMLError
    assert sim.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert sim.c_nvmlFieldValue_t is pynvml.c_nvmlFieldValue_t
    assert sim.NVML_FI_DEV_PCIE_COUNT_TX_BYTES == 197
    with pytest.raises(AttributeError, match="does not implement"):
        sim.nvmlDeviceGetGpcClkVfOffset  # noqa: B018 (a real function the simulator does not offer)


def test_calls_before_init_raise_uninitialized_like_nvml() -> None:
    sim = SimNvml("1xH100-SXM")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
    sim.nvmlInit()
    assert sim.nvmlDeviceGetCount() == 1
    sim.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()


def test_driver_absent_raises_driver_not_loaded_on_init() -> None:
    sim = SimNvml("1xH100-SXM")
    sim.driver_loaded = False
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        sim.nvmlInit()


def test_return_types_and_units_match_nvml(sims, clock) -> None:
    sim = sims("1xH100-SXM", clock=clock, static=True)
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    s = sim.gpus[0].state
    s.power_w, s.power_limit_w, s.energy_j = 512.25, 700.0, 1234.5
    s.util, s.mem_util, s.memory_used = 0.87, 0.31, 10 * MiB
    s.pcie_tx_rate, s.nvlink_tx[0] = 3_000_000.0, 5 * 1024 * 1024.0

    assert sim.nvmlDeviceGetPowerUsage(h) == 512250  # mW
    assert sim.nvmlDeviceGetEnforcedPowerLimit(h) == 700000  # mW
    assert sim.nvmlDeviceGetTotalEnergyConsumption(h) == 1234500  # mJ
    util = sim.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(util, pynvml.c_nvmlUtilization_t)
    assert (util.gpu, util.memory) == (87, 31)  # percent
    mem = sim.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert isinstance(mem, pynvml.c_nvmlMemory_v2_t)
    assert mem.total == mem.reserved + mem.used + mem.free
    assert isinstance(sim.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    pci = sim.nvmlDeviceGetPciInfo(h)
    assert isinstance(pci, pynvml.nvmlPciInfo_t) and isinstance(pci.busId, str)
    assert sim.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 3000  # KB/s
    assert sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == 2619  # MHz
    values = sim.nvmlDeviceGetFieldValues(h, [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0), 91])
    assert isinstance(values[0], pynvml.c_nvmlFieldValue_t)
    assert values[0].nvmlReturn == pynvml.NVML_SUCCESS and values[0].value.ullVal == 5 * 1024  # KiB
    assert values[1].value.uiVal == 18
    assert isinstance(sim.nvmlDeviceGetUUID(h), str) and sim.nvmlDeviceGetUUID(h).startswith("GPU-")


def test_field_errors_are_per_entry_not_exceptions(sims) -> None:
    sim = sims("1xL4")
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    values = sim.nvmlDeviceGetFieldValues(h, [82, 197, 9999])
    assert [v.nvmlReturn for v in values] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 3


def test_handles_by_uuid_accept_str_and_bytes(sims) -> None:
    sim = sims("2xH100-SXM")
    sim.nvmlInit()
    uuid = sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(1))
    assert sim.nvmlDeviceGetHandleByUUID(uuid) is sim.nvmlDeviceGetHandleByUUID(uuid.encode())
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetHandleByUUID("GPU-nope")


def test_unsupported_calls_raise_not_supported_per_model(sims) -> None:
    sim = sims("1xH100-SXM,1xRTX-A6000")
    sim.nvmlInit()
    h100, a6000 = (sim.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetFanSpeed(h100)
    assert 0 <= sim.nvmlDeviceGetFanSpeed(a6000) <= 100
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetTotalEccErrors(a6000, 0, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetNvLinkState(h100, 18)
