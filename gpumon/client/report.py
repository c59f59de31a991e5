"""The report a Reporter sends, in the wire format protocol.py defines, from its counters and settings.

Built on the sender thread, never on the hot path. Standard library only: this module runs
inside training processes.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any

from gpumon.client.protocol import EXTENSIONS, HOSTNAME_PATTERN, TOTALS, VERSION
from gpumon.client.settings import Settings


def _hostname() -> str | None:
    """This host's name as NCCL's Inspector writes it in its dump's name; None where the protocol's charset
    cannot carry it (the daemon then has no join for the dumps)."""
    name = socket.gethostname()[:255]
    return name if re.fullmatch(HOSTNAME_PATTERN, name) else None


HOSTNAME = _hostname()


def build_report(
    cfg: Settings,
    incarnation: str,
    started: float,
    now: float,
    totals: tuple[Any, ...],
    updated: float | None,
    anchor: tuple[Any, ...] | None,
    step_seconds: dict[str, Any],
    request_seconds: dict[str, Any] | None,
    phases: dict[str, float],
    final: bool,
) -> dict[str, Any]:
    """The report with seq 0 (the sender numbers what it sends). ``totals`` is the Reporter's (steps, tokens,
    samples, requests, ...) tuple; ``anchor`` its (wall time, steps, tokens, samples, requests) or None."""
    t = totals
    report = {
        "v": VERSION,
        "job": cfg.job,
        "rank": cfg.rank,
        "world_size": cfg.world_size,
        "local_rank": cfg.local_rank,
        "kind": cfg.kind,
        "workload": cfg.workload,
        "incarnation": incarnation,
        "pid": os.getpid(),
        "seq": 0,
        "time": now,
        "started": started,
        "devices": list(cfg.devices),
        "dtype": cfg.dtype,
        "flops_per_token": cfg.flops_per_token,
        "flops_convention": cfg.flops_convention,
        "peak_flops": cfg.peak_flops,
        "totals": {"steps": t[0], "tokens": t[1], "samples": t[2], "requests": t[3]},
        "updated": updated,
        "anchor": None,
        "step_seconds": step_seconds,
        "request_seconds": request_seconds,
        "phases": phases,
        "final": final,
    }
    if anchor is not None:
        report["anchor"] = {"time": anchor[0], **{key: anchor[i + 1] for i, key in enumerate(TOTALS)}}
    return report


def extend(
    report: dict[str, Any],
    cfg: Settings,
    process_started: float | None,
    open_phases: dict[str, float],
    memory: dict[str, Any] | None,
) -> None:
    """Add the optional fields (protocol.EXTENSIONS) that have a value: a report without them is what an
    older SDK sends, and what a daemon older than them accepts."""
    if process_started is not None:
        report["process_started"] = min(process_started, report["started"])
    if cfg.resumed_step is not None:
        report["resumed_step"] = cfg.resumed_step
    if open_phases:
        report["open_phases"] = open_phases
    if memory is not None:
        report["memory"] = memory
    if cfg.setup is not None:
        report["setup"] = cfg.setup
    if HOSTNAME is not None:
        report["hostname"] = HOSTNAME


def core(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` without the optional fields, for a daemon that refuses them as unknown."""
    return {key: value for key, value in report.items() if key not in EXTENSIONS}
