"""Wire-protocol v1 reports for daemon-side tests, built the way the SDK builds them."""

from __future__ import annotations

import time
from typing import Any

from gpumon.client import protocol as P

# in the past: the daemon refuses reports from more than a few seconds ahead of its clock (store.FUTURE_SKEW)
T0 = 1_700_000_000.0


def histogram(steps: int, seconds_each: float = 0.1) -> dict[str, Any]:
    counts = [0] * (len(P.BUCKETS) + 1)
    if steps:
        i = next((n for n, b in enumerate(P.BUCKETS) if seconds_each <= b), len(P.BUCKETS))
        counts[i] = steps
    return {"counts": counts, "sum": steps * seconds_each}


def report(
    steps: int = 10,
    *,
    t: float | None = None,
    seq: int | None = None,
    tokens_per_step: int = 1000,
    step_seconds: float = 0.1,
    phases: dict[str, float] | None = None,
    started: float | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """A training rank that ran ``steps`` steps of ``step_seconds`` each, starting at ``started``."""
    started = T0 if started is None else started
    first = started + step_seconds  # the first step() call starts the clock
    updated = first + (steps - 1) * step_seconds if steps else None
    data: dict[str, Any] = {
        "v": 1,
        "job": "llm",
        "rank": 0,
        "world_size": 1,
        "local_rank": 0,
        "kind": "train",
        "workload": None,
        "incarnation": "a1b2c3d4",
        "pid": 4242,
        "seq": steps if seq is None else seq,
        "time": (updated or started) if t is None else t,
        "started": started,
        "devices": ["0"],
        "dtype": "bf16",
        "flops_per_token": 6e9,
        "flops_convention": "palm",
        "peak_flops": None,
        "totals": {"steps": steps, "tokens": steps * tokens_per_step, "samples": steps, "requests": 0},
        "updated": updated,
        "anchor": None
        if not steps
        else {"time": first, "steps": 1, "tokens": tokens_per_step, "samples": 1, "requests": 0},
        "step_seconds": histogram(max(0, steps - 1), step_seconds),
        "request_seconds": None,
        "phases": phases if phases is not None else {},
        "final": False,
    }
    data.update(overrides)
    return data


def now_report(steps: int = 10, **kw: Any) -> dict[str, Any]:
    """A report whose last step just happened (for tests against a live daemon clock)."""
    step_seconds = kw.pop("step_seconds", 0.1)
    started = time.time() - steps * step_seconds
    return report(steps, started=started, step_seconds=step_seconds, **kw)
