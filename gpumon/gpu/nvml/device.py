"""One GPU as the NVML backend holds it: its handle, and what the readers keep on it between sweeps.

The readers (fieldvalues, gpm, mig, pcie, processes) build on this module; it imports none of them, so the
state they keep (GPM sample pairs, the MIG layout, the PCIe call pool) is declared here.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import Any

from gpumon.gpu.backend import Device
from gpumon.gpu.nvml.pool import DaemonPool
from gpumon.gpu.types import GpuInfo, ProfilingReading


@dataclass
class Stream:
    """The sample pair of one GPU or one MIG GPU instance."""

    previous: Any
    current: Any
    previous_at: float | None = None  # monotonic time ``previous`` was filled; None: nothing to diff
    last: ProfilingReading | None = None
    request: Any = None  # one c_nvmlGpmMetricsGet_t reused for every difference (it is 20 KB)
    results: Any = None  # the request's first len(METRICS) results, seen through _Metric


@dataclass(frozen=True, slots=True)
class MigDevice:
    handle: Any
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile: str


class NvmlDevice(Device):
    def __init__(self, info: GpuInfo, handle: Any) -> None:
        super().__init__(info)
        self.handle = handle
        self.reads = 0
        self.link_states: list[bool | None] = [None] * info.nvlink_count
        self.link_state_failures = 0  # reads in a row in which a link's state entry in the batch failed
        self.fields: list[tuple[str, int, int]] = []
        self.fields_version = -1
        self.pcie_pool: DaemonPool | None = None
        self.pcie_pending: tuple[concurrent.futures.Future, concurrent.futures.Future] | None = None
        self.process_samples_seen = 0  # newest per-process utilization sample read so far (µs)
        self.gpm: dict[int | None, Stream] = {}  # GPM sample pairs: whole GPU (None) or MIG GPU instance
        self.mig_devices: list[MigDevice] | None = None  # the MIG layout, re-enumerated now and then
        self.mig_enabled: bool | None = None  # the MIG mode, re-read now and then; None: not known yet
        self.pcie_link: tuple[int | None, int | None] | None = (
            None  # (generation, width), re-read now and then
        )
