"""Compute processes on each GPU and who owns them (container, Kubernetes pod, Slurm job, user)."""

from __future__ import annotations

from gpumon.metrics.registry import GPU, metric, section

PROC = (*GPU, "pid")

section("Processes and owners")
GPU_PROCESSES = metric(
    "gpumon_gpu_processes",
    "gauge",
    "Compute processes running on the GPU.",
    source="nvmlDeviceGetComputeRunningProcesses",
)
PROCESS_INFO = metric(
    "gpumon_process_info",
    "gauge",
    "A compute process on a GPU and its owner; join on (uuid, pid). Series of processes that ended "
    "disappear at the next sweep.",
    (
        *PROC,
        "name",
        "user",
        "container_id",
        "pod_uid",
        "namespace",
        "pod",
        "container",
        "slurm_job_id",
        "gpu_instance",
        "compute_instance",
    ),
    source="nvmlDeviceGetComputeRunningProcesses, /proc/PID/{comm,status,cgroup,environ}, "
    "kubelet pod-resources",
)
PROCESS_MEMORY = metric(
    "gpumon_process_memory_used_bytes",
    "gauge",
    "GPU memory the process holds on this GPU.",
    PROC,
    "bytes",
    source="nvmlDeviceGetComputeRunningProcesses .usedGpuMemory",
)
PROCESS_SM = metric(
    "gpumon_process_sm_utilization_ratio",
    "gauge",
    "Share of time the process had kernels running, mean of the driver samples since the previous sweep "
    "(absent: no kernel ran).",
    PROC,
    "ratio",
    source="nvmlDeviceGetProcessUtilization .smUtil",
    detail="process-utilization",
)
PROCESS_MEM_UTIL = metric(
    "gpumon_process_memory_utilization_ratio",
    "gauge",
    "Share of time the process was reading or writing memory, mean of the samples since the previous sweep.",
    PROC,
    "ratio",
    source="nvmlDeviceGetProcessUtilization .memUtil",
    detail="process-utilization",
)
PROCESS_LAST_SEEN = metric(
    "gpumon_process_last_sample_timestamp_seconds",
    "gauge",
    "Unix time of the newest utilization sample the driver kept for the process.",
    PROC,
    "seconds",
    source="nvmlDeviceGetProcessUtilization .timeStamp",
    detail="process-utilization",
)
GPU_OWNER = metric(
    "gpumon_gpu_owner_info",
    "gauge",
    "Who the GPU belongs to now: the pod the kubelet allocated it to and/or the one Slurm job running on it.",
    (*GPU, "namespace", "pod", "container", "slurm_job_id"),
    source="kubelet pod-resources List, /proc/PID/cgroup",
)
