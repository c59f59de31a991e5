"""Steady-state figures of a job from its history: what ``gpumon baseline record`` stores.

The history's cumulative samples (every 10 s) are differenced between the ranks' step times, so each
interval holds whole steps; a sample with no new step extends the interval. Samples are dropped when they
cannot be steady: inside the warm-up (counted from the job's start as the daemon saw it, or its latest
restart or change of ranks or GPUs), or across such a change. Over the intervals left, the ideal step time
is the mean of the interval step times at or below median + 3·MAD (Google's goodput library measures its
ideal step time the same way; here the cut is never tighter than 2 % above the median, so ordinary jitter
in a very even run is not called slow), which leaves out checkpoints, data stalls and hiccups however long
they were; tokens/s per GPU, MFU and tokens per joule are the medians over those same intervals. Medians,
not means: one slow minute does not move a baseline.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumon.baselines.library import Figures

MIN_INTERVALS = 3
MAD_FACTOR = 3.0
# when nearly every interval is identical MAD is ~0, and 1 % of jitter would count as "slow": the cut is
# never tighter than this share of the median
MIN_SPREAD = 0.02


def method(interval: float) -> str:
    return (
        f"per {interval:g} s interval; warm-up and unsteady intervals dropped; step time: mean of interval "
        "step times <= median + max(3*MAD, 2 % of the median); tokens/s per GPU, MFU, tokens/J: medians "
        "over the same intervals"
    )


class NotSteady(Exception):
    """Not enough steady data; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Interval:
    start: float
    end: float
    tokens_per_second_per_gpu: float
    step_time_seconds: float
    mfu: float | None
    tokens_per_joule: float | None


@dataclass(frozen=True, slots=True)
class Steady:
    figures: Figures
    intervals: int  # used
    outliers: int  # steady-looking but slower than median + 3 MAD
    dropped: int  # unsteady (warm-up, restart, no step, ...)
    seconds: float  # span of the intervals considered
    spread: float | None  # MAD / median of tokens/s per GPU over the kept intervals


_SHAPE = ("ranks", "gpus", "restarts")


def _same_shape(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a[k] == b[k] for k in _SHAPE)


def intervals(samples: Sequence[Mapping[str, Any]]) -> tuple[list[Interval], int]:
    """Differences of samples, measured between the ranks' step times (not the sampling times, which fall
    mid-step and would make whole-step counts alias against the sampling period). A sample without a new
    step extends the interval, so steps longer than the sampling period, stalls and checkpoints become
    one long interval instead of a hole; a change of ranks, GPUs or incarnations starts afresh. Also
    returns how many samples were discarded as unsteady."""
    out: list[Interval] = []
    dropped = 0
    start: Mapping[str, Any] | None = None
    for b in samples:
        usable = b.get("progress") is not None and b["gpus"] > 0
        if start is None or not usable or not _same_shape(start, b):
            dropped += start is not None
            start = b if usable else None
            continue
        steps = b["steps"] - start["steps"]
        if steps <= 0:
            continue
        dt = b["progress"] - start["progress"]
        tokens = b["tokens"] - start["tokens"]
        if dt <= 0 or tokens <= 0:
            dropped += 1
            start = b
            continue
        tps = tokens / dt
        mfu = None
        if b["flops_per_token"] and b["peak_flops"]:
            mfu = tps * b["flops_per_token"] / b["peak_flops"]
        power = [p for p in (start["power_watts"], b["power_watts"]) if p]
        tpj = tps / (sum(power) / len(power)) if len(power) == 2 else None
        out.append(Interval(start["progress"], b["progress"], tps / b["gpus"], dt / steps, mfu, tpj))
        start = b
    return out, dropped


def steady(samples: Sequence[Mapping[str, Any]], *, window: float, warmup: float) -> Steady:
    if not samples:
        raise NotSteady("the daemon has no history for this job yet: it samples every 10 s")
    # the warm-up follows the job's start as the daemon saw it, or its latest restart or change of shape
    began = samples[0]["time"]
    for a, b in itertools.pairwise(samples):
        if not _same_shape(a, b):
            began = b["time"]
    last = samples[-1]["time"]
    start = max(began + warmup, last - window)
    considered = [s for s in samples if s["time"] >= start]
    found, dropped = intervals(considered)
    if len(found) < MIN_INTERVALS:
        raise NotSteady(
            f"only {len(found)} steady interval(s) in the window (need {MIN_INTERVALS}); the daemon has "
            f"{last - began:.0f} s of history for this job since it started (or last restarted), of which "
            f"the first {warmup:.0f} s count as warm-up: let it run longer, or shorten --warmup"
        )
    steps = [i.step_time_seconds for i in found]
    med = statistics.median(steps)
    mad = statistics.median(abs(x - med) for x in steps)
    cut = med + max(MAD_FACTOR * mad, MIN_SPREAD * med)
    kept = [i for i in found if i.step_time_seconds <= cut]
    tps = [i.tokens_per_second_per_gpu for i in kept]
    tps_med = statistics.median(tps)
    tps_mad = statistics.median(abs(x - tps_med) for x in tps)
    figures = Figures(
        tokens_per_second_per_gpu=tps_med,
        step_time_seconds=statistics.fmean(i.step_time_seconds for i in kept),
        mfu=_median([i.mfu for i in kept]),
        tokens_per_joule=_median([i.tokens_per_joule for i in kept]),
    )
    return Steady(
        figures,
        len(kept),
        len(found) - len(kept),
        dropped,
        found[-1].end - found[0].start,
        tps_mad / tps_med if tps_med else None,
    )


def _median(values: list[float | None]) -> float | None:
    """Only when every kept interval has the figure: a median of a biased subset would mislead."""
    if not values or any(v is None for v in values):
        return None
    return statistics.median(v for v in values if v is not None)
