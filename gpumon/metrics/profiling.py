"""Profiling counters (Hopper+ GPM through NVML, or DCGM fields 1001-1012): what the SMs actually did."""

from __future__ import annotations

from gpumon.metrics.registry import GPU, Metric, metric, section

section("Profiling (GPM or DCGM)")
_SOURCE = "NVML GPM metrics (nvmlGpmMetricsGet) or DCGM field"
PROFILING_INFO = metric(
    "gpumon_gpu_profiling_info",
    "gauge",
    "Where this GPU's profiling counters come from: gpm (NVML, Hopper+) or dcgm.",
    (*GPU, "source"),
    source="nvmlGpmQueryDeviceSupport / DCGM host engine",
    detail="profiling-detail",
)


def _ratio(name: str, help_: str, gpm_id: int, dcgm_field: int, detail: str = "") -> Metric:
    return metric(
        name,
        "gauge",
        f"{help_}, averaged over the last interval (0-1).",
        unit="ratio",
        source=f"GPM metric {gpm_id} or DCGM field {dcgm_field}",
        detail=detail,
    )


def _rate(name: str, what: str, gpm_id: int, dcgm_field: int) -> Metric:
    return metric(
        name,
        "gauge",
        f"{what}, averaged over the last interval by the profiler (gpumon_gpu_pcie_* and "
        "gpumon_gpu_nvlink_* byte counters carry the same traffic by default).",
        unit="bytes/s",
        source=f"GPM metric {gpm_id} (MiB/s) or DCGM field {dcgm_field}",
        detail="profiling-detail",
    )


PROF_GR = _ratio(
    "gpumon_gpu_graphics_engine_active_ratio", "Time the graphics/compute engine was busy", 1, 1001
)
PROF_SM = _ratio(
    "gpumon_gpu_sm_active_ratio", "Time SMs had at least one warp resident, mean over SMs", 2, 1002
)
PROF_OCC = _ratio(
    "gpumon_gpu_sm_occupancy_ratio", "Resident warps as a share of the maximum, mean over SMs", 3, 1003
)
PROF_TENSOR = _ratio(
    "gpumon_gpu_tensor_active_ratio", "Time the tensor pipes were busy (any precision)", 5, 1004
)
PROF_DRAM = _ratio("gpumon_gpu_dram_active_ratio", "HBM bandwidth used as a share of peak", 10, 1005)
PROF_FP64 = _ratio(
    "gpumon_gpu_fp64_active_ratio", "Time the FP64 pipe was busy (non-tensor)", 11, 1006, "profiling-detail"
)
PROF_FP32 = _ratio(
    "gpumon_gpu_fp32_active_ratio", "Time the FP32 pipe was busy (non-tensor)", 12, 1007, "profiling-detail"
)
PROF_FP16 = _ratio(
    "gpumon_gpu_fp16_active_ratio", "Time the FP16 pipe was busy (non-tensor)", 13, 1008, "profiling-detail"
)
PROF_PCIE_TX = _rate("gpumon_gpu_profiling_pcie_transmit_bytes_per_second", "PCIe bytes sent", 20, 1009)
PROF_PCIE_RX = _rate("gpumon_gpu_profiling_pcie_receive_bytes_per_second", "PCIe bytes received", 21, 1010)
PROF_NVL_TX = _rate("gpumon_gpu_profiling_nvlink_transmit_bytes_per_second", "NVLink bytes sent", 61, 1011)
PROF_NVL_RX = _rate("gpumon_gpu_profiling_nvlink_receive_bytes_per_second", "NVLink bytes received", 60, 1012)

# metric → ProfilingReading attribute
PROFILING_FIELDS: tuple[tuple[Metric, str], ...] = (
    (PROF_GR, "graphics_engine_active_ratio"),
    (PROF_SM, "sm_active_ratio"),
    (PROF_OCC, "sm_occupancy_ratio"),
    (PROF_TENSOR, "tensor_active_ratio"),
    (PROF_DRAM, "dram_active_ratio"),
    (PROF_FP64, "fp64_active_ratio"),
    (PROF_FP32, "fp32_active_ratio"),
    (PROF_FP16, "fp16_active_ratio"),
    (PROF_PCIE_TX, "pcie_transmit_bytes_per_second"),
    (PROF_PCIE_RX, "pcie_receive_bytes_per_second"),
    (PROF_NVL_TX, "nvlink_transmit_bytes_per_second"),
    (PROF_NVL_RX, "nvlink_receive_bytes_per_second"),
)
