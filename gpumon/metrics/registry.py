"""The metric table's row type, the one list every definition module appends to, and that list as
docs/metrics.md.

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
        "Generated from `gpumon/metrics/` by `python -m gpumon.metrics > docs/metrics.md`;",
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
