"""The metric table's row type and the one list every definition module appends to.

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
    type: str  # "gauge", "counter" or "histogram"
    help: str
    labels: tuple[str, ...]
    unit: str
    section: str
    source: str = ""
    field: str | None = None  # the GpuReading attribute, for plain per-GPU scalars


REGISTRY: list[Metric] = []
_current = [""]


def section(name: str) -> None:
    """Metrics defined after this call are documented under ``name``."""
    _current[0] = name


def metric(
    name: str,
    type_: str,
    help_: str,
    labels: tuple[str, ...] = GPU,
    unit: str = "",
    source: str = "",
    field: str | None = None,
) -> Metric:
    m = Metric(name, type_, help_, labels, unit, _current[0], source, field)
    REGISTRY.append(m)
    return m
