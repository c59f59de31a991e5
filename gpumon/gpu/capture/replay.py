"""ReplayNvml: an NVML module that answers from a capture, so gpumon's NVML backend runs unchanged on what a
real node once answered.

Each call gets the next answer recorded for the same op and arguments, and once those run out, the last one
again: counters stand still rather than run backwards. Field values are answered field by field, so a request
shaped differently from the recorded ones still gets each field's recorded value. Events are delivered once,
in order; after them every wait times out. A call the capture never saw is NOT_SUPPORTED (its series absent,
logged once): the capture cannot say what the node would have answered.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pynvml

from gpumon.gpu import fields as field_codec
from gpumon.gpu.capture.codec import address, decode
from gpumon.gpu.capture.format import Capture
from gpumon.gpu.capture.keys import call_key, gpm_source

log = logging.getLogger("gpumon.replay")

FIELD_OP = "nvmlDeviceGetFieldValues"
WAIT_OP = "nvmlEventSetWait_v2"


class ReplayHandle:
    """A GPU, MIG device or event set of the captured node, by the name the capture gave it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<replayed {self.name}>"


class ReplayedException(Exception):
    """A failure the capture recorded that was not an NVML error (a broken library, say)."""


class _Handles(dict[str, Any]):
    def __missing__(self, name: str) -> ReplayHandle:
        handle = self[name] = ReplayHandle(name)
        return handle


class ReplayNvml:
    replayed = True  # how the backend tells: gpumon_build_info{backend="replay"}

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self._handles = _Handles()
        self._answers: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._fields: dict[tuple[str, int, int], list[dict[str, Any]]] = defaultdict(list)
        self._missing: set[str] = set()
        failed: dict[str, dict[str, Any]] = {}
        answered: set[str] = set()
        for entry in capture.calls:
            op = entry["op"]
            if entry.get("missing"):
                self._missing.add(op)
                continue
            if op == FIELD_OP:
                device = entry["args"][0].get("ref", "")
                if "value" not in entry:
                    failed[device] = entry
                    continue
                answered.add(device)
                for item in entry["value"]["items"]:
                    f = item["fields"]
                    self._fields[(device, f["fieldId"], f["scopeId"])].append(item)
                continue
            self._answers[call_key(op, entry["args"])].append(entry)
        # a GPU whose field-value calls all failed fails them again; one that failed now and then is
        # answered from its good calls
        for device, entry in failed.items():
            if device not in answered:
                self._answers[call_key(FIELD_OP, [{"ref": device}])].append(entry)
        self._position: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._unanswered: set[str] = set()
        self._buffers: dict[int, Any] = {}  # GPM sample buffers handed out, kept alive
        self._sources: dict[int, dict[str, Any]] = {}  # buffer → what it was last filled from

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml") or name in self._missing:
            raise AttributeError(name)
        special = _SPECIAL.get(name)
        if special is not None:
            return lambda *args: special(self, *args)
        return lambda *args: self._answer(name, args)

    # -- answers -----------------------------------------------------------------------------------------
    def _name(self, value: Any) -> Any:
        if isinstance(value, ReplayHandle):
            return {"ref": value.name}
        if isinstance(value, ctypes._SimpleCData):
            return value.value
        if isinstance(value, tuple):
            return {"tuple": [self._name(v) for v in value]}
        if isinstance(value, list):
            return [self._name(v) for v in value]
        if isinstance(value, ctypes._Pointer):
            return {"ref": "gpm"}  # a sample buffer: never part of a key
        return value

    def _next(self, key: str, *, consume: bool = False) -> dict[str, Any] | None:
        with self._lock:
            answers = self._answers.get(key)
            if not answers:
                return None
            i = self._position[key]
            if consume and i >= len(answers):
                return None
            self._position[key] = i + 1
            return answers[min(i, len(answers) - 1)]

    def _answer(self, op: str, args: tuple[Any, ...], *, consume: bool = False) -> Any:
        key = call_key(op, [self._name(a) for a in args])
        entry = self._next(key, consume=consume)
        if entry is None:
            if not consume:
                self._unrecorded(key)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._outcome(entry)

    def _outcome(self, entry: dict[str, Any]) -> Any:
        if "error" in entry:
            if "code" in entry:
                raise pynvml.NVMLError(entry["code"])
            raise ReplayedException(entry.get("message", entry["error"]))
        try:
            return decode(entry.get("value"), self._handles)
        except Exception as exc:  # a value the loader let through but ctypes refuses: one quantity's error
            log.debug("replay: cannot rebuild the answer of %s: %s", entry.get("op"), exc)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN) from None

    def _unrecorded(self, key: str) -> None:
        with self._lock:
            if key in self._unanswered:
                return
            self._unanswered.add(key)
        # debug: the quantity shows up absent in the sampler's summary; this names the call behind it
        log.debug("replay: the capture has no answer for %s; answering NOT_SUPPORTED", key)

    # -- calls that carry state of their own ---------------------------------------------------------------
    def _field_values(self, handle: Any, field_ids: list[Any]) -> Any:
        device = self._name(handle).get("ref", "") if isinstance(handle, ReplayHandle) else ""
        whole = self._next(call_key(FIELD_OP, [{"ref": device}]))
        if whole is not None:  # the capture saw the whole call fail on this GPU
            self._outcome(whole)
        wanted = field_codec.request(field_ids)
        out = (pynvml.c_nvmlFieldValue_t * len(wanted))()
        for i, (fid, scope) in enumerate(wanted):
            key = f"{device}:{fid}:{scope}"
            with self._lock:
                items = self._fields.get((device, fid, scope))
                pos = self._position[key]
                self._position[key] = pos + 1
            try:
                rebuilt = decode(items[min(pos, len(items) - 1)], self._handles) if items else None
            except Exception:  # this field alone is unreadable; the others are answered
                rebuilt = None
            if rebuilt is not None:
                out[i] = rebuilt
            else:
                out[i].fieldId, out[i].scopeId = fid, scope
                out[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return out

    def _event_wait(self, event_set: Any, timeout_ms: int) -> Any:
        key = call_key(WAIT_OP, [self._name(event_set), timeout_ms])
        entry = self._next(key, consume=True)
        if entry is not None and "error" not in entry:
            return self._outcome(entry)
        time.sleep(timeout_ms / 1000.0)  # nothing (more) happened on the captured node
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def _gpm_alloc(self) -> Any:
        self._answer("nvmlGpmSampleAlloc", ())
        buffer = pynvml.struct_c_nvmlGpmSample_t()
        pointer = ctypes.pointer(buffer)
        self._buffers[ctypes.addressof(buffer)] = buffer
        return pointer

    def _gpm_free(self, sample: Any) -> None:
        self._buffers.pop(address(sample), None)

    def _gpm_get(self, handle: Any, sample: Any) -> Any:
        self._answer("nvmlGpmSampleGet", (handle,))
        self._sources[address(sample)] = gpm_source(handle.name, None)
        return sample

    def _gpm_mig_get(self, handle: Any, instance: int, sample: Any) -> Any:
        self._answer("nvmlGpmMigSampleGet", (handle, instance))
        self._sources[address(sample)] = gpm_source(handle.name, int(instance))
        return sample

    def _gpm_metrics(self, request: Any) -> Any:
        source = self._sources.get(address(request.sample2))
        entry = self._next(call_key("nvmlGpmMetricsGet", [source or gpm_source(None, None)]))
        if entry is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        results = {m["metricId"]: m for m in self._outcome_raw(entry)}
        for i in range(int(request.numMetrics)):
            metric = request.metrics[i]
            got = results.get(metric.metricId)
            if got is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.nvmlReturn, metric.value = got["nvmlReturn"], got["value"]
        return request

    def _outcome_raw(self, entry: dict[str, Any]) -> list[dict[str, Any]]:
        if "error" in entry:
            self._outcome(entry)  # raises
        return list(entry["value"])


_SPECIAL: dict[str, Callable[..., Any]] = {
    FIELD_OP: ReplayNvml._field_values,
    WAIT_OP: ReplayNvml._event_wait,
    "nvmlGpmSampleAlloc": ReplayNvml._gpm_alloc,
    "nvmlGpmSampleFree": ReplayNvml._gpm_free,
    "nvmlGpmSampleGet": ReplayNvml._gpm_get,
    "nvmlGpmMigSampleGet": ReplayNvml._gpm_mig_get,
    "nvmlGpmMetricsGet": ReplayNvml._gpm_metrics,
}
