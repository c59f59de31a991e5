"""The NVML backend: the only code that calls nvidia-ml-py (or the simulator that mirrors it).

Every NVML call goes through ``_Calls.call``, which turns NVML's answers into three outcomes: a value, an
absent quantity (NOT_SUPPORTED / NO_PERMISSION, remembered so it is not asked again and logged once), or an
error (counted, the value absent this sample). Errors that mean the GPU itself is gone raise DeviceDown, and
the sampler takes over with backoff.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pynvml

from gpumon.gpu import fields as nvml_fields
from gpumon.gpu.backend import Device
from gpumon.gpu.sim.nvml import is_simulated
from gpumon.gpu.types import (
    THROTTLE_REASONS,
    BackendUnavailable,
    DeviceDown,
    DriverInfo,
    GpuInfo,
    GpuReading,
    NvlinkReading,
    ReadError,
    ReadResult,
    Support,
)

log = logging.getLogger("gpumon.nvml")

UINT_MAX = 0xFFFFFFFF
MHZ = 1e6
KIB = 1024

FI_MEMORY_TEMP = 82
FI_NVLINK_COUNT = 91
FI_PCIE_TX, FI_PCIE_RX = 197, 198
FI_NVLINK_TX, FI_NVLINK_RX = 138, 139
THROTTLE_FIELDS = {fid: name for _, name, fid in THROTTLE_REASONS if fid is not None}

# NVML errors after which nothing on that GPU can be read until it is re-acquired
_DOWN_ERRORS = (
    "GpuIsLost",
    "Uninitialized",
    "DriverNotLoaded",
    "LibraryNotFound",
    "LibRmVersionMismatch",
    "ResetRequired",
)
# the quantity is absent on this GPU: remember it and stop asking
_ABSENT_ERRORS = {
    "NotSupported": Support.NOT_SUPPORTED,
    "FunctionNotFound": Support.NOT_SUPPORTED,
    "ArgumentVersionMismatch": Support.NOT_SUPPORTED,
    "NoPermission": Support.NO_PERMISSION,
}
_SKIP = (Support.NOT_SUPPORTED, Support.NO_PERMISSION)


def error_kind(exc: BaseException) -> str:
    """``NVMLError_GpuIsLost`` → ``GpuIsLost``; anything that is not an NVML error → ``exception``."""
    if isinstance(exc, pynvml.NVMLError):
        name = type(exc).__name__
        return name[len("NVMLError_") :] if name.startswith("NVMLError_") else f"Error{exc.value}"
    if isinstance(exc, AttributeError):  # an nvidia-ml-py too old to have this function
        return "FunctionNotFound"
    return "exception"


class _DaemonPool:
    """A few daemon threads running calls for one GPU.

    concurrent.futures.ThreadPoolExecutor joins its threads at interpreter exit, so one PCIe call hung in
    the driver would keep the daemon from exiting on SIGTERM; daemon threads do not.
    """

    def __init__(self, name: str, size: int) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(size):
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            future, fn, args = self._queue.get()
            if future is None:
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the reader, which classifies it
                future.set_exception(exc)

    def shutdown(self, size: int) -> None:
        for _ in range(size):  # idle threads exit; one stuck in the driver ends with the process
            self._queue.put((None, None, None))


class NvmlDevice(Device):
    def __init__(self, info: GpuInfo, handle: Any) -> None:
        super().__init__(info)
        self.handle = handle
        self.reads = 0
        self.link_states: list[bool | None] = [None] * info.nvlink_count
        self.fields: list[tuple[str, int, int]] = []
        self.fields_version = -1
        self.pcie_pool: _DaemonPool | None = None
        self.pcie_pending: tuple[concurrent.futures.Future, concurrent.futures.Future] | None = None


class _Calls:
    """Runs one GPU's NVML calls for one read and classifies every failure."""

    __slots__ = ("dev", "errors", "nv", "ok")

    def __init__(self, nv: Any, dev: NvmlDevice) -> None:
        self.nv = nv
        self.dev = dev
        self.errors: list[ReadError] = []
        self.ok = 0

    def call(self, quantity: str, op: str, *args: Any) -> Any:
        dev = self.dev
        if dev.support.get(quantity) in _SKIP:
            return None
        dev.begin(op)
        try:
            value = getattr(self.nv, op)(*args)
        except Exception as exc:
            self.failed(quantity, op, exc)
            return None
        finally:
            dev.end()
        self.ok += 1
        if dev.support.get(quantity) is not Support.SUPPORTED:
            dev.set_support(quantity, Support.SUPPORTED)
        return value

    def failed(self, quantity: str, op: str, exc: BaseException) -> None:
        kind = error_kind(exc)
        if kind in _DOWN_ERRORS:
            raise DeviceDown(op, kind, str(exc)) from exc
        absent = _ABSENT_ERRORS.get(kind)
        if absent is not None:
            self.absent(quantity, op, absent)
            return
        self.dev.set_support(quantity, Support.ERROR)
        self.errors.append(ReadError(op, kind, str(exc)))

    def absent(self, quantity: str, op: str, state: Support) -> None:
        if self.dev.set_support(quantity, state):
            info = self.dev.info
            advice = " (run gpumon doctor for advice)" if state is Support.NO_PERMISSION else ""
            log.info(
                "GPU %d (%s): %s is %s via %s; its series are absent%s",
                info.index,
                info.uuid,
                quantity,
                state.value.replace("_", " "),
                op,
                advice,
            )


def _total(values: list[float | None]) -> float | None:
    """The sum, or None if any part is missing: a partial sum would make a counter jump back."""
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


class NvmlBackend:
    """Reads GPUs through an nvidia-ml-py-shaped module: ``pynvml`` itself, or ``SimNvml``."""

    def __init__(self, nvml: ModuleType | Any | None = None, *, nvlink_state_every: int = 10) -> None:
        self.nv = nvml if nvml is not None else pynvml
        self.name = "sim" if is_simulated(self.nv) else "nvml"
        self.nvlink_state_every = max(1, nvlink_state_every)
        self._lock = threading.Lock()
        self._initialized = False
        self.device_count = 0
        self._devices: list[NvmlDevice] = []

    # -- lifecycle ---------------------------------------------------------------------------------------
    def open(self) -> list[NvmlDevice]:
        with self._lock:
            self._init()
        devices, _ = self.discover(set())
        return devices

    def _init(self) -> None:
        try:
            self.nv.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML could not start: {exc} ({error_kind(exc)})") from exc
        except OSError as exc:  # a broken libnvidia-ml.so surfaces from ctypes, not as an NVMLError
            raise BackendUnavailable(f"NVML could not start: {exc}") from exc
        self._initialized = True

    def _reinit(self) -> None:
        with self._lock:
            self.nv.nvmlInit()  # NVML counts initialisations: an extra one is harmless
            self._initialized = True

    def close(self) -> None:
        for dev in self._devices:
            if dev.pcie_pool is not None:
                dev.pcie_pool.shutdown(2)
                dev.pcie_pool = None
        # a re-initialisation hung in the driver holds the lock: exit without nvmlShutdown rather than hang
        if not self._lock.acquire(timeout=2.0):
            log.warning("NVML is stuck in a call; exiting without nvmlShutdown")
            return
        try:
            if self._initialized:
                self._initialized = False
                try:
                    self.nv.nvmlShutdown()
                except pynvml.NVMLError as exc:
                    log.debug("nvmlShutdown: %s", exc)
        finally:
            self._lock.release()

    def driver_info(self) -> DriverInfo:
        def text(op: str) -> str:
            try:
                return str(getattr(self.nv, op)())
            except (pynvml.NVMLError, AttributeError):
                return ""

        cuda = ""
        try:
            v = int(self.nv.nvmlSystemGetCudaDriverVersion())
            cuda = f"{v // 1000}.{v % 1000 // 10}"
        except (pynvml.NVMLError, AttributeError):
            pass
        return DriverInfo(text("nvmlSystemGetDriverVersion"), cuda, text("nvmlSystemGetNVMLVersion"))

    def discover(self, known_uuids: set[str]) -> tuple[list[NvmlDevice], int]:
        try:
            count = self.nv.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            log.warning("nvmlDeviceGetCount failed: %s", exc)
            return [], max(1, self.device_count - len(known_uuids))
        self.device_count = count
        found: list[NvmlDevice] = []
        failed = 0
        for index in range(count):
            try:
                handle = self.nv.nvmlDeviceGetHandleByIndex(index)
                uuid = str(self.nv.nvmlDeviceGetUUID(handle))
                if uuid in known_uuids:
                    continue
                dev = NvmlDevice(self._identify(index, uuid, handle), handle)
                # learn which fields exist now, so the first read already takes every fallback it needs
                self._fields(_Calls(self.nv, dev))
                found.append(dev)
                self._devices.append(dev)
            except (pynvml.NVMLError, DeviceDown) as exc:
                failed += 1
                log.warning("GPU %d could not be identified (%s); will retry", index, exc)
        return found, failed

    def _identify(self, index: int, uuid: str, handle: Any, track: Device | None = None) -> GpuInfo:
        """Static facts. Name and bus id are required; the rest may be absent on some boards.

        With ``track``, each call is recorded on that device, so a call that hangs can be named."""
        nv = self.nv

        def required(op: str, *args: Any) -> Any:
            if track is not None:
                track.begin(op)
            return getattr(nv, op)(handle, *args)

        def optional(op: str, *args: Any) -> Any:
            try:
                return required(op, *args)
            except (pynvml.NVMLError, AttributeError) as exc:
                if error_kind(exc) in _DOWN_ERRORS:
                    raise
                return None

        pci = required("nvmlDeviceGetPciInfo")
        raw = optional("nvmlDeviceGetFieldValues", [FI_NVLINK_COUNT])
        links = 0
        if raw is not None:
            _, value = nvml_fields.decode(raw)[0]
            links = int(value) if value is not None else 0
        persistence = optional("nvmlDeviceGetPersistenceMode")
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=str(required("nvmlDeviceGetName")),
            pci_bus_id=str(pci.busId),
            serial=optional("nvmlDeviceGetSerial"),
            board_part_number=optional("nvmlDeviceGetBoardPartNumber"),
            vbios_version=optional("nvmlDeviceGetVbiosVersion"),
            persistence_mode=None if persistence is None else persistence == pynvml.NVML_FEATURE_ENABLED,
            sm_clock_max_hz=_scaled(optional("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM), MHZ),
            memory_clock_max_hz=_scaled(optional("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_MEM), MHZ),
            pcie_link_max_generation=optional("nvmlDeviceGetMaxPcieLinkGeneration"),
            pcie_link_max_width=optional("nvmlDeviceGetMaxPcieLinkWidth"),
            nvlink_count=links,
        )

    def reopen(self, device: Device) -> None:
        assert isinstance(device, NvmlDevice)
        # No lock here: these calls may hang on a GPU that fell off the bus, and must not stop other GPUs
        # from recovering (or the daemon from shutting down). Only re-initialising NVML is serialised.
        uuid = device.info.uuid
        try:
            try:
                device.begin("nvmlDeviceGetHandleByUUID")
                handle = self.nv.nvmlDeviceGetHandleByUUID(uuid)
            except pynvml.NVMLError_Uninitialized:
                self._reinit()  # the driver was reloaded under us
                device.begin("nvmlDeviceGetHandleByUUID")
                handle = self.nv.nvmlDeviceGetHandleByUUID(uuid)
            device.begin("nvmlDeviceGetIndex")
            index = self.nv.nvmlDeviceGetIndex(handle)
            info = self._identify(index, uuid, handle, track=device)
        except (pynvml.NVMLError, OSError) as exc:
            raise DeviceDown(device.current_op or "reopen", error_kind(exc), str(exc)) from exc
        finally:
            device.end()
        # capabilities are kept: a GPU that comes back after a reset supports what it did before
        device.handle = handle
        device.info = info
        device.support_version += 1
        device.link_states = [None] * info.nvlink_count
        device.fields_version = -1

    # -- one read ----------------------------------------------------------------------------------------
    def read(self, device: Device, deadline: float) -> ReadResult:
        assert isinstance(device, NvmlDevice)
        dev, nv, h = device, self.nv, device.handle
        started = time.perf_counter()
        c = _Calls(nv, dev)

        pcie_rates = self._start_pcie_throughput(c) if self._pcie_fallback(dev) else None

        util = c.call("utilization", "nvmlDeviceGetUtilizationRates", h)
        mem = self._memory(c)
        power = c.call("power", "nvmlDeviceGetPowerUsage", h)
        power_limit = c.call("power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
        energy = c.call("energy", "nvmlDeviceGetTotalEnergyConsumption", h)
        temp = c.call("temperature", "nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        sm_clock = c.call("sm_clock", "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM)
        mem_clock = c.call("memory_clock", "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM)
        reasons = self._throttle_reasons(c)
        pstate = c.call("performance_state", "nvmlDeviceGetPerformanceState", h)
        fan = c.call("fan", "nvmlDeviceGetFanSpeed", h)
        link_gen = c.call("pcie_link", "nvmlDeviceGetCurrPcieLinkGeneration", h)
        link_width = c.call("pcie_link", "nvmlDeviceGetCurrPcieLinkWidth", h)
        replays = c.call("pcie_replays", "nvmlDeviceGetPcieReplayCounter", h)
        ecc = [
            c.call(q, "nvmlDeviceGetTotalEccErrors", h, err, counter)
            for q, counter in (("ecc", pynvml.NVML_VOLATILE_ECC), ("ecc_lifetime", pynvml.NVML_AGGREGATE_ECC))
            for err in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        ]
        remap = c.call("remapped_rows", "nvmlDeviceGetRemappedRows", h)
        fields = self._fields(c)
        if dev.info.nvlink_count and dev.reads % self.nvlink_state_every == 0:
            self._nvlink_states(c)
        pcie_tx_rate, pcie_rx_rate = self._finish_pcie_throughput(c, pcie_rates, deadline)
        dev.reads += 1

        if c.ok == 0 and c.errors:
            first = c.errors[0]
            raise DeviceDown(first.op, first.kind, "no quantity could be read")

        links = self._nvlinks(dev, fields)
        nvl_tx, nvl_rx = self._nvlink_totals(dev, fields, links)
        reading = GpuReading(
            timestamp=time.time(),
            duration_seconds=time.perf_counter() - started,
            utilization_ratio=None if util is None else util.gpu / 100.0,
            memory_controller_utilization_ratio=None if util is None else util.memory / 100.0,
            memory_total_bytes=None if mem is None else float(mem.total),
            memory_used_bytes=None if mem is None else float(mem.used),
            memory_free_bytes=None if mem is None else float(mem.free),
            memory_reserved_bytes=_scaled(getattr(mem, "reserved", None), 1.0),
            power_watts=_scaled(power, 1e-3),
            power_limit_watts=_scaled(power_limit, 1e-3),
            energy_joules=_scaled(energy, 1e-3),
            temperature_celsius=None if temp is None else float(temp),
            memory_temperature_celsius=fields.get((FI_MEMORY_TEMP, 0)),
            sm_clock_hz=_scaled(sm_clock, MHZ),
            memory_clock_hz=_scaled(mem_clock, MHZ),
            throttle_reasons=reasons,
            throttle_seconds={
                name: fields[(fid, 0)] * 1e-9 for fid, name in THROTTLE_FIELDS.items() if (fid, 0) in fields
            },
            pcie_transmit_bytes=fields.get((FI_PCIE_TX, 0)),
            pcie_receive_bytes=fields.get((FI_PCIE_RX, 0)),
            pcie_transmit_bytes_per_second=pcie_tx_rate,
            pcie_receive_bytes_per_second=pcie_rx_rate,
            pcie_link_generation=link_gen,
            pcie_link_width=link_width,
            pcie_replays=replays,
            nvlink_transmit_bytes=nvl_tx,
            nvlink_receive_bytes=nvl_rx,
            nvlinks=links,
            ecc_corrected_errors=ecc[0],
            ecc_uncorrected_errors=ecc[1],
            ecc_corrected_errors_lifetime=ecc[2],
            ecc_uncorrected_errors_lifetime=ecc[3],
            remapped_rows_correctable=None if remap is None else remap[0],
            remapped_rows_uncorrectable=None if remap is None else remap[1],
            row_remap_pending=None if remap is None else bool(remap[2]),
            row_remap_failure=None if remap is None else bool(remap[3]),
            performance_state=None if pstate is None or pstate == pynvml.NVML_PSTATE_UNKNOWN else int(pstate),
            fan_speed_ratio=None if fan is None else fan / 100.0,
        )
        return ReadResult(reading, tuple(c.errors))

    @staticmethod
    def _newer_or_older(
        c: _Calls, quantity: str, newer: tuple[str, str, tuple], older: tuple[str, tuple]
    ) -> Any:
        """Prefer a newer NVML call (its own capability key); where the driver or binding lacks it, the older
        call reads the same quantity."""
        dev = c.dev
        newer_key, newer_op, newer_args = newer
        if dev.support.get(newer_key) not in _SKIP:
            value = c.call(newer_key, newer_op, dev.handle, *newer_args)
            if value is not None:
                if dev.support.get(quantity) is not Support.SUPPORTED:
                    dev.set_support(quantity, Support.SUPPORTED)
                return value
            if dev.support.get(newer_key) not in _SKIP:
                return None  # a transient error, already counted
        older_op, older_args = older
        return c.call(quantity, older_op, dev.handle, *older_args)

    def _memory(self, c: _Calls) -> Any:
        # memory info v2 adds "reserved"; v1 has total/used/free on drivers that predate it
        return self._newer_or_older(
            c,
            "memory",
            ("memory_reserved", "nvmlDeviceGetMemoryInfo", (pynvml.nvmlMemory_v2,)),
            ("nvmlDeviceGetMemoryInfo", ()),
        )

    def _throttle_reasons(self, c: _Calls) -> int | None:
        # NVML renamed "throttle reasons" to "clocks event reasons" (driver 535); same bits
        return self._newer_or_older(
            c,
            "throttle_reasons",
            ("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", ()),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
        )

    # -- field values: one batched call per GPU ----------------------------------------------------------
    def _field_plan(self, dev: NvmlDevice) -> list[tuple[str, int, int]]:
        if dev.fields_version == dev.support_version:
            return dev.fields
        plan = [("memory_temperature", FI_MEMORY_TEMP, 0)]
        plan += [(f"throttle_time:{name}", fid, 0) for fid, name in THROTTLE_FIELDS.items()]
        plan += [("pcie_bytes", FI_PCIE_TX, 0), ("pcie_bytes", FI_PCIE_RX, 0)]
        plan += [("nvlink", FI_NVLINK_TX, UINT_MAX), ("nvlink", FI_NVLINK_RX, UINT_MAX)]
        for link in range(dev.info.nvlink_count):
            plan += [("nvlink_links", FI_NVLINK_TX, link), ("nvlink_links", FI_NVLINK_RX, link)]
        dev.fields = [p for p in plan if dev.support.get(p[0]) not in _SKIP]
        dev.fields_version = dev.support_version
        return dev.fields

    def _fields(self, c: _Calls) -> dict[tuple[int, int], float]:
        dev = c.dev
        plan = self._field_plan(dev)
        if not plan:
            return {}
        raw = c.call("field_values", "nvmlDeviceGetFieldValues", dev.handle, [(fid, s) for _, fid, s in plan])
        if raw is None:
            if dev.support.get("field_values") in _SKIP:
                # no field API at all: every field quantity is absent
                for quantity, _, _ in plan:
                    c.absent(quantity, "nvmlDeviceGetFieldValues", Support.NOT_SUPPORTED)
            return {}
        out: dict[tuple[int, int], float] = {}
        unsupported_links = 0
        for (quantity, fid, scope), (ret, value) in zip(plan, nvml_fields.decode(raw), strict=True):
            if ret == pynvml.NVML_SUCCESS and value is not None:
                out[(fid, scope)] = value
                if dev.support.get(quantity) is not Support.SUPPORTED:
                    dev.set_support(quantity, Support.SUPPORTED)
            elif ret in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION):
                if quantity == "nvlink_links":
                    unsupported_links += 1  # one inactive link is not "NVLink unsupported"
                else:
                    state = (
                        Support.NO_PERMISSION
                        if ret == pynvml.NVML_ERROR_NO_PERMISSION
                        else Support.NOT_SUPPORTED
                    )
                    c.absent(quantity, f"nvmlDeviceGetFieldValues[{fid}]", state)
            else:
                c.errors.append(
                    ReadError(f"nvmlDeviceGetFieldValues[{fid}]", error_kind(pynvml.NVMLError(ret)))
                )
        if unsupported_links and unsupported_links == 2 * dev.info.nvlink_count:
            c.absent("nvlink_links", "nvmlDeviceGetFieldValues[138]", Support.NOT_SUPPORTED)
        return out

    @staticmethod
    def _nvlink_totals(
        dev: NvmlDevice, fields: dict[tuple[int, int], float], links: tuple[NvlinkReading, ...]
    ) -> tuple[float | None, float | None]:
        """Bytes over all links. The source never changes for a GPU: the all-links field, or, only where NVML
        lacks it, the sum of the links. Switching on a transient error would make the counter jump backwards
        (each link is rounded to KiB on its own), which Prometheus reads as a reset."""
        if dev.support.get("nvlink") not in _SKIP:
            return (
                _scaled(fields.get((FI_NVLINK_TX, UINT_MAX)), KIB),
                _scaled(fields.get((FI_NVLINK_RX, UINT_MAX)), KIB),
            )
        if not links:
            return None, None
        return (_total([ln.transmit_bytes for ln in links]), _total([ln.receive_bytes for ln in links]))

    def _nvlink_states(self, c: _Calls) -> None:
        """Link state is read per link: NOT_SUPPORTED on one (an inactive link) leaves the others reported."""
        dev = c.dev
        if dev.support.get("nvlink_state") in _SKIP:
            return
        absent = 0
        for link in range(dev.info.nvlink_count):
            dev.begin("nvmlDeviceGetNvLinkState")
            try:
                state = self.nv.nvmlDeviceGetNvLinkState(dev.handle, link)
            except Exception as exc:  # classified below; none escapes
                dev.link_states[link] = None
                if error_kind(exc) in _ABSENT_ERRORS:
                    absent += 1
                else:
                    c.failed("nvlink_state", "nvmlDeviceGetNvLinkState", exc)
                continue
            finally:
                dev.end()
            c.ok += 1
            dev.link_states[link] = state == pynvml.NVML_FEATURE_ENABLED
        if absent == dev.info.nvlink_count:
            c.absent("nvlink_state", "nvmlDeviceGetNvLinkState", Support.NOT_SUPPORTED)
        elif absent < dev.info.nvlink_count and dev.support.get("nvlink_state") is not Support.SUPPORTED:
            dev.set_support("nvlink_state", Support.SUPPORTED)

    @staticmethod
    def _nvlinks(dev: NvmlDevice, fields: dict[tuple[int, int], float]) -> tuple[NvlinkReading, ...]:
        out = []
        for link in range(dev.info.nvlink_count):
            tx = fields.get((FI_NVLINK_TX, link))
            rx = fields.get((FI_NVLINK_RX, link))
            out.append(NvlinkReading(link, dev.link_states[link], _scaled(tx, KIB), _scaled(rx, KIB)))
        return tuple(out)

    # -- PCIe throughput: a 20 ms sampling call, used only where byte counters are missing ---------------
    @staticmethod
    def _pcie_fallback(dev: NvmlDevice) -> bool:
        return dev.support.get("pcie_bytes") in _SKIP and dev.support.get("pcie_throughput") not in _SKIP

    def _start_pcie_throughput(self, c: _Calls) -> tuple[concurrent.futures.Future, ...] | None:
        dev = c.dev
        if dev.pcie_pending is not None:  # the last pair is still stuck in the driver: do not pile up
            if not all(f.done() for f in dev.pcie_pending):
                return None
            dev.pcie_pending = None
        if dev.pcie_pool is None:
            dev.pcie_pool = _DaemonPool(f"gpumon-pcie-{dev.info.index}", 2)
        fn: Callable[..., int] = self.nv.nvmlDeviceGetPcieThroughput
        # tx and rx each sample a 20 ms window: run them side by side, and beside this GPU's other calls
        pair = (
            dev.pcie_pool.submit(fn, dev.handle, pynvml.NVML_PCIE_UTIL_TX_BYTES),
            dev.pcie_pool.submit(fn, dev.handle, pynvml.NVML_PCIE_UTIL_RX_BYTES),
        )
        dev.pcie_pending = pair
        return pair

    def _finish_pcie_throughput(
        self, c: _Calls, pair: tuple[concurrent.futures.Future, ...] | None, deadline: float
    ) -> tuple[float | None, float | None]:
        if pair is None:
            if c.dev.pcie_pending is not None:
                c.errors.append(
                    ReadError("nvmlDeviceGetPcieThroughput", "Timeout", "previous call still running")
                )
            return None, None
        rates: list[float | None] = []
        for fut in pair:
            try:
                kb_per_s = fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                c.errors.append(
                    ReadError("nvmlDeviceGetPcieThroughput", "Timeout", "past the sample deadline")
                )
                rates.append(None)
                continue
            except Exception as exc:
                c.failed("pcie_throughput", "nvmlDeviceGetPcieThroughput", exc)
                rates.append(None)
                continue
            c.ok += 1
            c.dev.set_support("pcie_throughput", Support.SUPPORTED)
            rates.append(kb_per_s * 1000.0)  # NVML reports KB/s
        if all(f.done() for f in pair):
            c.dev.pcie_pending = None
        return rates[0], rates[1]
