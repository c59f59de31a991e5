"""The host the GPUs sit in."""

from __future__ import annotations

from gpumon.metrics.registry import metric, section

section("Host")
HOST_CPU = metric(
    "gpumon_host_cpu_utilization_ratio",
    "gauge",
    "Host CPU busy fraction since the previous sweep, all cores.",
    (),
    "ratio",
    "psutil.cpu_percent",
)
HOST_CPUS = metric("gpumon_host_cpus", "gauge", "Logical CPUs on the host.", (), source="psutil.cpu_count")
HOST_MEM_TOTAL = metric(
    "gpumon_host_memory_total_bytes", "gauge", "Host memory installed.", (), "bytes", "psutil.virtual_memory"
)
HOST_MEM_AVAIL = metric(
    "gpumon_host_memory_available_bytes",
    "gauge",
    "Host memory available without swapping.",
    (),
    "bytes",
    "psutil.virtual_memory",
)
HOST_LOAD1 = metric("gpumon_host_load1", "gauge", "1-minute load average.", (), source="os.getloadavg")
HOST_LOAD5 = metric("gpumon_host_load5", "gauge", "5-minute load average.", (), source="os.getloadavg")
HOST_LOAD15 = metric("gpumon_host_load15", "gauge", "15-minute load average.", (), source="os.getloadavg")
