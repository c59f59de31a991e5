"""A job's goodput ledger on this node: its ranks' ledgers summed, as GET /v1/jobs/{job} and `gpumon
diagnose` show it ("goodput 71 % over 6 h; badput: restart 14 % (3 restarts, 2,400 steps redone), ...")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpumon.jobs.goodput.ledger import CAUSES, LedgerView

_NAMES = {"data_wait": "data wait", "lost_progress": "lost progress", "slow_steps": "slow steps"}


def ledger_json(ledgers: Sequence[LedgerView], restarts: int) -> dict[str, Any] | None:
    """The ledgers of a job's training ranks summed (rank-seconds), with shares; None without any."""
    known = [v for v in ledgers if v.since is not None]
    if not known:
        return None
    goodput = sum(v.goodput for v in known)
    badput = {cause: sum(v.badput[cause] for v in known) for cause in CAUSES}
    total = goodput + sum(badput.values())
    since = min(v.since for v in known if v.since is not None)
    until = max((v.until for v in known if v.until is not None), default=since)
    return {
        "ranks": len(known),
        "since": since,
        "until": until,
        "wall_clock_seconds": until - since,
        "rank_seconds": total,
        "goodput_seconds": goodput,
        "badput_seconds": badput,
        "pending_seconds": sum(v.pending for v in known),
        "goodput_ratio": goodput / total if total > 0 else None,
        "badput_ratios": {c: (b / total if total > 0 else None) for c, b in badput.items()},
        "restarts": restarts,
        "steps_redone": max(v.steps_redone for v in known),
    }


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _duration(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def ledger_line(ledger: dict[str, Any]) -> str:
    """'goodput 71 % over 6.0 h; badput: restart 14 % (3 restarts, 2,400 steps redone), checkpoint 9 %'."""
    ratio = ledger["goodput_ratio"]
    if ratio is None:
        return "goodput: nothing accounted yet"
    head = f"goodput {_pct(ratio)} over {_duration(ledger['wall_clock_seconds'])}"
    parts = []
    shares = ledger["badput_ratios"]
    for cause in sorted(CAUSES, key=lambda c: -(shares[c] or 0.0)):
        share = shares[cause] or 0.0
        if share < 0.005:
            continue
        text = f"{_NAMES.get(cause, cause)} {_pct(share)}"
        if cause == "restart":
            text += f" ({ledger['restarts']} restart{'s' if ledger['restarts'] != 1 else ''}"
            text += f", {ledger['steps_redone']:,.0f} steps redone)"
        elif cause == "lost_progress" and shares["restart"] is not None and shares["restart"] < 0.005:
            text += f" ({ledger['steps_redone']:,.0f} steps redone)"
        parts.append(text)
    return head + ("; badput: " + ", ".join(parts) if parts else "; no badput")
