"""Plain data that leaves a backend: base units only (bytes, seconds, joules, watts, celsius, hertz, ratios).

A value of ``None`` means "not available in this sample"; whether that is because the GPU does not support
the quantity is recorded separately in the GPU's capabilities, so that "not supported" is a value and never
an exception for the rest of the daemon.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


class Support(str, Enum):
    """What we know about one quantity on one GPU."""

    UNKNOWN = "unknown"  # not probed yet
    SUPPORTED = "supported"
    NOT_SUPPORTED = "not_supported"  # NVML says so: the series is absent, not an error
    NO_PERMISSION = "no_permission"  # NVML refused: absent, with advice in `gpumon doctor`
    ERROR = "error"  # the last attempt failed transiently; retried next sample


# The compute parts (A100, A30, Hopper, Blackwell datacenter) carry video decoders but no encoders. A real
# H200 (driver 580) still answers nvmlDeviceGetEncoderUtilization, always 0: a series that says nothing, so
# the board's name decides (bench/device/verify_real_gpu.sh).
_NO_NVENC = ("NVIDIA H", "NVIDIA A100", "NVIDIA A30", "NVIDIA A800", "NVIDIA B", "NVIDIA GH", "NVIDIA GB")


def has_video_encoders(name: str) -> bool:
    """Whether a board of this NVML name has NVENC engines."""
    return not name.startswith(_NO_NVENC)


# Clock-event ("throttle") reasons: NVML bit, our label value, and the field id that carries the cumulative
# time spent in that state (nanoseconds), where NVML has one.
THROTTLE_REASONS: tuple[tuple[int, str, int | None], ...] = (
    (0x001, "gpu_idle", None),
    (0x002, "applications_clocks", None),
    (0x004, "sw_power_cap", 74),
    (0x008, "hw_slowdown", None),
    (0x010, "sync_boost", 76),
    (0x020, "sw_thermal", 269),
    (0x040, "hw_thermal", 270),
    (0x080, "hw_power_brake", 271),
    (0x100, "display_clocks", None),
)


@dataclass(frozen=True, slots=True)
class DriverInfo:
    driver_version: str
    cuda_driver_version: str
    nvml_version: str


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Facts about a GPU that do not change while it is attached."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    serial: str | None = None
    board_part_number: str | None = None
    vbios_version: str | None = None
    persistence_mode: bool | None = None
    sm_clock_max_hz: float | None = None
    memory_clock_max_hz: float | None = None
    pcie_link_max_generation: int | None = None
    pcie_link_max_width: int | None = None
    nvlink_count: int = 0


@dataclass(frozen=True, slots=True)
class NvlinkReading:
    link: int
    up: bool | None = None
    transmit_bytes: float | None = None
    receive_bytes: float | None = None


@dataclass(frozen=True, slots=True)
class ProfilingReading:
    """Profiling counters over the last interval, from NVML GPM (Hopper+) or DCGM fields 1001-1012.

    Activity values are ratios 0-1 of the interval; rates are bytes per second. The same gpumon metric
    names serve both sources; ``source`` says which one measured them.
    """

    source: str  # "gpm" or "dcgm"
    graphics_engine_active_ratio: float | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    fp64_active_ratio: float | None = None
    fp32_active_ratio: float | None = None
    fp16_active_ratio: float | None = None
    pcie_transmit_bytes_per_second: float | None = None
    pcie_receive_bytes_per_second: float | None = None
    nvlink_transmit_bytes_per_second: float | None = None
    nvlink_receive_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """A compute process using one GPU (or one MIG instance of it), as NVML reports it."""

    pid: int
    used_memory_bytes: float | None = None  # None where NVML cannot tell (WDDM, some MIG setups)
    gpu_instance_id: int | None = None  # MIG only
    compute_instance_id: int | None = None  # MIG only
    sm_utilization_ratio: float | None = None  # from process samples, where supported
    memory_utilization_ratio: float | None = None
    last_seen: float | None = None  # unix time of the newest process sample for this pid


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG device (a compute instance in a GPU instance) of a GPU in MIG mode."""

    uuid: str  # MIG-…: what CUDA_VISIBLE_DEVICES and the kubelet name it by
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # e.g. "3g.40gb", from the MIG device's name
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    profiling: ProfilingReading | None = None  # GPM per GPU instance, where the GPU has GPM


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One sample of one GPU. Counters are cumulative as the driver reports them."""

    timestamp: float  # unix seconds when the read finished
    duration_seconds: float
    utilization_ratio: float | None = None
    memory_controller_utilization_ratio: float | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    memory_free_bytes: float | None = None
    memory_reserved_bytes: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    throttle_reasons: int | None = None
    throttle_seconds: Mapping[str, float] = field(default_factory=dict)
    pcie_transmit_bytes: float | None = None
    pcie_receive_bytes: float | None = None
    pcie_transmit_bytes_per_second: float | None = None
    pcie_receive_bytes_per_second: float | None = None
    pcie_link_generation: int | None = None
    pcie_link_width: int | None = None
    pcie_replays: float | None = None
    nvlink_transmit_bytes: float | None = None
    nvlink_receive_bytes: float | None = None
    nvlinks: tuple[NvlinkReading, ...] = ()
    ecc_corrected_errors: float | None = None
    ecc_uncorrected_errors: float | None = None
    ecc_corrected_errors_lifetime: float | None = None
    ecc_uncorrected_errors_lifetime: float | None = None
    remapped_rows_correctable: float | None = None
    remapped_rows_uncorrectable: float | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    performance_state: int | None = None
    fan_speed_ratio: float | None = None
    profiling: ProfilingReading | None = None
    processes: tuple[ProcessReading, ...] | None = None  # None: not read (unsupported); () none running
    mig: tuple[MigReading, ...] | None = None  # None: MIG off or unsupported


@dataclass(frozen=True, slots=True)
class ReadError:
    """A failed NVML operation during one read: counted by the sampler, logged with rate limiting."""

    op: str
    kind: str  # an NVML error name such as "Unknown" or "Timeout", or "exception" for a non-NVML failure
    message: str = ""


@dataclass(frozen=True, slots=True)
class ReadResult:
    reading: GpuReading
    errors: tuple[ReadError, ...] = ()


class DeviceDown(Exception):
    """The GPU cannot be read at all (lost, driver gone, NVML uninitialised). The sampler retries it."""

    def __init__(self, op: str, kind: str, message: str = "") -> None:
        super().__init__(f"{op}: {kind}{': ' + message if message else ''}")
        self.op = op
        self.kind = kind


class BackendUnavailable(Exception):
    """No GPUs can be reached through this backend (no driver, library missing)."""

    def __init__(self, message: str, *, op: str = "nvmlInit", kind: str = "exception") -> None:
        super().__init__(message)
        self.op = op  # the call that failed and how, for gpumon_errors_total while the daemon waits
        self.kind = kind
