"""gpumon snapshot: sample once and print a per-GPU table (or the JSON that /v1/gpus serves)."""

from __future__ import annotations

import argparse
import json
import time

from gpumon.cli.common import open_sampler
from gpumon.config import Settings
from gpumon.gpu.backend import marked
from gpumon.gpu.snapshot import GpuStatus, Snapshot, snapshot_json
from gpumon.gpu.types import THROTTLE_REASONS, GpuReading

GIB = 1024**3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON (base units)")


def run(settings: Settings, args: argparse.Namespace) -> int:
    sampler = open_sampler(settings, "snapshot")
    try:
        before = None if args.json else sampler.sweep()
        if before is not None:
            time.sleep(RATE_GAP)  # the table shows rates: two reads of the cumulative counters
        snap = sampler.sweep()
    finally:
        sampler.stop()
    print(json.dumps(snapshot_json(snap), indent=2) if args.json else render(snap, before))
    return 0


# the interval between the two reads the table's link rates come from
RATE_GAP = 0.5


def _rate(a: GpuReading | None, b: GpuReading | None, name: str) -> float | None:
    """Bytes per second of counter ``name`` between two readings of one GPU, else None."""
    if a is None or b is None:
        return None
    x, y = getattr(a, name), getattr(b, name)
    if x is None or y is None or b.timestamp <= a.timestamp or y < x:
        return None
    return (y - x) / (b.timestamp - a.timestamp)


def _fmt(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, fmt)


def _throttle(mask: int | None) -> str:
    if mask is None:
        return "-"
    names = [name for bit, name, _ in THROTTLE_REASONS if mask & bit]
    return ",".join(names) or "none"


def _row(st: GpuStatus, first: GpuReading | None) -> list[str]:
    i, r = st.info, st.reading
    if r is None:
        # the reason runs on past the columns (render leaves it out of their widths)
        return [str(i.index), i.name, "DOWN", st.down_reason or "not answering"]
    mem = f"{_fmt(r.memory_used_bytes, '.1f', 1 / GIB)}/{_fmt(r.memory_total_bytes, '.1f', 1 / GIB)}"
    power = f"{_fmt(r.power_watts, '.0f')}/{_fmt(r.power_limit_watts, '.0f')}"
    temp = _fmt(r.temperature_celsius, ".0f")
    if r.memory_temperature_celsius is not None:
        temp += f" ({r.memory_temperature_celsius:.0f})"
    # rates in both columns: from the counters' growth between the two reads where a GPU has counters,
    # else the driver's own sampled rate (older GPUs)
    rx = _rate(first, r, "pcie_receive_bytes")
    tx = _rate(first, r, "pcie_transmit_bytes")
    if r.pcie_receive_bytes is None:
        rx, tx = r.pcie_receive_bytes_per_second, r.pcie_transmit_bytes_per_second
    pcie = f"{_fmt(rx, '.0f', 1e-6)}/{_fmt(tx, '.0f', 1e-6)}"
    nvl = "-"
    if r.nvlink_receive_bytes is not None:
        up = sum(1 for link in r.nvlinks if link.up)
        rx, tx = _rate(first, r, "nvlink_receive_bytes"), _rate(first, r, "nvlink_transmit_bytes")
        nvl = f"{_fmt(rx, '.1f', 1e-9)}/{_fmt(tx, '.1f', 1e-9)} ({up}/{len(r.nvlinks)} up)"
    return [
        str(i.index),
        i.name,
        _fmt(r.utilization_ratio, ".0%"),
        mem,
        power,
        temp,
        _fmt(r.sm_clock_hz, ".0f", 1e-6),
        _throttle(r.throttle_reasons),
        pcie,
        nvl,
    ]


def render(snap: Snapshot, before: Snapshot | None = None) -> str:
    """The table; ``before``, an earlier sweep, gives the link rates (without it they show as -)."""
    d = snap.driver
    head = (
        f"backend {marked(snap.backend)} · driver "
        f"{d.driver_version or '?'} · CUDA {d.cuda_driver_version or '?'} · {len(snap.gpus)} GPU(s)"
    )
    header = [
        "GPU",
        "NAME",
        "UTIL",
        "MEM GiB",
        "POWER W",
        "TEMP C (HBM)",
        "SM MHz",
        "THROTTLE",
        "PCIE RX/TX MB/s",
        "NVLINK RX/TX GB/s",
    ]
    earlier = {st.info.uuid: st.reading for st in before.gpus} if before is not None else {}
    rows = [header, *(_row(st, earlier.get(st.info.uuid)) for st in snap.gpus)]
    widths = [max(len(r[c]) for r in rows if len(r) == len(header)) for c in range(len(header))]
    lines = [head, ""] + [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)).rstrip() for r in rows
    ]
    h = snap.host
    if h is not None:
        lines += [
            "",
            f"host: {h.cpu_count} CPUs {h.cpu_utilization_ratio:.0%} busy · memory "
            f"{h.memory_available_bytes / GIB:.1f}/{h.memory_total_bytes / GIB:.1f} GiB available · "
            f"load {h.load1:.2f} {h.load5:.2f} {h.load15:.2f}",
        ]
    if snap.errors:
        lines += [
            "",
            "errors: "
            + ", ".join(
                f"GPU {g or '-'} {op} {kind} x{n}" for (g, _, op, kind), n in sorted(snap.errors.items())
            ),
        ]
    return "\n".join(lines)
