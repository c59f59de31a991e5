"""Every metric gpumon exposes: name, type, help, labels, unit and source, defined here and nowhere else.

The collector, the docs (``docs/metrics.md``, rendered by ``python -m gpumon.metrics``) and the tests all
read this table, so a rename cannot silently break one of them.

Label policy: every per-GPU series carries ``gpu`` (the NVML index, for humans) and ``uuid`` (stable across
reboots, for joins). Static facts (model name, PCI bus id, serial, …) live only in ``gpumon_gpu_info``; join
them in with ``* on(uuid) group_left(name) gpumon_gpu_info``. Keeping them off the value series keeps
``sum()`` and ``avg()`` over a node meaningful and the series count flat.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU = ("gpu", "uuid")


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...]
    unit: str
    section: str
    source: str = ""
    field: str | None = None  # the GpuReading attribute, for plain per-GPU scalars


REGISTRY: list[Metric] = []
_section = ""


def _m(
    name: str,
    type_: str,
    help_: str,
    labels: tuple[str, ...] = GPU,
    unit: str = "",
    source: str = "",
    field: str | None = None,
) -> Metric:
    metric = Metric(name, type_, help_, labels, unit, _section, source, field)
    REGISTRY.append(metric)
    return metric


# --------------------------------------------------------------------------------------------------------
_section = "Exporter"
BUILD_INFO = _m(
    "gpumon_build_info",
    "gauge",
    "gpumon version and the GPU backend in use (backend sim: simulated GPUs).",
    ("version", "python_version", "backend"),
    source="constant 1",
)
DRIVER_INFO = _m(
    "gpumon_driver_info",
    "gauge",
    "NVIDIA driver, CUDA driver API and NVML versions.",
    ("driver_version", "cuda_driver_version", "nvml_version"),
    source="nvmlSystemGetDriverVersion, nvmlSystemGetCudaDriverVersion, nvmlSystemGetNVMLVersion",
)
DEVICE_COUNT = _m(
    "gpumon_nvml_devices",
    "gauge",
    "GPUs the driver reports, whether or not gpumon could identify them (compare with count(gpumon_gpu_up)).",
    (),
    source="nvmlDeviceGetCount",
)
SAMPLE_INTERVAL = _m(
    "gpumon_sample_interval_seconds", "gauge", "Configured time between sampling sweeps.", (), "seconds"
)
LAST_SAMPLE = _m(
    "gpumon_last_sample_timestamp_seconds",
    "gauge",
    "Unix time the latest sampling sweep finished.",
    (),
    "seconds",
)
SAMPLES = _m("gpumon_samples_total", "counter", "Sampling sweeps completed since start.", ())
COLLECTOR_SUCCESS = _m(
    "gpumon_collector_success",
    "gauge",
    "Whether the collector's last run succeeded (per-GPU health is in gpumon_gpu_up).",
    ("collector",),
)
COLLECTOR_DURATION = _m(
    "gpumon_collector_duration_seconds",
    "gauge",
    "Wall time of the collector's last run (for gpu: all GPUs in parallel, up to the deadline).",
    ("collector",),
    "seconds",
)
ERRORS = _m(
    "gpumon_errors_total",
    "counter",
    "Failed operations by GPU, NVML call and error kind "
    "(an NVML error name, deadline_exceeded for a call that hung past its deadline, or exception).",
    ("gpu", "uuid", "op", "error"),
)

# --------------------------------------------------------------------------------------------------------
_section = "GPU identity and health"
GPU_INFO = _m(
    "gpumon_gpu_info",
    "gauge",
    "Static facts about a GPU; join on uuid.",
    ("gpu", "uuid", "name", "pci_bus_id", "serial", "board_part_number", "vbios_version"),
    source="nvmlDeviceGetName, nvmlDeviceGetPciInfo, nvmlDeviceGetSerial, "
    "nvmlDeviceGetBoardPartNumber, nvmlDeviceGetVbiosVersion",
)
GPU_UP = _m(
    "gpumon_gpu_up",
    "gauge",
    "1 if the GPU answered in the latest sweep, 0 if it is lost, its driver "
    "is gone or a call hung past the deadline.",
    source="sampler",
)
GPU_SAMPLE_DURATION = _m(
    "gpumon_gpu_sample_duration_seconds",
    "gauge",
    "Time spent reading this GPU in the latest sweep.",
    unit="seconds",
    source="sampler",
)
GPU_LAST_SAMPLE = _m(
    "gpumon_gpu_last_sample_timestamp_seconds",
    "gauge",
    "Unix time of the last successful read of this GPU.",
    unit="seconds",
    source="sampler",
)
PERSISTENCE = _m(
    "gpumon_gpu_persistence_mode",
    "gauge",
    "1 if persistence mode is on (without it NVML "
    "initialisation takes seconds and the first sample is late).",
    source="nvmlDeviceGetPersistenceMode",
)

# --------------------------------------------------------------------------------------------------------
_section = "Utilisation"
UTIL = _m(
    "gpumon_gpu_utilization_ratio",
    "gauge",
    "Fraction of the driver's last sample window (1/6 s to 1 s) in which a kernel was running.",
    unit="ratio",
    source="nvmlDeviceGetUtilizationRates .gpu (percent)",
    field="utilization_ratio",
)
MEM_UTIL = _m(
    "gpumon_gpu_memory_controller_utilization_ratio",
    "gauge",
    "Fraction of the driver's last sample window in which device memory was being read or written.",
    unit="ratio",
    source="nvmlDeviceGetUtilizationRates .memory (percent)",
    field="memory_controller_utilization_ratio",
)

# --------------------------------------------------------------------------------------------------------
_section = "Memory (HBM)"
MEM_TOTAL = _m(
    "gpumon_gpu_memory_total_bytes",
    "gauge",
    "Device memory installed.",
    unit="bytes",
    source="nvmlDeviceGetMemoryInfo v2 .total",
    field="memory_total_bytes",
)
MEM_USED = _m(
    "gpumon_gpu_memory_used_bytes",
    "gauge",
    "Device memory allocated by processes.",
    unit="bytes",
    source="nvmlDeviceGetMemoryInfo v2 .used",
    field="memory_used_bytes",
)
MEM_FREE = _m(
    "gpumon_gpu_memory_free_bytes",
    "gauge",
    "Device memory free for allocation.",
    unit="bytes",
    source="nvmlDeviceGetMemoryInfo v2 .free",
    field="memory_free_bytes",
)
MEM_RESERVED = _m(
    "gpumon_gpu_memory_reserved_bytes",
    "gauge",
    "Device memory reserved by the driver and firmware (absent on drivers without memory info v2).",
    unit="bytes",
    source="nvmlDeviceGetMemoryInfo v2 .reserved",
    field="memory_reserved_bytes",
)

# --------------------------------------------------------------------------------------------------------
_section = "Power and energy"
POWER = _m(
    "gpumon_gpu_power_watts",
    "gauge",
    "Power draw (a 1 s average on Ampere and later, except A100).",
    unit="watts",
    source="nvmlDeviceGetPowerUsage (mW)",
    field="power_watts",
)
POWER_LIMIT = _m(
    "gpumon_gpu_power_limit_watts",
    "gauge",
    "Power limit the driver enforces.",
    unit="watts",
    source="nvmlDeviceGetEnforcedPowerLimit (mW)",
    field="power_limit_watts",
)
ENERGY = _m(
    "gpumon_gpu_energy_joules_total",
    "counter",
    "Energy consumed since the driver loaded; use rate() for average power and tokens-per-joule.",
    unit="joules",
    source="nvmlDeviceGetTotalEnergyConsumption (mJ)",
    field="energy_joules",
)

# --------------------------------------------------------------------------------------------------------
_section = "Thermal"
TEMP = _m(
    "gpumon_gpu_temperature_celsius",
    "gauge",
    "GPU core temperature.",
    unit="celsius",
    source="nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
    field="temperature_celsius",
)
MEM_TEMP = _m(
    "gpumon_gpu_memory_temperature_celsius",
    "gauge",
    "HBM temperature (absent on GDDR boards).",
    unit="celsius",
    source="field NVML_FI_DEV_MEMORY_TEMP (82)",
    field="memory_temperature_celsius",
)
FAN = _m(
    "gpumon_gpu_fan_speed_ratio",
    "gauge",
    "Fan speed as a fraction of its maximum (absent on passively cooled boards).",
    unit="ratio",
    source="nvmlDeviceGetFanSpeed (percent)",
    field="fan_speed_ratio",
)

# --------------------------------------------------------------------------------------------------------
_section = "Clocks and throttling"
SM_CLOCK = _m(
    "gpumon_gpu_sm_clock_hertz",
    "gauge",
    "Current SM clock.",
    unit="hertz",
    source="nvmlDeviceGetClockInfo(NVML_CLOCK_SM) (MHz)",
    field="sm_clock_hz",
)
MEM_CLOCK = _m(
    "gpumon_gpu_memory_clock_hertz",
    "gauge",
    "Current memory clock.",
    unit="hertz",
    source="nvmlDeviceGetClockInfo(NVML_CLOCK_MEM) (MHz)",
    field="memory_clock_hz",
)
SM_CLOCK_MAX = _m(
    "gpumon_gpu_sm_clock_max_hertz",
    "gauge",
    "Maximum SM clock.",
    unit="hertz",
    source="nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM) (MHz)",
)
MEM_CLOCK_MAX = _m(
    "gpumon_gpu_memory_clock_max_hertz",
    "gauge",
    "Maximum memory clock.",
    unit="hertz",
    source="nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM) (MHz)",
)
PSTATE = _m(
    "gpumon_gpu_performance_state",
    "gauge",
    "Performance state: 0 (P0, maximum) to 15 (minimum).",
    source="nvmlDeviceGetPerformanceState",
    field="performance_state",
)
THROTTLE_MASK = _m(
    "gpumon_gpu_throttle_reasons",
    "gauge",
    "Raw bitmask of the reasons clocks are held below maximum (NVML clocks event reasons).",
    source="nvmlDeviceGetCurrentClocksEventReasons",
    field="throttle_reasons",
)
THROTTLE_ACTIVE = _m(
    "gpumon_gpu_throttle_active",
    "gauge",
    "1 while this reason holds clocks down "
    "(gpu_idle, applications_clocks, sw_power_cap, hw_slowdown, sync_boost, sw_thermal, "
    "hw_thermal, hw_power_brake, display_clocks).",
    (*GPU, "reason"),
    source="nvmlDeviceGetCurrentClocksEventReasons",
)
THROTTLE_SECONDS = _m(
    "gpumon_gpu_throttle_seconds_total",
    "counter",
    "Cumulative time clocks were held down "
    "for this reason (sw_power_cap, sync_boost, sw_thermal, hw_thermal, hw_power_brake).",
    (*GPU, "reason"),
    "seconds",
    "fields 74, 76, 269, 270, 271 (ns)",
)

# --------------------------------------------------------------------------------------------------------
_section = "PCIe"
PCIE_TX = _m(
    "gpumon_gpu_pcie_transmit_bytes_total",
    "counter",
    "Bytes the GPU sent over PCIe.",
    unit="bytes",
    source="field NVML_FI_DEV_PCIE_COUNT_TX_BYTES (197)",
    field="pcie_transmit_bytes",
)
PCIE_RX = _m(
    "gpumon_gpu_pcie_receive_bytes_total",
    "counter",
    "Bytes the GPU received over PCIe.",
    unit="bytes",
    source="field NVML_FI_DEV_PCIE_COUNT_RX_BYTES (198)",
    field="pcie_receive_bytes",
)
PCIE_TX_RATE = _m(
    "gpumon_gpu_pcie_transmit_bytes_per_second",
    "gauge",
    "PCIe send rate over a 20 ms window; only on GPUs without the byte counters above.",
    unit="bytes/s",
    source="nvmlDeviceGetPcieThroughput(TX) (KB/s)",
    field="pcie_transmit_bytes_per_second",
)
PCIE_RX_RATE = _m(
    "gpumon_gpu_pcie_receive_bytes_per_second",
    "gauge",
    "PCIe receive rate over a 20 ms window; only on GPUs without the byte counters above.",
    unit="bytes/s",
    source="nvmlDeviceGetPcieThroughput(RX) (KB/s)",
    field="pcie_receive_bytes_per_second",
)
PCIE_GEN = _m(
    "gpumon_gpu_pcie_link_generation",
    "gauge",
    "Current PCIe link generation (drops when idle to save power).",
    source="nvmlDeviceGetCurrPcieLinkGeneration",
    field="pcie_link_generation",
)
PCIE_WIDTH = _m(
    "gpumon_gpu_pcie_link_width",
    "gauge",
    "Current PCIe link width in lanes.",
    source="nvmlDeviceGetCurrPcieLinkWidth",
    field="pcie_link_width",
)
PCIE_GEN_MAX = _m(
    "gpumon_gpu_pcie_link_max_generation",
    "gauge",
    "Maximum PCIe link generation of the GPU.",
    source="nvmlDeviceGetMaxPcieLinkGeneration",
)
PCIE_WIDTH_MAX = _m(
    "gpumon_gpu_pcie_link_max_width",
    "gauge",
    "Maximum PCIe link width in lanes.",
    source="nvmlDeviceGetMaxPcieLinkWidth",
)
PCIE_REPLAYS = _m(
    "gpumon_gpu_pcie_replays_total",
    "counter",
    "PCIe replays (retransmissions after link errors).",
    source="nvmlDeviceGetPcieReplayCounter",
    field="pcie_replays",
)

# --------------------------------------------------------------------------------------------------------
_section = "NVLink"
NVL_TX = _m(
    "gpumon_gpu_nvlink_transmit_bytes_total",
    "counter",
    "Data bytes sent over all NVLinks of the GPU.",
    unit="bytes",
    source="field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (138), all links (KiB)",
    field="nvlink_transmit_bytes",
)
NVL_RX = _m(
    "gpumon_gpu_nvlink_receive_bytes_total",
    "counter",
    "Data bytes received over all NVLinks of the GPU.",
    unit="bytes",
    source="field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX (139), all links (KiB)",
    field="nvlink_receive_bytes",
)
NVL_LINKS = _m(
    "gpumon_gpu_nvlink_links",
    "gauge",
    "NVLinks the GPU has.",
    source="field NVML_FI_DEV_NVLINK_LINK_COUNT (91)",
)
NVL_LINK_UP = _m(
    "gpumon_gpu_nvlink_link_up",
    "gauge",
    "1 if the link is active (refreshed every 10 sweeps).",
    (*GPU, "link"),
    source="nvmlDeviceGetNvLinkState",
)
NVL_LINK_TX = _m(
    "gpumon_gpu_nvlink_link_transmit_bytes_total",
    "counter",
    "Data bytes sent over one NVLink.",
    (*GPU, "link"),
    "bytes",
    "field 138, scopeId = link (KiB)",
)
NVL_LINK_RX = _m(
    "gpumon_gpu_nvlink_link_receive_bytes_total",
    "counter",
    "Data bytes received over one NVLink.",
    (*GPU, "link"),
    "bytes",
    "field 139, scopeId = link (KiB)",
)

# --------------------------------------------------------------------------------------------------------
_section = "Memory errors"
ECC = _m(
    "gpumon_gpu_ecc_errors_total",
    "counter",
    "ECC errors since the driver loaded (type=corrected or uncorrected).",
    (*GPU, "type"),
    source="nvmlDeviceGetTotalEccErrors(…, NVML_VOLATILE_ECC)",
)
ECC_LIFETIME = _m(
    "gpumon_gpu_ecc_lifetime_errors_total",
    "counter",
    "ECC errors over the GPU's lifetime (type=corrected or uncorrected).",
    (*GPU, "type"),
    source="nvmlDeviceGetTotalEccErrors(…, NVML_AGGREGATE_ECC)",
)
REMAPPED = _m(
    "gpumon_gpu_remapped_rows_total",
    "counter",
    "HBM rows remapped to spares, by the type of error that caused it (corrected or uncorrected).",
    (*GPU, "type"),
    source="nvmlDeviceGetRemappedRows",
)
REMAP_PENDING = _m(
    "gpumon_gpu_row_remap_pending",
    "gauge",
    "1 if a row remap waits for a GPU reset.",
    source="nvmlDeviceGetRemappedRows",
    field="row_remap_pending",
)
REMAP_FAILURE = _m(
    "gpumon_gpu_row_remap_failure",
    "gauge",
    "1 if a row remap failed (the GPU needs service).",
    source="nvmlDeviceGetRemappedRows",
    field="row_remap_failure",
)

# --------------------------------------------------------------------------------------------------------
_section = "Host"
HOST_CPU = _m(
    "gpumon_host_cpu_utilization_ratio",
    "gauge",
    "Host CPU busy fraction since the previous sweep, all cores.",
    (),
    "ratio",
    "psutil.cpu_percent",
)
HOST_CPUS = _m("gpumon_host_cpus", "gauge", "Logical CPUs on the host.", (), source="psutil.cpu_count")
HOST_MEM_TOTAL = _m(
    "gpumon_host_memory_total_bytes", "gauge", "Host memory installed.", (), "bytes", "psutil.virtual_memory"
)
HOST_MEM_AVAIL = _m(
    "gpumon_host_memory_available_bytes",
    "gauge",
    "Host memory available without swapping.",
    (),
    "bytes",
    "psutil.virtual_memory",
)
HOST_LOAD1 = _m("gpumon_host_load1", "gauge", "1-minute load average.", (), source="os.getloadavg")
HOST_LOAD5 = _m("gpumon_host_load5", "gauge", "5-minute load average.", (), source="os.getloadavg")
HOST_LOAD15 = _m("gpumon_host_load15", "gauge", "15-minute load average.", (), source="os.getloadavg")


GPU_SCALARS = tuple(m for m in REGISTRY if m.field is not None)
BY_NAME = {m.name: m for m in REGISTRY}

# prometheus_client's process collector adds these standard series about the daemon itself
PROCESS_METRICS = (
    "process_cpu_seconds_total",
    "process_max_fds",
    "process_open_fds",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_virtual_memory_bytes",
)


def render_markdown() -> str:
    lines = [
        "# gpumon metrics",
        "",
        "Generated from `gpumon/metrics.py` by `python -m gpumon.metrics > docs/metrics.md`;",
        "a test fails when this file is out of date. Do not edit by hand.",
        "",
        "Every per-GPU series has the labels `gpu` (NVML index) and `uuid`. Static facts (model name,",
        "PCI bus id, serial, board, VBIOS) are only in `gpumon_gpu_info`: join them with",
        "`... * on(uuid) group_left(name) gpumon_gpu_info`. A quantity a GPU does not support has no series",
        "(see the GPU's `capabilities` in `/v1/gpus` or `gpumon doctor`), never a zero.",
        "",
    ]
    section = None
    for m in REGISTRY:
        if m.section != section:
            section = m.section
            lines += [
                "",
                f"## {section}",
                "",
                "| metric | type | labels | unit | meaning | source |",
                "|---|---|---|---|---|---|",
            ]
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        lines.append(f"| `{m.name}` | {m.type} | {labels} | {m.unit or '-'} | {m.help} | {m.source or '-'} |")
    lines += [
        "",
        "## The daemon process",
        "",
        "prometheus_client's standard process collector also exports: "
        + ", ".join(f"`{n}`" for n in PROCESS_METRICS)
        + ".",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_markdown(), end="")
