"""MIG devices: which exist, and per GPU instance their memory and, with GPM, their activity. Memory and
activity belong to the GPU instance: compute instances that share one would otherwise each repeat them, and a
sum() over them would count the same bytes twice."""

from __future__ import annotations

from gpumon.metrics.registry import GPU, Metric, metric, section

MIG = (*GPU, "gpu_instance", "compute_instance")
GI = (*GPU, "gpu_instance")

section("MIG")
MIG_INFO = metric(
    "gpumon_mig_info",
    "gauge",
    "A MIG device of a GPU in MIG mode: its UUID (as the kubelet and CUDA_VISIBLE_DEVICES name it) "
    "and profile.",
    (*MIG, "mig_uuid", "profile"),
    source="nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetUUID, nvmlDeviceGetName",
)
MIG_MEM_TOTAL = metric(
    "gpumon_mig_memory_total_bytes",
    "gauge",
    "Memory of the GPU instance; its compute instances share it, so it is one series per GPU instance.",
    GI,
    "bytes",
    source="nvmlDeviceGetMemoryInfo (MIG handle)",
)
MIG_MEM_USED = metric(
    "gpumon_mig_memory_used_bytes",
    "gauge",
    "Memory in use in the GPU instance, by all of its compute instances.",
    GI,
    "bytes",
    source="nvmlDeviceGetMemoryInfo (MIG handle)",
)


def _gi_ratio(name: str, help_: str, gpm_id: int) -> Metric:
    return metric(
        name,
        "gauge",
        f"{help_} in this GPU instance, averaged over the last interval (0-1).",
        GI,
        "ratio",
        source=f"nvmlGpmMigSampleGet, GPM metric {gpm_id}",
    )


MIG_GR = _gi_ratio("gpumon_mig_graphics_engine_active_ratio", "Time the graphics/compute engine was busy", 1)
MIG_SM = _gi_ratio("gpumon_mig_sm_active_ratio", "Time SMs had at least one warp resident", 2)
MIG_TENSOR = _gi_ratio("gpumon_mig_tensor_active_ratio", "Time the tensor pipes were busy", 5)
MIG_DRAM = _gi_ratio("gpumon_mig_dram_active_ratio", "HBM bandwidth used as a share of peak", 10)

# metric → ProfilingReading attribute
MIG_PROFILING_FIELDS: tuple[tuple[Metric, str], ...] = (
    (MIG_GR, "graphics_engine_active_ratio"),
    (MIG_SM, "sm_active_ratio"),
    (MIG_TENSOR, "tensor_active_ratio"),
    (MIG_DRAM, "dram_active_ratio"),
)
