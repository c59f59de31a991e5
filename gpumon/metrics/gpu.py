"""Per-GPU quantities read through NVML each sweep: identity, utilisation, memory, power, thermal, clocks."""

from __future__ import annotations

from gpumon.metrics.registry import GPU, metric, section

section("GPU identity and health")
GPU_INFO = metric(
    "gpumon_gpu_info",
    "gauge",
    "Static facts about a GPU; join on uuid.",
    ("gpu", "uuid", "name", "pci_bus_id", "serial", "board_part_number", "vbios_version"),
    source="nvmlDeviceGetName, nvmlDeviceGetPciInfo, nvmlDeviceGetSerial, "
    "nvmlDeviceGetBoardPartNumber, nvmlDeviceGetVbiosVersion",
)
GPU_UP = metric(
    "gpumon_gpu_up",
    "gauge",
    "1 if the GPU answered in the latest sweep, 0 if it is lost, its driver "
    "is gone or a call hung past the deadline.",
    source="sampler",
)
GPU_SAMPLE_DURATION = metric(
    "gpumon_gpu_sample_duration_seconds",
    "gauge",
    "Time spent reading this GPU in the latest sweep.",
    unit="seconds",
    source="sampler",
    detail="sampler-timing",
)
GPU_LAST_SAMPLE = metric(
    "gpumon_gpu_last_sample_timestamp_seconds",
    "gauge",
    "Unix time of the last successful read of this GPU.",
    unit="seconds",
    source="sampler",
    detail="sampler-timing",
)
PERSISTENCE = metric(
    "gpumon_gpu_persistence_mode",
    "gauge",
    "1 if persistence mode is on (without it NVML "
    "initialisation takes seconds and the first sample is late).",
    source="nvmlDeviceGetPersistenceMode",
    detail="device-state",
)

section("Utilisation")
UTIL = metric(
    "gpumon_gpu_utilization_ratio",
    "gauge",
    "Fraction of the driver's last sample window (1/6 s to 1 s) in which a kernel was running.",
    unit="ratio",
    source="nvmlDeviceGetUtilizationRates .gpu (percent)",
    field="utilization_ratio",
)
MEM_UTIL = metric(
    "gpumon_gpu_memory_controller_utilization_ratio",
    "gauge",
    "Fraction of the driver's last sample window in which device memory was being read or written.",
    unit="ratio",
    source="nvmlDeviceGetUtilizationRates .memory (percent)",
    field="memory_controller_utilization_ratio",
)
ENC_UTIL = metric(
    "gpumon_gpu_encoder_utilization_ratio",
    "gauge",
    "Fraction of the driver's sample window in which the video encoders (NVENC) were busy (absent on "
    "boards without NVENC: A100, H100, H200).",
    unit="ratio",
    source="nvmlDeviceGetEncoderUtilization (percent)",
    field="encoder_utilization_ratio",
)
DEC_UTIL = metric(
    "gpumon_gpu_decoder_utilization_ratio",
    "gauge",
    "Fraction of the driver's sample window in which the video decoders (NVDEC) were busy.",
    unit="ratio",
    source="nvmlDeviceGetDecoderUtilization (percent)",
    field="decoder_utilization_ratio",
)

section("Memory (HBM)")
MEM_TOTAL = metric(
    "gpumon_gpu_memory_total_bytes",
    "gauge",
    "Device memory installed.",
    unit="bytes",
    source="nvmlDeviceGetMemoryInfo v2 .total",
    field="memory_total_bytes",
)
MEM_USED = metric(
    "gpumon_gpu_memory_used_bytes",
    "gauge",
    "Device memory allocated by processes.",
    unit="bytes",
    source="nvmlDeviceGetMemoryInfo v2 .used",
    field="memory_used_bytes",
)
MEM_FREE = metric(
    "gpumon_gpu_memory_free_bytes",
    "gauge",
    "Device memory free for allocation.",
    unit="bytes",
    source="nvmlDeviceGetMemoryInfo v2 .free",
    field="memory_free_bytes",
    detail="device-state",
)
MEM_RESERVED = metric(
    "gpumon_gpu_memory_reserved_bytes",
    "gauge",
    "Device memory reserved by the driver and firmware (absent on drivers without memory info v2).",
    unit="bytes",
    source="nvmlDeviceGetMemoryInfo v2 .reserved",
    field="memory_reserved_bytes",
)

section("Power and energy")
POWER = metric(
    "gpumon_gpu_power_watts",
    "gauge",
    "Power draw (a 1 s average on Ampere and later, except A100).",
    unit="watts",
    source="nvmlDeviceGetPowerUsage (mW)",
    field="power_watts",
)
POWER_LIMIT = metric(
    "gpumon_gpu_power_limit_watts",
    "gauge",
    "Power limit the driver enforces.",
    unit="watts",
    source="nvmlDeviceGetEnforcedPowerLimit (mW)",
    field="power_limit_watts",
)
ENERGY = metric(
    "gpumon_gpu_energy_joules_total",
    "counter",
    "Energy consumed since the driver loaded; use rate() for average power and tokens-per-joule.",
    unit="joules",
    source="field NVML_FI_DEV_ENERGY (mJ), else nvmlDeviceGetTotalEnergyConsumption",
    field="energy_joules",
)

section("Thermal")
TEMP = metric(
    "gpumon_gpu_temperature_celsius",
    "gauge",
    "GPU core temperature.",
    unit="celsius",
    source="nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
    field="temperature_celsius",
)
MEM_TEMP = metric(
    "gpumon_gpu_memory_temperature_celsius",
    "gauge",
    "HBM temperature (absent on GDDR boards).",
    unit="celsius",
    source="field NVML_FI_DEV_MEMORY_TEMP (82)",
    field="memory_temperature_celsius",
)
FAN = metric(
    "gpumon_gpu_fan_speed_ratio",
    "gauge",
    "Fan speed as a fraction of its maximum (absent on passively cooled boards).",
    unit="ratio",
    source="nvmlDeviceGetFanSpeed (percent)",
    field="fan_speed_ratio",
)

section("Clocks and throttling")
SM_CLOCK = metric(
    "gpumon_gpu_sm_clock_hertz",
    "gauge",
    "Current SM clock.",
    unit="hertz",
    source="nvmlDeviceGetClockInfo(NVML_CLOCK_SM) (MHz)",
    field="sm_clock_hz",
)
MEM_CLOCK = metric(
    "gpumon_gpu_memory_clock_hertz",
    "gauge",
    "Current memory clock.",
    unit="hertz",
    source="nvmlDeviceGetClockInfo(NVML_CLOCK_MEM) (MHz)",
    field="memory_clock_hz",
)
SM_CLOCK_MAX = metric(
    "gpumon_gpu_sm_clock_max_hertz",
    "gauge",
    "Maximum SM clock.",
    unit="hertz",
    source="nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM) (MHz)",
)
MEM_CLOCK_MAX = metric(
    "gpumon_gpu_memory_clock_max_hertz",
    "gauge",
    "Maximum memory clock.",
    unit="hertz",
    source="nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM) (MHz)",
    detail="device-state",
)
PSTATE = metric(
    "gpumon_gpu_performance_state",
    "gauge",
    "Performance state: 0 (P0, maximum) to 15 (minimum).",
    source="nvmlDeviceGetPerformanceState",
    field="performance_state",
    detail="device-state",
)
THROTTLE_MASK = metric(
    "gpumon_gpu_throttle_reasons",
    "gauge",
    "Raw bitmask of the reasons clocks are held below maximum (NVML clocks event reasons).",
    source="nvmlDeviceGetCurrentClocksEventReasons",
    field="throttle_reasons",
    detail="throttle-reasons",
)
THROTTLE_ACTIVE = metric(
    "gpumon_gpu_throttle_active",
    "gauge",
    "1 while this reason holds clocks down. By default only for reasons that cost throughput and have no "
    "cumulative time below on this GPU (hw_slowdown; sw_power_cap, sw_thermal, hw_thermal, hw_power_brake "
    "on drivers without their counters); with --collect throttle-reasons for every reason (also gpu_idle, "
    "applications_clocks, sync_boost, display_clocks).",
    (*GPU, "reason"),
    source="nvmlDeviceGetCurrentClocksEventReasons",
)
THROTTLE_SECONDS = metric(
    "gpumon_gpu_throttle_seconds_total",
    "counter",
    "Cumulative time clocks were held down "
    "for this reason (sw_power_cap, sync_boost, sw_thermal, hw_thermal, hw_power_brake). Absent until it "
    "first rises (0 first, so increase() sees it), or at once where the driver counted some before.",
    (*GPU, "reason"),
    "seconds",
    "fields 74, 76, 269, 270, 271 (ns)",
)
