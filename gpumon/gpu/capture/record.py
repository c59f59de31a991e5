"""RecordingNvml: stands in for an NVML module (pynvml, or the simulator) and writes down every call made
through it: the op, its arguments, its answer or error, its latency and when it was made.

gpumon's NVML backend, event watcher and GPM reader run on it unchanged, so a capture holds exactly the calls
a daemon makes on that node, on its threads, in its order.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from gpumon.gpu.capture.codec import HANDLE_OPS, Refs, address, encode, raw
from gpumon.gpu.capture.keys import gpm_source
from gpumon.gpu.nvml.calls import error_kind


def _address(sample: Any) -> int:
    return address(sample) if isinstance(sample, ctypes._Pointer) else id(sample)


class RecordingNvml:
    def __init__(self, nv: Any, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self._nv = self.wrapped = nv
        self._clock = clock
        self._t0 = clock()
        self.refs = Refs()
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._samples: dict[int, dict[str, Any]] = {}  # GPM buffer → what it was last filled from

    def __getattr__(self, name: str) -> Any:
        try:
            attr = getattr(self._nv, name)
        except AttributeError:
            if name.startswith("nvml"):  # the binding lacks it: a fact about this node worth keeping
                self._append({"op": name, "args": [], "missing": True})
            raise
        if not name.startswith("nvml") or not callable(attr):
            return attr
        return functools.partial(self._call, name, attr)

    def _append(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.calls.append(entry)

    def _call(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        started = self._clock()
        entry: dict[str, Any] = {"t": round(started - self._t0, 6), "op": op}
        if op == "nvmlGpmMetricsGet":
            source = self._samples.get(_address(args[0].sample2), gpm_source(None, None))
            entry["args"] = [source]
        else:
            try:
                entry["args"] = [encode(a, self.refs) for a in args]
            except Exception as exc:
                entry["args"] = [{"repr": f"unrecordable arguments: {exc}"}]
        try:
            value = fn(*args)
        except Exception as exc:
            entry["latency_us"] = round((self._clock() - started) * 1e6, 1)
            entry["error"] = error_kind(exc)
            if isinstance(exc, pynvml.NVMLError):
                entry["code"] = exc.value
            else:
                entry["message"] = str(exc)
            self._append(entry)
            raise
        entry["latency_us"] = round((self._clock() - started) * 1e6, 1)
        if op in HANDLE_OPS:
            self.refs.add(value, op, args)
        if op == "nvmlGpmSampleGet":
            self._samples[_address(args[1])] = gpm_source(self.refs.name(args[0]), None)
        elif op == "nvmlGpmMigSampleGet":
            self._samples[_address(args[2])] = gpm_source(self.refs.name(args[0]), int(args[1]))
        try:
            entry["value"] = _metrics(args[0]) if op == "nvmlGpmMetricsGet" else encode(value, self.refs)
        except Exception as exc:  # a recording gap must never change what the daemon reads
            entry["value"] = {"repr": f"unrecordable {type(value).__name__}: {exc}"}
        self._append(entry)
        return value


def _metrics(request: Any) -> list[dict[str, Any]]:
    """A GPM metrics request's answers: NVML writes them into the request itself."""
    out = []
    for i in range(int(request.numMetrics)):
        m = request.metrics[i]
        out.append(
            {"metricId": raw(m, "metricId"), "nvmlReturn": raw(m, "nvmlReturn"), "value": raw(m, "value")}
        )
    return out
