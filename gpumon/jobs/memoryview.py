"""A rank's memory as its allocator sees it, beside what the estimator says it should need.

The SDK reports ``torch.cuda.memory_stats()`` (``memory``) and, when the training loop declared them, the
model's shape, micro-batch and ZeRO stage (``setup``). From those this module builds the rank's memory
section of GET /v1/jobs/{job} and `gpumon diagnose`: the estimated breakdown (weights, gradients, optimizer
states, activations) against the observed allocated and reserved bytes, the gap named, and, when the
allocator retries or runs out of memory, advice with the lowest ZeRO stage the estimate says would fit.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from gpumon.client.model import ModelSpec
from gpumon.estimate.breakdown import DTYPES, Estimate, Setup, estimate
from gpumon.jobs.report import Memory, Report

FIT = 0.90  # of a GPU's HBM: what a stage must stay under to "fit" (the CUDA context, NCCL, workspace)
GIB = 1024.0**3


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


@functools.lru_cache(maxsize=256)
def _estimate(key: tuple[tuple[str, Any], ...], shape: tuple[tuple[str, Any], ...]) -> Estimate | str:
    """The estimate for a setup, or why there is none (cached: the same ranks ask on every request)."""
    try:
        return estimate(ModelSpec(**dict(shape)), Setup(**dict(key)))
    except (TypeError, ValueError) as exc:
        return str(exc)


def rank_estimate(r: Report, zero: int | None = None) -> Estimate | str | None:
    """The estimate for the rank's declared setup (at ZeRO stage ``zero`` if given), a problem, or None."""
    s = r.setup
    if s is None:
        return None
    dtype = "fp32" if r.dtype == "tf32" else r.dtype  # TF32 keeps fp32 tensors; only matmuls differ
    if dtype is None or dtype not in DTYPES:
        return f"the estimator needs the rank's dtype (one of {', '.join(DTYPES)}, tf32), got {r.dtype!r}"
    tp = int(s.get("tp", 1))
    setup: dict[str, Any] = {
        "batch": s["micro_batch"],
        "dtype": dtype,
        "zero": s["zero_stage"] if zero is None else zero,
        "tp": tp,
        "dp": max(1, r.world_size // tp),  # data-parallel ranks: ZeRO shards over them
        "convention": r.flops_convention if r.flops_convention in ("palm", "megatron") else "palm",
    }
    for key in ("optimizer", "checkpointing", "offload", "flash_attention", "sequence_parallel"):
        if key in s:
            setup[key] = s[key]
    model: Mapping[str, Any] = s["model"]
    return _estimate(tuple(sorted(setup.items())), tuple(sorted(model.items())))


def memory_json(
    r: Report, hbm_bytes: float | None, retries: float | None, ooms: float | None
) -> dict[str, Any]:
    """The rank's memory section: observed, estimated, the gap, and advice when the allocator struggles."""
    m = r.memory
    out: dict[str, Any] = {"observed": None if m is None else observed_json(m), "estimate": None}
    est = rank_estimate(r)
    if isinstance(est, str):
        out["estimate_problem"] = est
    elif est is not None:
        out["estimate"] = estimate_json(est, r.kind == "train")
    out["gap"] = gap(m, est if isinstance(est, Estimate) else None, r.kind == "train")
    out["advice"] = advice(r, hbm_bytes, retries, ooms)
    return out


def estimate_json(est: Estimate, train: bool) -> dict[str, Any]:
    """The breakdown for training (weights, gradients, optimizer states, activations) or serving (weights,
    KV cache), in bytes per GPU."""
    if train:
        parts = {
            "weights": est.weights_bytes,
            "gradients": est.gradients_bytes,
            "optimizer_states": est.optimizer_states_bytes,
            "activations": est.activations_bytes,
        }
    else:
        parts = {"weights": est.inference_weights_bytes, "kv_cache": est.kv_cache_bytes}
    return {
        "kind": "train" if train else "inference",
        "zero_stage": est.setup.zero,
        "offload": est.setup.offload,
        "micro_batch": est.setup.batch,
        "parts_bytes": parts,
        "total_bytes": sum(parts.values()),
    }


def observed_json(m: Memory) -> dict[str, Any]:
    return {
        "device": m.device,
        "allocated_bytes": m.allocated_bytes,
        "allocated_peak_bytes": m.allocated_peak_bytes,
        "reserved_bytes": m.reserved_bytes,
        "reserved_peak_bytes": m.reserved_peak_bytes,
        "active_bytes": m.active_bytes,
        "active_peak_bytes": m.active_peak_bytes,
        "inactive_split_bytes": m.inactive_split_bytes,
        "alloc_retries": m.alloc_retries,
        "ooms": m.ooms,
    }


def gap(m: Memory | None, est: Estimate | None, train: bool = True) -> str | None:
    """One sentence setting the allocator's peak against the estimate, or None when either is missing."""
    if m is None or est is None:
        return None
    peak = m.allocated_peak_bytes if m.allocated_peak_bytes is not None else m.allocated_bytes
    if peak is None:
        return None
    total = est.train_total_bytes if train else est.inference_total_bytes
    diff = peak - total
    share = f" ({100 * abs(diff) / total:.0f} %)" if total > 0 else ""
    reserved = "" if m.reserved_peak_bytes is None else f", {_gib(m.reserved_peak_bytes)} reserved at peak"
    head = f"allocator peak {_gib(peak)} allocated{reserved}; estimate {_gib(total)}"
    if abs(diff) <= 0.05 * total:
        return f"{head}: within 5 %, the estimate accounts for the memory"
    if diff > 0:
        return (
            f"{head}: {_gib(diff)}{share} more than estimated: temporary buffers (logits, casts, "
            "communication buckets, workspaces) or tensors the estimate does not model"
        )
    return (
        f"{head}: {_gib(-diff)}{share} less than estimated: the setup declared may not be the one running "
        "(activation checkpointing, a smaller micro-batch, a higher ZeRO stage, offload)"
    )


def advice(r: Report, hbm_bytes: float | None, retries: float | None, ooms: float | None) -> list[str]:
    """What to do when the allocator retries or fails; empty when it does neither."""
    if not (retries or ooms):
        return []
    out = [
        f"{retries or 0:.0f} allocation retries and {ooms or 0:.0f} OOMs in the window: set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to stop fragmentation from forcing cache flushes",
        "lower the micro-batch (keep the global batch with gradient accumulation), or turn on activation "
        "checkpointing",
    ]
    stage = fitting_stage(r, hbm_bytes) if r.kind == "train" else None
    if stage is not None:
        out.append(stage)
    return out


def fitting_stage(r: Report, hbm_bytes: float | None) -> str | None:
    """The lowest ZeRO stage above the rank's that the estimate fits into the GPU's HBM, as advice."""
    current = rank_estimate(r)
    if r.setup is None or not hbm_bytes or not isinstance(current, Estimate):
        return None
    budget = FIT * hbm_bytes
    if current.train_total_bytes <= budget and r.setup["zero_stage"] == 3:
        return None
    for stage in range(int(r.setup["zero_stage"]) + 1, 4):
        est = rank_estimate(r, zero=stage)
        if isinstance(est, Estimate) and est.train_total_bytes <= budget:
            return (
                f"ZeRO stage {stage} would need an estimated {_gib(est.train_total_bytes)} per GPU, within "
                f"{100 * FIT:.0f} % of the {_gib(hbm_bytes)} HBM (stage {r.setup['zero_stage']}: "
                f"{_gib(current.train_total_bytes)})"
            )
    share = f"{100 * FIT:.0f} % of {_gib(hbm_bytes)}"
    return f"no ZeRO stage fits the estimate into {share}: shard further (tp) or shrink"
