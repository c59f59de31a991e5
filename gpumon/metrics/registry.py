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

# Opt-in detail, switched on by name like node_exporter's collectors (``--collect NAME``, ``all`` for every
# one). The default keeps what an operator alerts on and a dashboard shows, within 50 series per GPU and 60
# per node; each entry says what it adds. Metrics tagged with a name here are absent unless it is on.
DETAILS: dict[str, str] = {
    "nvlink-links": "state and traffic of each NVLink (3 series per link: 54 per H100 or H200); the "
    "default keeps the GPU's totals and how many of its links are up",
    "throttle-reasons": "a 0/1 series for every clock event reason and the raw bitmask (9 more per GPU); the "
    "default keeps the cumulative throttle time per reason and a 0/1 series only for the "
    "throughput-costing reasons without one (hw_slowdown)",
    "process-utilization": "SM and memory utilisation of each process and the time of its newest sample "
    "(3 per process; one more NVML call per GPU with one process, which a GPU running several makes anyway "
    "for the diagnosis)",
    "profiling-detail": "the FP64, FP32 and FP16 pipes, the profiler's own PCIe and NVLink rates and where "
    "the counters come from (8 per GPU); PCIe and NVLink traffic stay as byte counters",
    "event-types": "every NVML event type counted from 0 and the types registered (19 more per H100); the "
    "default counts XIDs from 0, which every serious event type comes with",
    "ecc-lifetime": "ECC error totals over the GPU's lifetime (2 per GPU); the default counts since the "
    "driver loaded, and keeps remapped rows",
    "device-state": "performance state, persistence mode, maximum memory clock and free memory (4 per GPU; "
    "the performance state costs one NVML call per GPU)",
    "sampler-timing": "per GPU, the time its last read took and when it last succeeded (2 per GPU); the "
    "node's sweep time and gpumon_gpu_up stay",
    "nic-detail": "per RDMA port, packet counters, the port's other error counters and the driver's RoCE "
    "congestion and transport counters, as the adapter has them (13 per port of the captured ConnectX-4 in "
    "tests/fixtures/sysfs, at most 16); the default keeps traffic, link speed and state, and the five error "
    "counters operators act on",
    "rank-rates": "per rank, the daemon's windowed figures: tokens and samples per second, step time, phase "
    "shares, FLOP/s, peak FLOP/s, MFU, tokens per joule, the straggler score and the bottleneck one-hot "
    "(19 per rank, and one per phase); the default has them per job on the node, and the recording "
    "rules derive them from the per-rank counters",
    "rank-step-buckets": "per rank, the step-time histogram's buckets (17 per rank: "
    "gpumon_training_step_duration_seconds becomes a histogram); the default keeps each rank's step-time "
    "sum and count (a summary, what the straggler rules read) and the buckets per job on the node",
    "rank-detail": "per rank, the time of its latest report, the allocator's two peaks and its "
    "fragmentation ratio (4 per rank); the default keeps allocated and reserved bytes",
}
ALL_DETAILS = "all"


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
    detail: str = ""  # the opt-in detail (DETAILS) that adds it; "" = exposed by default


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
    detail: str = "",
) -> Metric:
    assert not detail or detail in DETAILS, detail
    m = Metric(name, type_, help_, labels, unit, _current[0], source, field, detail)
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
        "## What is exposed by default, and what is opt-in",
        "",
        "By default an 8 x H100 SXM node exposes at most 50 series per GPU plus 60 for the node (a test",
        "holds the default exposition to that budget): what an operator alerts on and what the dashboards",
        "show. The budget is that of a node with one process per GPU, no MIG and no XID yet: each further",
        "process adds 2 series, each XID code a GPU has seen 2, each MIG GPU instance up to 7 (one info",
        "series per compute instance, memory and activity per GPU instance); a training job adds its own",
        "(`gpumon_training_*`): about 16 per rank (11, one per phase it reports and one per badput cause",
        "it has seen) and 23 per job on the node, at most 600 for 8 GPUs and an 8-rank job (a test holds",
        'that too; docs/training.md, "What a rank costs in series"). Debug detail is opt-in by name, like',
        "node_exporter's collectors: `--collect NAME` (repeatable",
        "or comma-separated; `GPUMON_COLLECT`, `collect = [...]` in the config file; `all` for everything).",
        "The metrics below carry the name in the *opt-in* column.",
        "",
        "| `--collect` | adds |",
        "|---|---|",
        *[f"| `{name}` | {what} |" for name, what in DETAILS.items()],
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
                "| metric | type | labels | unit | meaning | source | opt-in |",
                "|---|---|---|---|---|---|---|",
            ]
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        detail = f"`{m.detail}`" if m.detail else "-"
        unit, source = m.unit or "-", m.source or "-"
        lines.append(f"| `{m.name}` | {m.type} | {labels} | {unit} | {m.help} | {source} | {detail} |")
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
