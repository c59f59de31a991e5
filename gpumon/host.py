"""Host readings that explain GPU numbers (a starved input pipeline shows as saturated CPUs)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil


@dataclass(frozen=True, slots=True)
class HostReading:
    cpu_utilization_ratio: float
    cpu_count: int
    memory_total_bytes: float
    memory_available_bytes: float
    load1: float
    load5: float
    load15: float


class HostSampler:
    def __init__(self) -> None:
        psutil.cpu_percent(
            interval=None
        )  # primes the counter: the first call has no baseline to diff against
        self.cpu_count = psutil.cpu_count(logical=True) or 1

    def read(self) -> HostReading:
        mem = psutil.virtual_memory()
        load1, load5, load15 = os.getloadavg()
        return HostReading(
            cpu_utilization_ratio=psutil.cpu_percent(interval=None) / 100.0,
            cpu_count=self.cpu_count,
            memory_total_bytes=float(mem.total),
            memory_available_bytes=float(mem.available),
            load1=load1,
            load5=load5,
            load15=load15,
        )
