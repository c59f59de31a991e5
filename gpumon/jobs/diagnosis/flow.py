"""The bottleneck flow of REFERENCE.md made operational: signals in, one verdict out, with its evidence.

Order matters and is the flow's: a job that makes no progress is idle or stalled whatever else is true;
a job waiting on input or on its peers is not limited by its GPUs' arithmetic; throttling and memory
capacity are checked before the GPU's own activity says whether memory bandwidth or compute is the limit.
Every signal is reported with its value and threshold, met or not, so a verdict can be checked by hand.
Missing signals (no phases reported, no profiling counters) are said to be missing, never treated as 0.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from gpumon.jobs.diagnosis.signals import Evidence, Signals, Thresholds, Verdict
from gpumon.jobs.diagnosis.wording import (
    ADVICE,
    OPEN_ADVICE,
    PEER_ADVICE,
    WAIT_ADVICE,
    clocks_note,
    fabric_note,
    fabric_trouble,
    flops_note,
    link_use,
    network_busy,
    nic_in_communication,
    nic_note,
    setup_note,
    shared_note,
    spans_nics,
    summary,
    unknown_device_note,
    waits_on_peers,
)


def _check(signal: str, value: float | None, threshold: float, op: str, unit: str = "ratio") -> Evidence:
    met = None if value is None else (value >= threshold if op == ">=" else value < threshold)
    return Evidence(signal, value, threshold, op, met, unit)


def diagnose(s: Signals, t: Thresholds, settle: Callable[[str], str] | None = None) -> Verdict:
    """``settle``: given this window's verdict, the one to show (state.VerdictHold's, so one window's
    excursion does not flip it)."""
    link = link_use(s)
    activity = s.sm_active if s.sm_active is not None else s.utilization
    ev = {
        "utilization_idle": _check("gpu_utilization_now", s.current_utilization, t.idle_utilization, "<"),
        # the GPU idles while the loop waits: below low_utilization, or idle at least half as long as the
        # loop waits (25 % waiting with the GPU 75 % busy is input-bound; 20 % with it 98 % busy is not)
        "utilization_low": _check("gpu_utilization", s.utilization, _idles_enough(s, t), "<"),
        "data_wait": _check("data_wait_share", s.data_wait_share, t.data_wait_share, ">="),
        "communication": _check("communication_share", s.communication_share, t.communication_share, ">="),
        "link": _check("link_utilization", link, t.link_busy, ">="),
        "sm_idle": _check(
            "sm_active" if s.sm_active is not None else "gpu_utilization", activity, t.sm_idle, "<"
        ),
        "throttled": _check("throttled_share", s.throttled_share, t.throttled_share, ">="),
        "slowdown": _check("slowdown", s.slowdown, t.throttle_impact, ">="),
        "memory": _check("memory_used_ratio", s.memory_used_ratio, t.memory_pressure, ">="),
        # one retry is a cache flush and a device synchronisation; one OOM is a failed step or a crash
        "retries": _check("alloc_retries", s.alloc_retries, 1, ">=", "count"),
        "ooms": _check("ooms", s.ooms, 1, ">=", "count"),
        "dram": _check("dram_active", s.dram_active, t.dram_busy, ">="),
        "tensor_low": _check("tensor_active", s.tensor_active, t.tensor_low, "<"),
        "tensor_busy": _check("tensor_active", s.tensor_active, t.tensor_busy, ">="),
        "sm_busy": _check("sm_active", s.sm_active, t.sm_busy, ">="),
        "util_busy": _check("gpu_utilization", s.utilization, t.utilization_busy, ">="),
    }
    if s.shared_with:
        ev["shared_busy"] = _check("shared_gpu_utilization", s.shared_utilization, t.low_utilization, ">=")
    if spans_nics(s):
        ev["nic"] = _check("nic_utilization_in_communication", nic_in_communication(s), t.nic_busy, ">=")
        ev["nic_errors"] = _check("nic_errors", s.nic_errors, 1, ">=", "count")
        if s.nic_retransmit_rate is not None or s.nic_cnp_rate is not None:  # RoCE ports with hw_counters
            ev["nic_retransmits"] = _check(
                "nic_retransmit_rate", s.nic_retransmit_rate, t.nic_retransmit_rate, ">=", "count"
            )
            ev["nic_congestion"] = _check("nic_cnp_rate", s.nic_cnp_rate, t.nic_cnp_rate, ">=", "count")
    compute = (
        bool(ev["tensor_busy"].met or ev["sm_busy"].met)
        or (s.tensor_active is None and s.sm_active is None and bool(ev["util_busy"].met))
        or _busy_sharing(s, t)
    )
    conditions = [
        (
            "input",
            bool(ev["data_wait"].met) and ev["utilization_low"].met is not False,
            ("data_wait", "utilization_low"),
        ),
        (
            "communication",
            bool(ev["communication"].met) or (bool(ev["link"].met) and bool(ev["sm_idle"].met)),
            ("communication", "link", "sm_idle", "nic", "nic_errors", "nic_retransmits", "nic_congestion"),
        ),
        # clocks held down are the bottleneck only when the job paid for them: a brief excursion, or a
        # limit the job does not feel, is a finding (clocks_limited)
        ("throttled", bool(ev["throttled"].met) and bool(ev["slowdown"].met), ("throttled", "slowdown")),
        ("memory_capacity", _memory_trouble(ev) and not compute, ("memory", "retries", "ooms")),
        ("memory_bandwidth", bool(ev["dram"].met) and bool(ev["tensor_low"].met), ("dram", "tensor_low")),
        ("compute", compute, ("tensor_busy", "sm_busy", "util_busy", "shared_busy")),
    ]
    used: tuple[str, ...]
    if s.gpu_down is not None:
        verdict, used = "gpu_down", ()
    elif s.exited is not None and not s.finished:
        verdict, used = "exited", ("utilization_idle",)
    elif (s.progressing is False or s.progressing is None) and not s.finished:
        verdict = "stalled" if ev["utilization_idle"].met is False else "idle"
        used = ("utilization_idle",)
    else:
        verdict, used = next(((name, keys) for name, ok, keys in conditions if ok), ("undetermined", ()))
    held = None  # this window's own verdict, when the one shown is held while a change settles
    if settle is not None and (shown := settle(verdict)) != verdict:
        held = verdict
        verdict, used = shown, next((keys for name, _, keys in conditions if name == shown), ())
    findings = [name for name, ok, _ in conditions if ok and name != verdict]
    if _memory_trouble(ev) and "memory_capacity" not in findings and verdict != "memory_capacity":
        findings.append("memory_capacity")
    notes = []
    if s.mfu is not None and s.mfu > 1.0:  # not a bottleneck: the reported FLOPs per token or dtype is wrong
        findings.append("mfu_above_peak")
    if (note := flops_note(s, t)) is not None:
        findings.append("flops_per_token_high")
        notes.append(note)
    if ev["throttled"].met and verdict != "throttled":
        findings.append("clocks_limited")
        notes.append(clocks_note(s))
    if (note := setup_note(s, t)) is not None:
        findings.append("setup_mismatch")
        notes.append(note)
    if s.unknown_devices:
        findings.append("unknown_device")
        notes.append(unknown_device_note(s))
    if s.shared_with:
        findings.append("gpu_shared")
        notes.append(shared_note(s))
    if spans_nics(s) and ((s.nic_errors or 0.0) >= 1 or s.nics_down):
        findings.append("nic_errors")
        notes.append(nic_note(s))
    if spans_nics(s) and fabric_trouble(s, t):
        findings.append("nic_congestion")
        notes.append(fabric_note(s))
    if s.finished:
        findings.append("finished")
    evidence = tuple(dict.fromkeys(ev[k] for k in (*used, *ev) if k in ev))
    waiting = verdict == "communication" and waits_on_peers(s, t)
    # the NICs idle while the rank waits in collectives: a slower peer, not the network
    peer = waiting and network_busy(s, t) is False
    if peer:
        findings.append("waiting_on_peers")
    line = summary("peer_wait" if peer else "communication_wait" if waiting else verdict, s)
    if held is not None:
        # the figures are this window's, and may no longer meet the verdict held: say so, not a contradiction
        line = f"{verdict} (held while a change settles; this window reads {held}): {line}"
    if s.finished and verdict != "gpu_down":
        line = f"finished; over its last window {line}"
    advice = PEER_ADVICE if peer else WAIT_ADVICE if waiting else ADVICE[verdict]
    if verdict in ("stalled", "idle") and s.open_phase is not None:
        advice = OPEN_ADVICE.get(s.open_phase[0], advice)
    return Verdict(verdict, line, advice, evidence, tuple(findings), tuple(notes))


def _idles_enough(s: Signals, t: Thresholds) -> float:
    return max(t.low_utilization, 1.0 - (s.data_wait_share or 0.0) / 2)


def _busy_sharing(s: Signals, t: Thresholds) -> bool:
    """On a GPU shared with other work: the GPU is busy and the job itself says it waits on nothing (a wait
    phase it reports stays below its threshold, or its own per-process use shows it keeps the GPU busy), so
    GPU work, its own or its neighbour's competing with it, is what it waits for."""
    if not s.shared_with or s.shared_utilization is None or s.shared_utilization < t.low_utilization:
        return False
    busy_itself = s.own_utilization and s.utilization is not None and s.utilization >= t.sm_idle
    if s.data_wait_share is None and s.communication_share is None and not busy_itself:
        return False  # no wait phase to go by, nor its own per-process use
    return (s.data_wait_share or 0.0) < t.data_wait_share and (
        s.communication_share or 0.0
    ) < t.communication_share


def _memory_trouble(ev: dict[str, Evidence]) -> bool:
    """HBM nearly full, or the allocator retrying or running out: a memory finding either way."""
    return bool(ev["memory"].met or ev["retries"].met or ev["ooms"].met)


def straggler_scores(costs: Sequence[float | None]) -> list[float | None]:
    """1 - median/own for each rank's cost (busy seconds per step, or seconds per token); 0 at or below
    the median, toward 1 as a rank falls behind. Fewer than two measured ranks: no straggler to speak of."""
    known = [c for c in costs if c is not None and c > 0]
    if len(known) < 2:
        return [0.0 if c is not None else None for c in costs]
    median = statistics.median(known)
    return [None if c is None else (0.0 if c <= 0 else max(0.0, 1.0 - median / c)) for c in costs]
