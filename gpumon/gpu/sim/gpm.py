"""GPU performance monitoring (nvmlGpm*) for the simulator, from Hopper on as on real boards.

A GPM sample is an opaque buffer that ``nvmlGpmSampleGet`` fills with the GPU's cumulative counters;
``nvmlGpmMetricsGet`` turns two samples into rates over the time between them. Here a sample records the
simulated GPU's cumulative activity (ratio-seconds per unit) and traffic, so metrics are true averages over
the interval, in GPM's units: percent 0-100 and MiB/s.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pynvml

from gpumon.gpu.sim.catalog import MiB

if TYPE_CHECKING:
    from gpumon.gpu.sim.device import SimGpu

# GPM metric id → the simulated activity unit it averages (percent of the interval)
_ACTIVITY = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: "graphics",
    pynvml.NVML_GPM_METRIC_SM_UTIL: "sm",
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: "occupancy",
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor",
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram",
    pynvml.NVML_GPM_METRIC_FP64_UTIL: "fp64",
    pynvml.NVML_GPM_METRIC_FP32_UTIL: "fp32",
    pynvml.NVML_GPM_METRIC_FP16_UTIL: "fp16",
}
# GPM metric id → the cumulative byte counter whose rate it is (MiB/s)
_TRAFFIC = {
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx",
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx",
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx",
}


class _Metric(ctypes.Structure):
    """``c_nvmlGpmMetric_t`` without nvidia-ml-py's slow ``__getattribute__`` hook (same memory)."""

    _fields_ = pynvml.c_nvmlGpmMetric_t._fields_


@dataclass
class _Sample:
    gpu: int | None = None  # None until nvmlGpmSampleGet fills it
    gpu_instance: int | None = None
    t: float = 0.0
    activity: dict[str, float] | None = None
    traffic: dict[str, float] | None = None


class SimGpm:
    """The GPM half of SimNvml."""

    gpus: list[SimGpu]

    if TYPE_CHECKING:

        def _enter(self, op: str, gpu: SimGpu | None = None) -> None: ...
        def _gpu(self, handle: Any, op: str) -> SimGpu: ...
        def now(self) -> float: ...
        def _mig_share(self, gpu: SimGpu, instance: int) -> float: ...  # SimMig

    def _gpm_init(self) -> None:
        self._gpm_samples: dict[int, _Sample] = {}  # buffer address → contents
        self._gpm_buffers: list[Any] = []  # keeps the ctypes buffers alive while allocated

    def nvmlGpmQueryDeviceSupport(self, device: SimGpu) -> Any:
        gpu = self._gpu(device, "nvmlGpmQueryDeviceSupport")
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if gpu.model.gpm else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buffer = pynvml.struct_c_nvmlGpmSample_t()
        self._gpm_buffers.append(buffer)
        self._gpm_samples[ctypes.addressof(buffer)] = _Sample()
        return ctypes.pointer(buffer)

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        address = _address(gpmSample)
        if self._gpm_samples.pop(address, None) is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._gpm_buffers = [b for b in self._gpm_buffers if ctypes.addressof(b) != address]

    def nvmlGpmSampleGet(self, device: SimGpu, gpmSample: Any) -> Any:
        gpu = self._gpu(device, "nvmlGpmSampleGet")
        return self._fill(gpu, None, gpmSample)

    def nvmlGpmMigSampleGet(self, device: SimGpu, gpuInstanceId: int, gpmSample: Any) -> Any:
        gpu = self._gpu(device, "nvmlGpmMigSampleGet")
        return self._fill(gpu, gpuInstanceId, gpmSample)

    def _fill(self, gpu: SimGpu, instance: int | None, gpm_sample: Any) -> Any:
        if not gpu.model.gpm:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        sample = self._gpm_samples.get(_address(gpm_sample))
        if sample is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        s = gpu.state
        share = 1.0 if instance is None else self._mig_share(gpu, instance)
        sample.gpu, sample.gpu_instance, sample.t = gpu.index, instance, self.now()
        sample.activity = {unit: seconds * share for unit, seconds in s.activity.items()}
        sample.traffic = {
            "pcie_tx": s.pcie_tx_bytes * share,
            "pcie_rx": s.pcie_rx_bytes * share,
            "nvlink_tx": sum(s.nvlink_tx) * share,
            "nvlink_rx": sum(s.nvlink_rx) * share,
        }
        return gpm_sample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self._gpm_samples.get(_address(metricsGet.sample1))
        second = self._gpm_samples.get(_address(metricsGet.sample2))
        if first is None or second is None or first.activity is None or second.activity is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if first.gpu != second.gpu or first.gpu_instance != second.gpu_instance:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        dt = second.t - first.t
        assert first.traffic is not None and second.traffic is not None
        offset = pynvml.c_nvmlGpmMetricsGet_t.metrics.offset
        n = metricsGet.numMetrics
        for metric in (_Metric * n).from_address(ctypes.addressof(metricsGet) + offset):
            fid = metric.metricId
            if dt <= 0:
                metric.nvmlReturn, metric.value = pynvml.NVML_ERROR_INVALID_ARGUMENT, 0.0
            elif fid in _ACTIVITY:
                unit = _ACTIVITY[fid]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = 100.0 * (second.activity[unit] - first.activity[unit]) / dt
            elif fid in _TRAFFIC:
                key = _TRAFFIC[fid]
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = (second.traffic[key] - first.traffic[key]) / dt / MiB
            else:
                metric.nvmlReturn, metric.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
        return metricsGet


def _address(sample: Any) -> int:
    try:
        return ctypes.addressof(sample.contents)
    except (AttributeError, ValueError, TypeError):  # not a sample pointer, or a NULL one
        return 0
