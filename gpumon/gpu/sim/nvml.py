"""A pynvml-shaped module backed by simulated GPUs.

``SimNvml`` offers the nvidia-ml-py functions gpumon uses, under the same names and signatures, returning
the same ctypes structures in the same units (mW, mJ, MHz, percent, KiB counters, KB/s) and raising the same
exception classes (they are nvidia-ml-py's own: every constant, structure and NVMLError subclass is taken
from the installed ``pynvml``). So ``--simulate`` runs the production NVML backend unchanged, and the tests
and benchmarks exercise exactly what users run.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pynvml

from gpumon.gpu import fields
from gpumon.gpu.sim.catalog import MiB, SimModel, parse_spec
from gpumon.gpu.sim.device import SimGpu, SimMigDevice, StaticDynamics
from gpumon.gpu.sim.driven import SdkDriver
from gpumon.gpu.sim.dynamics import IdleWorkload, NodeWorkload, TrainingDynamics, Workload, step_seconds
from gpumon.gpu.sim.events import SimEvents
from gpumon.gpu.sim.faults import Faults, Window
from gpumon.gpu.sim.gpm import SimGpm
from gpumon.gpu.sim.jobs import SimJob, parse_jobs
from gpumon.gpu.sim.mig import SimMig
from gpumon.gpu.sim.processes import SimProcesses
from gpumon.gpu.types import THROTTLE_REASONS

UINT_MAX = 0xFFFFFFFF


# the fields the simulator answers (pynvml's own names; everything else is NOT_SUPPORTED)
FI_MEMORY_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP
FI_NVLINK_COUNT = pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT
FI_PCIE = (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES)
FI_NVLINK = (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
FI_THROTTLE_TIME = tuple(fid for _, _, fid in THROTTLE_REASONS if fid is not None)
# fields that carry what a call of its own also answers: (that call, how to read the field from the state)
FI_ENERGY = pynvml.NVML_FI_DEV_ENERGY
FI_ECC = {  # field → (volatile?, error type index)
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (True, 0),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (True, 1),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (False, 0),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (False, 1),
}
FI_REPLAYS = pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER
# power as nvmlDeviceGetPowerUsage reports it on Hopper (the 1 s average) and the enforced limit, both mW
FI_POWER, FI_POWER_LIMIT = pynvml.NVML_FI_DEV_POWER_AVERAGE, pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT
FI_NVLINK_STATE = pynvml.NVML_FI_DEV_NVLINK_GET_STATE  # per link (scopeId): NVML_NVLINK_STATE_*
FI_REMAPPED = (
    pynvml.NVML_FI_DEV_REMAPPED_COR,
    pynvml.NVML_FI_DEV_REMAPPED_UNC,
    pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
)
# a fault on a call reaches the fields that carry the same quantity, as a failing driver path would
FOLDED_OP = {
    FI_ENERGY: "nvmlDeviceGetTotalEnergyConsumption",
    **dict.fromkeys(FI_ECC, "nvmlDeviceGetTotalEccErrors"),
    FI_REPLAYS: "nvmlDeviceGetPcieReplayCounter",
    FI_POWER: "nvmlDeviceGetPowerUsage",
    FI_POWER_LIMIT: "nvmlDeviceGetEnforcedPowerLimit",
    FI_NVLINK_STATE: "nvmlDeviceGetNvLinkState",
    **dict.fromkeys(FI_REMAPPED, "nvmlDeviceGetRemappedRows"),
}
_FIELDS_KNOWN = {FI_MEMORY_TEMP, FI_NVLINK_COUNT, *FI_PCIE, *FI_NVLINK, *FI_THROTTLE_TIME, *FOLDED_OP}

# Which calls each model lacks: (op or field id) → predicate on the model
_MODEL_GAPS: dict[str | int, Callable[[SimModel], bool]] = {
    "nvmlDeviceGetFanSpeed": lambda m: not m.fan,
    "nvmlDeviceGetTotalEccErrors": lambda m: not m.ecc,
    "nvmlDeviceGetRemappedRows": lambda m: not m.remapped_rows,
    **{fid: (lambda m: not m.ecc) for fid in FI_ECC},
    **{fid: (lambda m: not m.remapped_rows) for fid in FI_REMAPPED},
    "nvmlDeviceGetNvLinkState": lambda m: m.nvlinks == 0,
    FI_NVLINK_STATE: lambda m: m.nvlinks == 0,
    "nvmlDeviceGetMigMode": lambda m: not m.mig,
    FI_MEMORY_TEMP: lambda m: not m.hbm,
    **{fid: (lambda m: not m.pcie_counters) for fid in FI_PCIE},
    **{fid: (lambda m: not m.throttle_time_fields) for fid in FI_THROTTLE_TIME},
    **{fid: (lambda m: m.nvlinks == 0) for fid in FI_NVLINK},
}
MAX_SPEED = 10000.0  # a simulated day in under 9 s: past that a sweep spans hours and shows nothing
_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG


class SimNvml(SimEvents, SimMig, SimGpm, SimProcesses):
    """Stands in for the ``pynvml`` module. Pass it wherever gpumon takes an NVML module.

    ``speed`` makes simulated time run that many times faster than ``clock`` (``--sim-speed``): the node's
    job schedule, the GPUs' dynamics and counters, processes, fault windows and scheduled XIDs all follow
    simulated time, so a simulated day fits in minutes. What NVML stamps with the wall clock (field values,
    process samples) stays on real time, and so do the calls' own latencies (``slow``).
    """

    simulated = True  # how the backend tells (gpumon_build_info{backend="sim"}); pynvml has no such name

    def __init__(
        self,
        gpus: str | Iterable[SimModel] = "8xH100-SXM",
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        static: bool = False,
        warmup: float = 0.0,
        driver_version: str = "570.133.20",
        cuda_driver_version: int = 12080,
        jobs: Sequence[str] = (),
        speed: float = 1.0,
        unreported_jobs: bool = True,
    ) -> None:
        if not 0.0 < speed <= MAX_SPEED:  # NaN fails too
            raise ValueError(f"speed must be above 0 and at most {MAX_SPEED:g}, got {speed!r}")
        if jobs and speed != 1.0:
            # their ranks report through the SDK on the wall clock: tokens/s and MFU would be speed x wrong
            raise ValueError("simulated jobs run in real time: speed must be 1 with jobs")
        models = parse_spec(gpus) if isinstance(gpus, str) else list(gpus)
        self.spec = gpus if isinstance(gpus, str) else ",".join(m.key for m in models)
        self.seed = seed
        self._clock = clock
        self._t0 = clock()
        self.speed = float(speed)
        self.warmup = warmup
        self.faults = Faults(self.elapsed)
        # --sim-job: those GPUs run that job for good. The others idle, or run the node's sequence of jobs
        # that do not report (unreported_jobs), unless SDK processes reporting on them drive them (driven.py)
        self.jobs = [
            SimJob(
                spec,
                min(models[g].process_bytes for g in spec.gpus),
                functools.partial(self._windows, spec.gpus),
            )
            for spec in parse_jobs(jobs, len(models))
        ]
        workloads: dict[int, Workload] = {gpu: job for job in self.jobs for gpu in job.spec.gpus}
        node: Workload = NodeWorkload(seed) if unreported_jobs else IdleWorkload()
        slowed = [functools.partial(self._slowed, i) for i in range(len(models))]
        dt = step_seconds(self.speed)
        self.gpus = [
            SimGpu(
                i,
                m,
                seed,
                StaticDynamics(m) if static else TrainingDynamics(m, i, seed, w, slowed[i], dt),
                {k for k, gap in _MODEL_GAPS.items() if gap(m)},
            )
            for i, m in enumerate(models)
            for w in [workloads.get(i, node)]
        ]
        free = [i for i in range(len(models)) if i not in workloads]
        self.driver = SdkDriver(self.gpus, free, clock=clock)
        for i in free:
            dynamics = self.gpus[i].dynamics
            if isinstance(dynamics, TrainingDynamics):
                dynamics.workload = self.driver.wrap(i, dynamics.workload)
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.driver_loaded = True
        self._init_count = 0
        self._init_lock = threading.Lock()
        self._events_init()
        self._gpm_init()
        self._processes_init()

    # -- pynvml's constants, structures and exceptions are the real ones --------------------------------
    def __getattr__(self, name: str) -> Any:
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            raise AttributeError(f"the simulated NVML does not implement {name}")
        return value

    def elapsed(self) -> float:
        """Simulated seconds since this simulated NVML was created: the time base of faults."""
        return (self._clock() - self._t0) * self.speed

    def wall_elapsed(self) -> float:
        """Real seconds since this simulated NVML was created (``clock``'s), whatever the speed."""
        return self._clock() - self._t0

    def now(self) -> float:
        """Simulated workload time: ``warmup`` seconds of training had happened when gpumon started."""
        return self.elapsed() + self.warmup

    def _slowed(self, gpu: int, t: float) -> float:
        """How many times slower ``gpu`` runs at workload time ``t`` (``slowdown`` faults)."""
        return self.faults.slowdown(gpu, t - self.warmup)

    def _windows(self, gpus: Sequence[int]) -> list[Window]:
        """The ``slowdown`` windows over ``gpus``, in workload time: what a simulated job steps by."""
        return self.faults.slowdown_windows(gpus, self.warmup)

    # -- helpers ---------------------------------------------------------------------------------------
    def _enter(self, op: str, gpu: SimGpu | None = None) -> None:
        if self._init_count == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        self.faults.check(op, None if gpu is None else gpu.index)
        if gpu is not None and op in gpu.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _gpu(self, handle: Any, op: str) -> SimGpu:
        if not isinstance(handle, SimGpu):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._enter(op, handle)
        with handle.lock:
            handle.dynamics.advance_to(self.now())
        return handle

    # -- init / system ---------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        if not self.driver_loaded:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self.faults.check("nvmlInit", None)
        with self._init_lock:
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        with self._init_lock:
            if self._init_count == 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return f"{self.cuda_driver_version // 1000}.{self.driver_version}"

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimGpu:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[index]
        self.faults.check("nvmlDeviceGetHandleByIndex", gpu.index)
        return gpu

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> SimGpu:
        self._enter("nvmlDeviceGetHandleByUUID")
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            if gpu.uuid == wanted:
                self.faults.check("nvmlDeviceGetHandleByUUID", gpu.index)
                return gpu
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    # -- identity --------------------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: SimGpu | SimMigDevice) -> str:
        if isinstance(handle, SimMigDevice):
            return self._mig(handle, "nvmlDeviceGetUUID").uuid
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: SimGpu | SimMigDevice) -> str:
        if isinstance(handle, SimMigDevice):
            mig = self._mig(handle, "nvmlDeviceGetName")
            return f"{mig.parent.model.nvml_name} MIG {mig.profile}"
        return self._gpu(handle, "nvmlDeviceGetName").model.nvml_name

    def nvmlDeviceGetIndex(self, handle: SimGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetIndex").index

    def nvmlDeviceGetPciInfo(self, handle: SimGpu) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id
        info.busIdLegacy = gpu.pci_bus_id
        domain, bus, _ = gpu.pci_bus_id.split(":")
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), 0
        info.pciDeviceId = gpu.model.pci_device_id
        return info

    def nvmlDeviceGetSerial(self, handle: SimGpu) -> str:
        return self._gpu(handle, "nvmlDeviceGetSerial").serial

    def nvmlDeviceGetBoardPartNumber(self, handle: SimGpu) -> str:
        return self._gpu(handle, "nvmlDeviceGetBoardPartNumber").model.board_part_number

    def nvmlDeviceGetVbiosVersion(self, handle: SimGpu) -> str:
        return self._gpu(handle, "nvmlDeviceGetVbiosVersion").model.vbios

    def nvmlDeviceGetPersistenceMode(self, handle: SimGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetPersistenceMode").persistence_mode

    # -- readings --------------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: SimGpu) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        if gpu.mig:  # NVML has no whole-GPU utilisation under MIG
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        s = gpu.state
        util = pynvml.c_nvmlUtilization_t()
        util.gpu = round(s.util * 100)
        util.memory = round(s.mem_util * 100)
        return util

    def nvmlDeviceGetMemoryInfo(self, handle: SimGpu | SimMigDevice, version: int | None = None) -> Any:
        if isinstance(handle, SimMigDevice):
            if version and version != pynvml.nvmlMemory_v2:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            return self._mig_memory(handle, version)
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        total = gpu.model.memory_mib * MiB
        reserved = gpu.model.reserved_mib * MiB
        used = min(int(gpu.state.memory_used), total - reserved)  # a card cannot hold more than it has
        if not version:  # v1 folds the reserved memory into "used"
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.used, mem.free = total, used + reserved, total - used - reserved
            return mem
        if version != pynvml.nvmlMemory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        mem = pynvml.c_nvmlMemory_v2_t()
        mem.version = version
        mem.total, mem.reserved, mem.used, mem.free = total, reserved, used, total - reserved - used
        return mem

    def nvmlDeviceGetPowerUsage(self, handle: SimGpu) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetPowerUsage").state.power_w * 1000)

    def nvmlDeviceGetEncoderUtilization(self, handle: SimGpu) -> list[int]:
        # no simulated workload encodes or decodes video: idle engines, over the driver's 167 ms window.
        # Boards without NVENC answer too, with 0, as a real H200 does (captures/h200-load-2.json)
        self._gpu(handle, "nvmlDeviceGetEncoderUtilization")
        return [0, 166667]

    def nvmlDeviceGetDecoderUtilization(self, handle: SimGpu) -> list[int]:
        self._gpu(handle, "nvmlDeviceGetDecoderUtilization")
        return [0, 166667]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: SimGpu) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").state.power_limit_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimGpu) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").state.energy_j * 1000)

    def nvmlDeviceGetTemperature(self, handle: SimGpu, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(gpu.state.temp_c)

    def nvmlDeviceGetClockInfo(self, handle: SimGpu, type: int) -> int:
        s = self._gpu(handle, "nvmlDeviceGetClockInfo").state
        return self._clock_value(type, s.sm_clock_mhz, s.mem_clock_mhz)

    def nvmlDeviceGetMaxClockInfo(self, handle: SimGpu, type: int) -> int:
        m = self._gpu(handle, "nvmlDeviceGetMaxClockInfo").model
        return self._clock_value(type, m.sm_clock_max_mhz, m.memory_clock_mhz)

    @staticmethod
    def _clock_value(clock_type: int, sm: float, mem: float) -> int:
        if clock_type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return int(sm)
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return int(mem)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: SimGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").state.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: SimGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").state.reasons

    def nvmlDeviceGetPerformanceState(self, handle: SimGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetPerformanceState").state.pstate

    def nvmlDeviceGetFanSpeed(self, handle: SimGpu) -> int:
        return round(self._gpu(handle, "nvmlDeviceGetFanSpeed").state.fan_ratio * 100)

    def nvmlDeviceGetPcieThroughput(self, device: SimGpu, counter: int) -> int:
        s = self._gpu(device, "nvmlDeviceGetPcieThroughput").state
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            return int(s.pcie_tx_rate / 1000)
        if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            return int(s.pcie_rx_rate / 1000)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: SimGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration").state.pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: SimGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth").state.pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: SimGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").model.pcie_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: SimGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").model.pcie_width

    def nvmlDeviceGetPcieReplayCounter(self, handle: SimGpu) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").state.replays

    def nvmlDeviceGetNvLinkState(self, device: SimGpu, link: int) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkState")
        if gpu.mig:  # as real NVML: NVLink is not queryable on a GPU in MIG mode
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < gpu.model.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if gpu.state.link_up[link] else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetTotalEccErrors(self, handle: SimGpu, errorType: int, counterType: int) -> int:
        s = self._gpu(handle, "nvmlDeviceGetTotalEccErrors").state
        if errorType not in (0, 1) or counterType not in (0, 1):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        counts = s.ecc_volatile if counterType == pynvml.NVML_VOLATILE_ECC else s.ecc_aggregate
        return counts[errorType]

    def nvmlDeviceGetRemappedRows(self, device: SimGpu) -> tuple[int, int, int, int]:
        gpu = self._gpu(device, "nvmlDeviceGetRemappedRows")
        if gpu.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        corr, unc, pending, failure = gpu.state.remap
        return corr, unc, pending, failure

    def nvmlDeviceGetFieldValues(self, handle: SimGpu, fieldIds: list[Any]) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        stamp = int(time.time() * 1e6)
        for i, (fid, scope) in enumerate(fields.request(fieldIds)):
            ret, value_type, value = self._field(gpu, fid, scope)
            fields.encode(values, i, fid, scope, stamp, 3, value_type, ret, value)
        return values

    def _folded_field(self, gpu: SimGpu, fid: int, scope: int = 0) -> tuple[int, int, float]:
        if fid == FI_NVLINK_STATE and not 0 <= scope < gpu.model.nvlinks:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT, _UINT, 0
        failed = self.faults.error_for(FOLDED_OP[fid], gpu.index)
        if failed is not None:
            return failed, _ULL, 0
        s = gpu.state
        if fid == FI_NVLINK_STATE:
            up = s.link_up[scope]
            return (
                pynvml.NVML_SUCCESS,
                _UINT,
                pynvml.NVML_NVLINK_STATE_ACTIVE if up else pynvml.NVML_NVLINK_STATE_INACTIVE,
            )
        if fid == FI_ENERGY:
            return pynvml.NVML_SUCCESS, _ULL, int(s.energy_j * 1000)
        if fid in FI_ECC:
            volatile, kind = FI_ECC[fid]
            return pynvml.NVML_SUCCESS, _ULL, (s.ecc_volatile if volatile else s.ecc_aggregate)[kind]
        if fid == FI_REPLAYS:
            return pynvml.NVML_SUCCESS, _UINT, s.replays
        if fid == FI_POWER:
            return pynvml.NVML_SUCCESS, _UINT, int(s.power_w * 1000)
        if fid == FI_POWER_LIMIT:
            return pynvml.NVML_SUCCESS, _UINT, int(s.power_limit_w * 1000)
        if gpu.mig:  # as its own call: no row remapping in MIG mode
            return pynvml.NVML_ERROR_NOT_SUPPORTED, _UINT, 0
        return pynvml.NVML_SUCCESS, _UINT, s.remap[FI_REMAPPED.index(fid)]

    def _field(self, gpu: SimGpu, fid: int, scope: int) -> tuple[int, int, float]:
        """(nvmlReturn, valueType, value) of one field, in NVML's units."""
        s, m = gpu.state, gpu.model
        if fid not in _FIELDS_KNOWN or fid in gpu.unsupported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, _ULL, 0
        if gpu.mig and (fid in (FI_NVLINK_COUNT, FI_NVLINK_STATE) or fid in FI_NVLINK):
            return pynvml.NVML_ERROR_NOT_SUPPORTED, _ULL, 0  # NVLink, in MIG mode: as real NVML
        if fid in FOLDED_OP:
            return self._folded_field(gpu, fid, scope)
        if fid == FI_MEMORY_TEMP:
            return pynvml.NVML_SUCCESS, _UINT, int(s.mem_temp_c)
        if fid == FI_NVLINK_COUNT:
            return pynvml.NVML_SUCCESS, _UINT, m.nvlinks
        if fid in FI_PCIE:
            return pynvml.NVML_SUCCESS, _ULL, int(s.pcie_tx_bytes if fid == FI_PCIE[0] else s.pcie_rx_bytes)
        if fid in FI_NVLINK:
            per_link = s.nvlink_tx if fid == FI_NVLINK[0] else s.nvlink_rx
            if scope == UINT_MAX:
                return pynvml.NVML_SUCCESS, _ULL, int(sum(per_link)) // 1024
            if scope < m.nvlinks:
                return pynvml.NVML_SUCCESS, _ULL, int(per_link[scope]) // 1024
            return pynvml.NVML_ERROR_INVALID_ARGUMENT, _ULL, 0
        return pynvml.NVML_SUCCESS, _ULL, s.throttle_ns[fid]  # cumulative throttle time, ns
