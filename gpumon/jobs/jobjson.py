"""GET /v1/jobs/{job}: an analysed job as JSON, every figure with what it was computed from."""

from __future__ import annotations

from typing import Any

from gpumon.jobs.analysis import JobResult, RankResult
from gpumon.jobs.goodput.summary import ledger_json, ledger_line
from gpumon.jobs.memoryview import memory_json


def job_json(j: JobResult, window: float) -> dict[str, Any]:
    """GET /v1/jobs/{job}: everything the daemon knows and concludes, with the evidence."""
    return {
        "job": j.job,
        "window_seconds": window,
        "ranks_on_node": len(j.ranks),
        "tokens_per_second": j.tokens_per_second,
        "mfu": j.mfu,
        "diagnosis": j.verdict.json(),
        "goodput": _job_ledger(j),
        "ranks": [_rank_json(r) for r in j.ranks],
    }


def _job_ledger(j: JobResult) -> dict[str, Any] | None:
    train = [r for r in j.ranks if r.view.report.kind == "train"]
    restarts = max((r.view.restarts + r.view.ledger.moves for r in train), default=0)
    ledger = ledger_json([r.view.ledger for r in train], restarts)
    if ledger is not None:
        ledger["summary"] = ledger_line(ledger)
    return ledger


def _rank_memory(r: RankResult) -> dict[str, Any] | None:
    rep = r.view.report
    if rep.memory is None and rep.setup is None:
        return None
    hbm = [u.window.memory_total_bytes for u in r.gpus if u.window.memory_total_bytes]
    out = memory_json(rep, min(hbm) if hbm else None, r.rates.alloc_retries, r.rates.ooms)
    counts = r.view.allocator_counts()
    if counts is not None:
        out["alloc_retries_total"], out["ooms_total"] = counts
    return out


def _rank_json(r: RankResult) -> dict[str, Any]:
    rep = r.view.report
    rt = r.rates
    span = rt.span
    return {
        "rank": rep.rank,
        "world_size": rep.world_size,
        "local_rank": rep.local_rank,
        "kind": rep.kind,
        "workload": rep.workload,
        "pid": rep.pid,
        "incarnation": rep.incarnation,
        "restarts": r.view.restarts + r.view.ledger.moves,
        "final": rep.final,
        "gone": r.gone,
        "last_report": rep.time,
        "last_progress": rep.updated,
        "totals": r.view.totals(),
        "phases_seconds": r.view.phases(),
        "rates": {
            "progressing": rt.progressing,
            "tokens_per_second": rt.tokens_per_second,
            "samples_per_second": rt.samples_per_second,
            "steps_per_second": rt.steps_per_second,
            "requests_per_second": rt.requests_per_second,
            "step_time_seconds": rt.step_time_seconds,
            "phase_ratios": rt.phase_ratios,
            "span": None
            if span is None
            else {"start": span.start, "end": span.end, "steps": span.steps, "tokens": span.tokens},
        },
        "dtype": rep.dtype,
        "flops_per_token": rep.flops_per_token,
        "flops_convention": rep.flops_convention,
        "flops_per_second": r.flops,
        "peak_flops_per_second": r.peak.flops,
        "peak_source": r.peak.source,
        "peak_problem": r.peak.problem,
        "mfu": r.mfu,
        "tokens_per_joule": r.tokens_per_joule,
        "straggler_score": r.straggler,
        "gpus": [
            {
                "index": u.window.index,
                "up": u.window.up,
                "down_reason": u.window.down_reason,
                "uuid": u.window.uuid,
                "name": u.window.name,
                "via": u.via,
                "mig_uuid": u.window.mig_uuid,
                "mig_profile": u.window.mig_profile,
                "shared_by_ranks": u.sharers,
                "shared_with": list(u.shared_with),
                "utilization": u.window.utilization,
                "sm_active": u.window.sm_active,
                "tensor_active": u.window.tensor_active,
                "dram_active": u.window.dram_active,
                "memory_used_bytes": u.window.memory_used_bytes,
                "memory_total_bytes": u.window.memory_total_bytes,
                "power_watts": u.window.power_watts,
                "throttled_share": u.window.throttled_share,
            }
            for u in r.gpus
        ],
        "diagnosis": r.verdict.json(),
        "ledger": _rank_ledger(r),
        "memory": _rank_memory(r),
    }


def _rank_ledger(r: RankResult) -> dict[str, Any] | None:
    v = r.view.ledger
    if r.view.report.kind != "train" or v.since is None:
        return None
    return {
        "since": v.since,
        "until": v.until,
        "goodput_seconds": v.goodput,
        "badput_seconds": dict(v.badput),
        "pending_seconds": v.pending,
        "steps_redone": v.steps_redone,
        "high_water_step": v.high_step,
    }
