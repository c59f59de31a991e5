"""gpumon estimate --job: the estimate set against the memory a running job's GPUs hold.

The daemon's ``GET /v1/jobs/{job}`` gives each rank's GPUs as NVML sees them; the comparison is per rank.
"""

from __future__ import annotations

import math
from typing import Any

from gpumon.cli.daemon_api import DaemonError, display_url, get_json, job_path
from gpumon.config import ConfigError
from gpumon.estimate.breakdown import Estimate


def fetch_timeout(text: str) -> float:
    """--fetch-timeout in seconds; a ConfigError (exit 2) unless a positive number."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"--fetch-timeout: expected a positive number of seconds, got {text!r}")
    return value


def fetch_job(base: str, job: str, timeout: float) -> dict[str, Any]:
    """The daemon's ``GET /v1/jobs/{job}``. Raises DaemonError (exit 1) with a one-line reason."""
    path = job_path(job)
    data = get_json(
        base,
        path,
        timeout=timeout,
        missing=f"the daemon at {display_url(base)} does not know job {job!r} (a job appears once its "
        "processes report through the gpumon SDK)",
    )
    if not isinstance(data.get("ranks"), list):
        raise DaemonError(f"the daemon answered {base.rstrip('/')}{path} without a list of ranks")
    return data


def _bytes(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _sharers(gpu: dict[str, Any]) -> int:
    n = gpu.get("shared_by_ranks")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def compare(est: Estimate, job: str, data: dict[str, Any]) -> dict[str, Any]:
    """Per rank: the estimate (per GPU x the rank's GPUs; training or serving by the rank's ``kind``) against
    the memory NVML says those GPUs use. A GPU that n ranks share counts 1/n of its memory against each."""
    per_gpu = {"train": est.train_total_bytes, "inference": est.inference_total_bytes}
    ranks = []
    for entry in data["ranks"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("gpus"), list):
            raise DaemonError(f"the daemon's answer for job {job!r} has a rank without a list of GPUs")
        kind = next((k for k in (entry.get("kind"), data.get("kind")) if k in per_gpu), "train")
        gpus = [g for g in entry["gpus"] if isinstance(g, dict)]
        used = [_bytes(g.get("memory_used_bytes")) for g in gpus]
        total = [_bytes(g.get("memory_total_bytes")) for g in gpus]
        shares = [_sharers(g) for g in gpus]
        actual = None
        if gpus and all(u is not None for u in used):
            actual = sum(u / n for u, n in zip(used, shares, strict=True) if u is not None)
        capacity = None
        if gpus and all(t is not None for t in total):
            capacity = sum(t / n for t, n in zip(total, shares, strict=True) if t is not None)
        estimated = per_gpu[kind] * len(gpus)
        ranks.append(
            {
                "rank": entry.get("rank"),
                "kind": kind,
                "gpus": [g.get("uuid") for g in gpus],
                "shared": any(n > 1 for n in shares),
                "estimated_bytes": estimated,
                "actual_bytes": actual,
                "memory_total_bytes": capacity,
                "ratio": actual / estimated if actual is not None and estimated > 0 else None,
            }
        )
    ranks.sort(key=lambda r: r["rank"] if isinstance(r["rank"], int) else -1)
    return {
        "job": job,
        "estimated_per_gpu_bytes": {"train": per_gpu["train"], "inference": per_gpu["inference"]},
        "ranks": ranks,
    }
