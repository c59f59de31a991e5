"""NvmlBackend: start NVML, find and identify GPUs, re-acquire lost ones, and read one GPU."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pynvml

from gpumon.gpu import fields as codec
from gpumon.gpu.backend import Device
from gpumon.gpu.dcgm import DcgmReadError, DcgmSource
from gpumon.gpu.nvml import fieldvalues, gpm, mig, pcie, processes
from gpumon.gpu.nvml.calls import DOWN_ERRORS, SKIP, Calls, error_kind, scaled
from gpumon.gpu.nvml.device import NvmlDevice
from gpumon.gpu.nvml.fieldvalues import (
    FI_MEMORY_TEMP,
    FI_NVLINK_COUNT,
    FI_PCIE_RX,
    FI_PCIE_TX,
    THROTTLE_FIELDS,
)
from gpumon.gpu.types import (
    BackendUnavailable,
    DeviceDown,
    DriverInfo,
    GpuInfo,
    GpuReading,
    ProfilingReading,
    ReadError,
    ReadResult,
    Support,
    has_video_encoders,
)

log = logging.getLogger("gpumon.nvml")

MHZ = 1e6


class NvmlBackend:
    """Reads GPUs through an nvidia-ml-py-shaped module: ``pynvml`` itself, or ``SimNvml``."""

    def __init__(
        self,
        nvml: ModuleType | Any | None = None,
        *,
        nvlink_state_every: int = 10,
        pcie_link_every: int = 10,
        details: frozenset[str] = frozenset(),
        gpm: bool = True,
        processes: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nv = nvml if nvml is not None else pynvml
        self.gpm = gpm  # read Hopper profiling counters through NVML GPM where the GPU has them
        self.profiler: DcgmSource | None = None  # when set, DCGM supplies profiling counters instead
        self.profiler_note = ""  # why DCGM is not in use, when it was tried
        self.clock = clock  # spaces GPM samples; tests pass a manual clock
        self.processes = processes  # list compute processes on each GPU
        # the simulator and the replayer mark themselves; real pynvml has no such attributes
        if getattr(self.nv, "simulated", False):
            self.name = "sim"
        elif getattr(self.nv, "replayed", False):
            self.name = "replay"
        else:
            self.name = "nvml"
        self.nvlink_state_every = max(1, nvlink_state_every)
        self.pcie_link_every = max(1, pcie_link_every)
        # opt-in detail (--collect) that costs NVML work: per-link traffic, process utilisation, P-state
        self.details = details
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
            kind = error_kind(exc)
            raise BackendUnavailable(f"NVML could not start: {exc} ({kind})", kind=kind) from exc
        except OSError as exc:  # a broken libnvidia-ml.so surfaces from ctypes, not as an NVMLError
            raise BackendUnavailable(f"NVML could not start: {exc}", kind="OSError") from exc
        self._initialized = True

    def _reinit(self) -> None:
        with self._lock:
            self.nv.nvmlInit()  # NVML counts initialisations: an extra one is harmless
            self._initialized = True

    def close(self) -> None:
        if self.profiler is not None:
            self.profiler.close()
        for dev in self._devices:
            if dev.pcie_pool is not None:
                dev.pcie_pool.shutdown()
                dev.pcie_pool = None
            if dev.current_op is None:  # a GPU stuck in a call keeps its buffers: NVML may be using them
                gpm.free(self.nv, dev.gpm)
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
                if not has_video_encoders(dev.info.name):
                    dev.set_support("encoder_utilization", Support.NOT_SUPPORTED)
                    log.debug("GPU %d (%s): an %s has no video encoders; encoder utilization is not exported",
                              index, uuid, dev.info.name)  # fmt: skip
                # learn which fields exist now, so the first read already takes every fallback it needs
                fieldvalues.read(Calls(self.nv, dev))
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
                if error_kind(exc) in DOWN_ERRORS:
                    raise
                return None

        pci = required("nvmlDeviceGetPciInfo")
        raw = optional("nvmlDeviceGetFieldValues", [FI_NVLINK_COUNT])
        links = 0
        if raw is not None:
            _, value = codec.decode(raw)[0]
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
            sm_clock_max_hz=scaled(optional("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM), MHZ),
            memory_clock_max_hz=scaled(optional("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_MEM), MHZ),
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
        device.link_state_failures = 0
        device.fields_version = -1
        device.mig_devices = None  # a reset may come with a new MIG layout
        device.mig_enabled = None
        device.pcie_link = None
        for stream in device.gpm.values():  # a reset GPU restarts its counters: no difference across it
            stream.previous_at = None

    # -- one read ----------------------------------------------------------------------------------------
    def read(self, device: Device, deadline: float) -> ReadResult:
        assert isinstance(device, NvmlDevice)
        dev, nv, h = device, self.nv, device.handle
        started = time.perf_counter()
        c = Calls(nv, dev)

        pcie_rates = pcie.start(c) if pcie.needed(dev) else None

        # first: the batch carries quantities that would otherwise need calls of their own
        fields = fieldvalues.read(c, per_link="nvlink-links" in self.details)
        power = self._folded(c, fields, "power", "nvmlDeviceGetPowerUsage")
        power_limit = self._folded(c, fields, "power_limit", "nvmlDeviceGetEnforcedPowerLimit")
        energy = self._folded(c, fields, "energy", "nvmlDeviceGetTotalEnergyConsumption")
        replays = self._folded(c, fields, "pcie_replays", "nvmlDeviceGetPcieReplayCounter")
        ecc = [*self._ecc(c, fields, "ecc"), *self._ecc(c, fields, "ecc_lifetime")]
        remap = self._folded(c, fields, "remapped_rows", "nvmlDeviceGetRemappedRows")
        if dev.info.nvlink_count:
            fieldvalues.link_states(c, fields, self.nvlink_state_every)
        # then what changes slowly or is averaged by the driver anyway: profiling (a difference of two
        # samples), processes, MIG, memory, video engines, the PCIe link
        profiling = self._profiling(c)
        procs = processes.read(c, "process-utilization" in self.details) if self.processes else None
        migs = mig.read(c, self.clock(), profiling=self.gpm and self.profiler is None)
        mem = self._memory(c)
        encoder = c.call("encoder_utilization", "nvmlDeviceGetEncoderUtilization", h)
        decoder = c.call("decoder_utilization", "nvmlDeviceGetDecoderUtilization", h)
        fan = c.call("fan", "nvmlDeviceGetFanSpeed", h)
        link_gen, link_width = self._pcie_link(c)
        pstate = (
            c.call("performance_state", "nvmlDeviceGetPerformanceState", h)
            if "device-state" in self.details
            else None
        )
        # last, just before the reading is published (the sampler publishes each GPU as soon as it is read):
        # the instantaneous gauges, so that they are as fresh as the read allows
        reasons = self._throttle_reasons(c)
        sm_clock = c.call("sm_clock", "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM)
        mem_clock = c.call("memory_clock", "nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM)
        temp = c.call("temperature", "nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        util = c.call("utilization", "nvmlDeviceGetUtilizationRates", h)
        pcie_tx_rate, pcie_rx_rate = pcie.finish(c, pcie_rates, deadline)
        dev.reads += 1

        if c.ok == 0 and c.errors:
            first = c.errors[0]
            raise DeviceDown(first.op, first.kind, "no quantity could be read")

        links = fieldvalues.nvlinks(dev, fields)
        nvl_tx, nvl_rx = fieldvalues.nvlink_totals(dev, fields, links)
        reading = GpuReading(
            timestamp=time.time(),
            duration_seconds=time.perf_counter() - started,
            utilization_ratio=None if util is None else util.gpu / 100.0,
            memory_controller_utilization_ratio=None if util is None else util.memory / 100.0,
            encoder_utilization_ratio=None if encoder is None else encoder[0] / 100.0,
            decoder_utilization_ratio=None if decoder is None else decoder[0] / 100.0,
            memory_total_bytes=None if mem is None else float(mem.total),
            memory_used_bytes=None if mem is None else float(mem.used),
            memory_free_bytes=None if mem is None else float(mem.free),
            memory_reserved_bytes=scaled(getattr(mem, "reserved", None), 1.0),
            power_watts=scaled(power, 1e-3),
            power_limit_watts=scaled(power_limit, 1e-3),
            energy_joules=scaled(energy, 1e-3),
            temperature_celsius=None if temp is None else float(temp),
            memory_temperature_celsius=fields.get((FI_MEMORY_TEMP, 0)),
            sm_clock_hz=scaled(sm_clock, MHZ),
            memory_clock_hz=scaled(mem_clock, MHZ),
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
            profiling=profiling,
            processes=procs,
            mig=migs,
        )
        return ReadResult(reading, tuple(c.errors))

    def _pcie_link(self, c: Calls) -> tuple[Any, Any]:
        """Current PCIe generation and width: a link retrains rarely (some boards at idle), so the two calls
        run on every ``pcie_link_every``-th read and the reads between repeat the last answer."""
        dev = c.dev
        if dev.pcie_link is None or None in dev.pcie_link or dev.reads % self.pcie_link_every == 0:
            dev.pcie_link = (
                c.call("pcie_link", "nvmlDeviceGetCurrPcieLinkGeneration", dev.handle),
                c.call("pcie_link", "nvmlDeviceGetCurrPcieLinkWidth", dev.handle),
            )
        return dev.pcie_link

    @staticmethod
    def _folded(c: Calls, fields: fieldvalues.Fields, quantity: str, op: str) -> Any:
        """From the batch where it carries the quantity; else from the quantity's own call."""
        value = fieldvalues.folded(c, fields, quantity)
        return c.call(quantity, op, c.dev.handle) if value is fieldvalues.UNFOLDED else value

    @staticmethod
    def _ecc(c: Calls, fields: fieldvalues.Fields, quantity: str) -> tuple[Any, Any]:
        """(corrected, uncorrected) volatile ("ecc") or lifetime ("ecc_lifetime") ECC error totals."""
        value = fieldvalues.folded(c, fields, quantity)
        if value is not fieldvalues.UNFOLDED:
            return value if value is not None else (None, None)
        counter = pynvml.NVML_VOLATILE_ECC if quantity == "ecc" else pynvml.NVML_AGGREGATE_ECC
        return tuple(  # type: ignore[return-value]
            c.call(quantity, "nvmlDeviceGetTotalEccErrors", c.dev.handle, err, counter)
            for err in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        )

    def _profiling(self, c: Calls) -> ProfilingReading | None:
        if self.profiler is not None:
            try:
                return self.profiler.read(c.dev.info.uuid)
            except DcgmReadError as exc:
                c.errors.append(ReadError("dcgm", "DcgmReadError", str(exc)))
                return None
        return gpm.read(c, self.clock()) if self.gpm else None

    @staticmethod
    def _newer_or_older(
        c: Calls, quantity: str, newer: tuple[str, str, tuple], older: tuple[str, tuple]
    ) -> Any:
        """Prefer a newer NVML call (its own capability key); where the driver or binding lacks it, the older
        call reads the same quantity."""
        dev = c.dev
        newer_key, newer_op, newer_args = newer
        if dev.support.get(newer_key) not in SKIP:
            value = c.call(newer_key, newer_op, dev.handle, *newer_args)
            if value is not None:
                if dev.support.get(quantity) is not Support.SUPPORTED:
                    dev.set_support(quantity, Support.SUPPORTED)
                return value
            if dev.support.get(newer_key) not in SKIP:
                return None  # a transient error, already counted
        older_op, older_args = older
        return c.call(quantity, older_op, dev.handle, *older_args)

    def _memory(self, c: Calls) -> Any:
        # memory info v2 adds "reserved"; v1 has total/used/free on drivers that predate it
        return self._newer_or_older(
            c,
            "memory",
            ("memory_reserved", "nvmlDeviceGetMemoryInfo", (pynvml.nvmlMemory_v2,)),
            ("nvmlDeviceGetMemoryInfo", ()),
        )

    def _throttle_reasons(self, c: Calls) -> int | None:
        # NVML renamed "throttle reasons" to "clocks event reasons" (driver 535); same bits
        return self._newer_or_older(
            c,
            "throttle_reasons",
            ("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", ()),
            ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
        )
