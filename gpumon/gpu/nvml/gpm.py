"""Hopper+ profiling counters through NVML GPM, without DCGM and without SYS_ADMIN.

GPM works on pairs of samples: each read fills one sample buffer and differences it against the previous
one (``nvmlGpmMetricsGet``), so the metrics are averages over the sampling interval. NVML wants samples at
least 100 ms apart; a read that comes sooner reuses the last result. Each GPU (or MIG GPU instance) keeps
its own pair of buffers for as long as gpumon runs.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import pynvml

from gpumon.gpu.nvml.calls import SKIP, Calls
from gpumon.gpu.nvml.device import Stream
from gpumon.gpu.types import ProfilingReading, Support

MIN_GAP = 0.1  # seconds between the two samples of one difference, as NVML requires
MiB = 1024.0 * 1024.0
PERCENT = 0.01

# (GPM metric id, ProfilingReading field, factor to base units)
METRICS: tuple[tuple[int, str, float], ...] = (
    (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, "graphics_engine_active_ratio", PERCENT),
    (pynvml.NVML_GPM_METRIC_SM_UTIL, "sm_active_ratio", PERCENT),
    (pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, "sm_occupancy_ratio", PERCENT),
    (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "tensor_active_ratio", PERCENT),
    (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, "dram_active_ratio", PERCENT),
    (pynvml.NVML_GPM_METRIC_FP64_UTIL, "fp64_active_ratio", PERCENT),
    (pynvml.NVML_GPM_METRIC_FP32_UTIL, "fp32_active_ratio", PERCENT),
    (pynvml.NVML_GPM_METRIC_FP16_UTIL, "fp16_active_ratio", PERCENT),
    (pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, "pcie_transmit_bytes_per_second", MiB),
    (pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, "pcie_receive_bytes_per_second", MiB),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, "nvlink_transmit_bytes_per_second", MiB),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, "nvlink_receive_bytes_per_second", MiB),
)


class _Metric(ctypes.Structure):
    """``c_nvmlGpmMetric_t``'s layout without nvidia-ml-py's ``__getattribute__`` hook, which costs a few
    microseconds per field read: reading 12 results through it was most of GPM's CPU in gpumon."""

    _fields_ = pynvml.c_nvmlGpmMetric_t._fields_


def supported(c: Calls) -> bool:
    """Ask NVML once whether this GPU does GPM; remember the answer as the ``gpm`` capability."""
    dev = c.dev
    state = dev.support.get("gpm")
    if state in SKIP:
        return False
    if state is Support.SUPPORTED:
        return True
    answer = c.call("gpm", "nvmlGpmQueryDeviceSupport", dev.handle)
    if answer is None:
        return False
    if not answer.isSupportedDevice:
        c.absent("gpm", "nvmlGpmQueryDeviceSupport", Support.NOT_SUPPORTED)
        return False
    return True


def read(c: Calls, now: float, instance: int | None = None) -> ProfilingReading | None:
    """Profiling over the time since the previous read of this GPU (or of GPU instance ``instance``)."""
    dev = c.dev
    if not supported(c):
        return None
    stream = dev.gpm.get(instance)
    if stream is None:
        stream = _allocate(c)
        if stream is None:
            return None
        dev.gpm[instance] = stream
    if stream.previous_at is not None and now - stream.previous_at < MIN_GAP:
        return stream.last
    if instance is None:
        filled = c.call("gpm", "nvmlGpmSampleGet", dev.handle, stream.current)
    else:
        filled = c.call("gpm", "nvmlGpmMigSampleGet", dev.handle, instance, stream.current)
    if filled is None:
        stream.previous_at = None  # a gap: the next good sample starts a fresh difference
        return None
    first = stream.previous_at is None  # nothing to difference against yet
    if not first:
        stream.last = _difference(c, stream, older=stream.previous, newer=stream.current)
    stream.previous, stream.current = stream.current, stream.previous  # the newer one is kept
    stream.previous_at = now
    return None if first else stream.last


def _allocate(c: Calls) -> Stream | None:
    first = c.call("gpm", "nvmlGpmSampleAlloc")
    second = c.call("gpm", "nvmlGpmSampleAlloc") if first is not None else None
    if second is None:
        if first is not None:
            c.call("gpm", "nvmlGpmSampleFree", first)
        return None
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(METRICS)
    for i, (metric_id, _, _) in enumerate(METRICS):
        request.metrics[i].metricId = metric_id
    offset = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
    results = (_Metric * len(METRICS)).from_address(ctypes.addressof(request) + offset)
    return Stream(first, second, request=request, results=results)


def _difference(c: Calls, stream: Stream, *, older: Any, newer: Any) -> ProfilingReading | None:
    request = stream.request
    request.sample1, request.sample2 = older, newer
    if c.call("gpm", "nvmlGpmMetricsGet", request) is None:
        return None
    values: dict[str, float] = {}
    for metric, (_, name, factor) in zip(stream.results, METRICS, strict=True):
        if metric.nvmlReturn != pynvml.NVML_SUCCESS:
            continue  # this metric is not available on this GPU: absent, not zero
        value = max(0.0, float(metric.value)) * factor
        values[name] = min(1.0, value) if factor == PERCENT else value  # counters round past 100 %
    return ProfilingReading("gpm", **values)


def free(nv: Any, streams: dict[int | None, Stream]) -> None:
    """Give the sample buffers back (on shutdown and when a GPU is re-acquired)."""
    for stream in streams.values():
        for sample in (stream.previous, stream.current):
            # NVML may already be gone: the process is ending or the buffers died with the driver
            with contextlib.suppress(pynvml.NVMLError):
                nv.nvmlGpmSampleFree(sample)
    streams.clear()
