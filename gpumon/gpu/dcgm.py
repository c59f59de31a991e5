"""DcgmSource: profiling counters (DCGM fields 1001-1012) from NVIDIA DCGM, for GPUs where NVML GPM has none.

DCGM's Python bindings ship with the datacenter-gpu-manager package, not on PyPI, so they are imported only
when the source is opened, from the package's install directory. Without them, or without a usable host
engine, the source says why in ``reason`` and the daemon carries on with NVML alone.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from gpumon.gpu.types import ProfilingReading

log = logging.getLogger("gpumon.dcgm")

DEFAULT_BINDINGS_PATH = "/usr/local/dcgm/bindings/python3"
_MODULES = ("pydcgm", "dcgm_agent", "dcgm_fields", "dcgm_structs")

# DCGM field id -> ProfilingReading attribute. 1001-1008 are DCGM_FT_DOUBLE ratios of the sample interval
# (0-1); 1009-1012 are DCGM_FT_INT64 rates in bytes per second, whatever their *_BYTES names suggest.
FIELDS: tuple[tuple[int, str], ...] = (
    (1001, "graphics_engine_active_ratio"),  # DCGM_FI_PROF_GR_ENGINE_ACTIVE
    (1002, "sm_active_ratio"),  # DCGM_FI_PROF_SM_ACTIVE
    (1003, "sm_occupancy_ratio"),  # DCGM_FI_PROF_SM_OCCUPANCY
    (1004, "tensor_active_ratio"),  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    (1005, "dram_active_ratio"),  # DCGM_FI_PROF_DRAM_ACTIVE
    (1006, "fp64_active_ratio"),  # DCGM_FI_PROF_PIPE_FP64_ACTIVE
    (1007, "fp32_active_ratio"),  # DCGM_FI_PROF_PIPE_FP32_ACTIVE
    (1008, "fp16_active_ratio"),  # DCGM_FI_PROF_PIPE_FP16_ACTIVE
    (1009, "pcie_transmit_bytes_per_second"),  # DCGM_FI_PROF_PCIE_TX_BYTES
    (1010, "pcie_receive_bytes_per_second"),  # DCGM_FI_PROF_PCIE_RX_BYTES
    (1011, "nvlink_transmit_bytes_per_second"),  # DCGM_FI_PROF_NVLINK_TX_BYTES
    (1012, "nvlink_receive_bytes_per_second"),  # DCGM_FI_PROF_NVLINK_RX_BYTES
)

# DCGM reports "no data" in-band (dcgmvalue.py): anything at or above these is a blank, never a reading.
INT64_BLANK = 0x7FFFFFFFFFFFFFF0
FP64_BLANK = 140737488355328.0  # 2 ** 47

# The failures an operator can act on; `gpumon doctor` shows the hint with the reason.
_HINTS = {
    "DCGM_ST_CONNECTION_NOT_VALID": "is nv-hostengine running and reachable?",
    "DCGM_ST_INIT_ERROR": "could not start the embedded host engine; run nv-hostengine and give its address",
    "DCGM_ST_PROFILING_NOT_SUPPORTED": "these GPUs have no DCGM profiling metrics",
    "DCGM_ST_MODULE_NOT_LOADED": "the host engine's profiling module is not loaded",
    "DCGM_ST_REQUIRES_ROOT": "profiling needs the host engine to run as root or with CAP_SYS_ADMIN",
    "DCGM_ST_NO_PERMISSION": "profiling needs the host engine to run as root or with CAP_SYS_ADMIN",
}
_GPM_FALLBACK = "profiling counters come from NVML GPM where supported"


class DcgmReadError(Exception):
    """Reading the latest DCGM values failed; the caller counts it and tries again at the next sample."""


class _Unusable(Exception):
    """DCGM answered, but there is nothing of ours to watch."""


def _uuid_key(uuid: Any) -> str:
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return text.strip().lower()


def _number(series: Any) -> float | None:
    """The newest value of one field's time series, or None for a missing or blank one."""
    if not series:
        return None
    latest = series[-1]
    value = latest.value
    if latest.isBlank or value is None:
        return None
    if isinstance(value, int):
        return None if value >= INT64_BLANK else float(value)
    if isinstance(value, float):
        return None if value >= FP64_BLANK else value
    return None


class DcgmSource:
    """Watches fields 1001-1012 on the sampled GPUs through DCGM and hands out the latest values."""

    name = "dcgm"

    def __init__(
        self, address: str | None = None, *, update_interval: float = 1.0, bindings_path: str | None = None
    ) -> None:
        if update_interval <= 0:
            raise ValueError("update_interval must be positive")
        self.address = address  # None: a host engine embedded in this process
        self.update_interval = update_interval
        self.bindings_path = bindings_path or DEFAULT_BINDINGS_PATH
        self.available = False
        self.reason = "not opened"
        self._lock = threading.Lock()
        self._pydcgm: Any = None
        self._agent: Any = None
        self._fields: Any = None
        self._structs: Any = None
        self._handle: Any = None
        self._group: Any = None
        self._field_group: Any = None
        self._watching = False
        self._gpu_ids: dict[str, int] = {}
        self._latest: dict[int, Any] | None = None
        self._served: set[int] = set()

    # -- lifecycle ---------------------------------------------------------------------------------------
    def open(self, gpu_uuids: Sequence[str]) -> bool:
        """Connect and start watching; False (with ``reason`` set, logged once) when DCGM cannot serve us."""
        with self._lock:
            self._release()
            self.available = False
            if not self._import():
                return False
            try:
                self._connect(gpu_uuids)
            except Exception as exc:  # an optional source must not stop the daemon, whatever DCGM throws
                self._release()
                if self._code_is(exc, "DCGM_ST_LIBRARY_NOT_FOUND"):
                    self.reason = f"DCGM library libdcgm.so.4 not found ({exc})"
                    log.info("%s; %s", self.reason, _GPM_FALLBACK)
                else:
                    self.reason = self._describe(exc)
                    log.warning("DCGM profiling counters unavailable: %s", self.reason)
                return False
            self.available = True
            self.reason = ""
        log.info("DCGM profiling counters from %s for %d GPU(s)", self._where(), len(self._gpu_ids))
        return True

    def close(self) -> None:
        """Unwatch, delete what we created in the host engine and let go of it. Safe to call at any time."""
        with self._lock:
            was_open = self.available
            self._release()
            self.available = False
            if was_open:
                self.reason = "closed"

    def _import(self) -> bool:
        path = self.bindings_path
        if os.path.isdir(path) and path not in sys.path:
            # appended, not prepended: the bindings directory has generic top-level names (common, ...)
            sys.path.append(path)
        try:
            mods = [importlib.import_module(m) for m in _MODULES]
        except ImportError as exc:
            self.reason = f"DCGM Python bindings not found ({exc}; looked on sys.path and in {path})"
            log.info("%s; %s", self.reason, _GPM_FALLBACK)
            return False
        self._pydcgm, self._agent, self._fields, self._structs = mods
        return True

    def _connect(self, gpu_uuids: Sequence[str]) -> None:
        pydcgm, agent, structs = self._pydcgm, self._agent, self._structs
        self._handle = pydcgm.DcgmHandle(ipAddress=self.address, opMode=structs.DCGM_OPERATION_MODE_AUTO)
        raw = self._handle.handle
        known: dict[str, int] = {}
        for gpu_id in agent.dcgmGetAllSupportedDevices(raw):
            known[_uuid_key(agent.dcgmGetDeviceAttributes(raw, gpu_id).identifiers.uuid)] = int(gpu_id)
        self._gpu_ids = {_uuid_key(u): known[_uuid_key(u)] for u in gpu_uuids if _uuid_key(u) in known}
        if not self._gpu_ids:
            raise _Unusable(f"none of the {len(gpu_uuids)} GPU(s) is among the {len(known)} DCGM supports")
        # field-group names must be unique in a host engine, which other clients and sources may share
        tag = f"gpumon-{os.getpid()}-{id(self):x}"
        self._group = pydcgm.DcgmGroup(self._handle, groupName=tag, groupType=structs.DCGM_GROUP_EMPTY)
        for gpu_id in self._gpu_ids.values():
            self._group.AddGpu(gpu_id)
        self._field_group = pydcgm.DcgmFieldGroup(
            self._handle, name=f"{tag}-profiling", fieldIds=[f for f, _ in FIELDS]
        )
        # keep only what one read needs: the newest sample, and one spare while the next one lands
        update_usec = max(1, int(self.update_interval * 1_000_000))
        self._group.samples.WatchFields(self._field_group, update_usec, max(5.0, 3 * self.update_interval), 2)
        self._watching = True
        # one update cycle now, waited for, so the first read finds samples (DcgmReader does the same)
        agent.dcgmUpdateAllFields(raw, 1)

    def _release(self) -> None:
        group, field_group, handle, watching = self._group, self._field_group, self._handle, self._watching
        self._group = self._field_group = self._handle = None
        self._watching = False
        self._gpu_ids = {}
        self._latest = None
        self._served = set()
        # the reverse of creation, so nothing goes while something else in the host engine still uses it
        if watching:
            _quietly("UnwatchFields", lambda: group.samples.UnwatchFields(field_group))
        if field_group is not None:
            _quietly("DcgmFieldGroup.Delete", field_group.Delete)
        if group is not None:
            _quietly("DcgmGroup.Delete", group.Delete)
        if handle is not None and not _quietly("DcgmHandle.Shutdown", handle.Shutdown):
            # else the bindings' DcgmHandle.__del__ retries the shutdown when collected and prints its failure
            handle._handleCreated = False

    def _where(self) -> str:
        return f"nv-hostengine at {self.address}" if self.address else "the embedded DCGM host engine"

    def _code_is(self, exc: BaseException, name: str) -> bool:
        return getattr(exc, "value", None) == getattr(self._structs, name, object())

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, _Unusable):
            return f"{self._where()}: {exc}"
        hint = next((h for name, h in _HINTS.items() if self._code_is(exc, name)), "")
        return f"{self._where()}: {exc} ({type(exc).__name__}{'; ' + hint if hint else ''})"

    # -- reading -----------------------------------------------------------------------------------------
    def read(self, uuid: str) -> ProfilingReading | None:
        """The latest values for one GPU; None for a GPU we do not watch. Raises DcgmReadError."""
        with self._lock:
            gpu_id = self._gpu_ids.get(_uuid_key(uuid))
            if gpu_id is None or self._group is None:
                return None
            # one GetLatest_v2 answers for every GPU: a sweep reuses it until a GPU comes round again
            if self._latest is None or gpu_id in self._served:
                self._latest = None  # a failed fetch must not leave the last sweep's values to serve again
                self._latest = self._fetch()
                self._served = set()
            self._served.add(gpu_id)
            per_field = self._latest.get(gpu_id, {})
        values: dict[str, Any] = {attr: _number(per_field.get(field_id)) for field_id, attr in FIELDS}
        return ProfilingReading(source=self.name, **values)

    def _fetch(self) -> dict[int, Any]:
        try:
            collection = self._group.samples.GetLatest_v2(self._field_group)
        except Exception as exc:  # mostly DCGMError, but the bindings' value helpers raise plain Exception
            raise DcgmReadError(f"GetLatest_v2: {exc} ({type(exc).__name__})") from exc
        by_gpu: dict[int, Any] = collection.values.get(self._fields.DCGM_FE_GPU, {})
        return by_gpu


def _quietly(what: str, call: Callable[[], object]) -> bool:
    try:
        call()
    except Exception:  # closing must never raise; the host engine drops our objects when we disconnect
        log.debug("DCGM %s failed while closing", what, exc_info=True)
        return False
    return True
