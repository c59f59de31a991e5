"""A job on this node as a baseline sees it: the key it matches on, and its figures right now.

The key comes from what the ranks declared (workload, dtype, FLOPs convention, world size) and what the
GPUs are (NVML's name); a job whose ranks disagree, or whose GPUs are unknown or mixed, has no key and is
never compared, rather than compared with the wrong reference. Figures are per GPU on this node, so a node
of a 64-GPU job compares directly with a 64-GPU baseline; Prometheus sums nodes in the recording rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from gpumon.baselines.library import Baseline, Figures, Key, Library
from gpumon.jobs.analysis import JobResult

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class JobFigures:
    key: Key | None
    why_no_key: str | None
    gpus_on_node: int
    figures: Figures
    flops_per_token: float | None  # shared by every rank, else None
    peak_flops: float | None  # summed over the ranks
    power_watts: float | None  # summed over the job's distinct GPUs


def _one(values: Iterable[T]) -> T | None:
    s = set(values)
    return next(iter(s)) if len(s) == 1 else None


def job_key(j: JobResult) -> tuple[Key | None, str | None]:
    reps = [r.view.report for r in j.ranks]
    if not reps:
        return None, "no ranks"
    workloads = {rep.workload or rep.job for rep in reps}
    dtypes = {rep.dtype or "" for rep in reps}
    conventions = {rep.flops_convention or "" for rep in reps}
    worlds = {rep.world_size for rep in reps}
    per_rank = {len(r.gpus) for r in j.ranks}
    models = {u.window.name for r in j.ranks for u in r.gpus}
    for what, values in (
        ("workload", workloads),
        ("dtype", dtypes),
        ("FLOPs convention", conventions),
        ("world size", worlds),
    ):
        if len(values) > 1:
            return None, f"the ranks report different {what}s: {', '.join(sorted(map(str, values)))}"
    if 0 in per_rank or not models:
        return None, "a rank's GPU is not known (report device= or run where NVML lists its pid)"
    if len(models) > 1:
        return None, f"the job runs on different GPU models: {', '.join(sorted(models))}"
    if len(per_rank) > 1:
        return None, "the ranks use different numbers of GPUs"
    gpus = int(next(iter(worlds))) * next(iter(per_rank))
    return (
        Key(str(_one(workloads)), next(iter(models)), gpus, str(_one(dtypes)), str(_one(conventions))),
        None,
    )


def job_figures(j: JobResult) -> JobFigures:
    key, why = job_key(j)
    distinct = {(u.window.uuid, u.window.mig_uuid): u for r in j.ranks for u in r.gpus}
    mine: dict[tuple[str, str | None], int] = {}  # this job's ranks per GPU; u.sharers counts every job's
    for r in j.ranks:
        for u in r.gpus:
            mine[(u.window.uuid, u.window.mig_uuid)] = mine.get((u.window.uuid, u.window.mig_uuid), 0) + 1
    n = len(distinct)
    tps = j.tokens_per_second
    per_gpu = tps / n if tps is not None and n else None
    steps = [r.rates.step_time_seconds for r in j.ranks if r.rates.step_time_seconds is not None]
    step = sum(steps) / len(steps) if steps and len(steps) == len(j.ranks) else None
    # a GPU shared with other jobs is charged to this one by its share of the ranks on it, as the
    # recording rule job_name:gpumon_training_gpu_power_watts:sum does
    watts = [
        None if u.window.power_watts is None else u.window.power_watts * mine[k] / max(u.sharers, mine[k])
        for k, u in distinct.items()
    ]
    power = sum(w for w in watts if w is not None) if watts and None not in watts else None
    tpj = tps / power if tps is not None and power else None
    fpts = {r.view.report.flops_per_token for r in j.ranks}
    fpt = _one(fpts)
    peaks = [r.peak.flops for r in j.ranks]
    peak = sum(p for p in peaks if p) if peaks and all(peaks) else None
    return JobFigures(
        key,
        why,
        n,
        Figures(per_gpu, step, j.mfu, tpj),
        fpt if isinstance(fpt, float | int) else None,
        peak,
        power,
    )


@dataclass(frozen=True, slots=True)
class Comparison:
    """Current over baseline per figure (None where either side lacks it). Step time above 1 is slower;
    every other ratio below 1 is worse."""

    tokens_per_second_per_gpu: float | None
    step_time_seconds: float | None
    mfu: float | None
    tokens_per_joule: float | None


def compare(now: Figures, base: Baseline) -> Comparison:
    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    f = base.figures
    return Comparison(
        ratio(now.tokens_per_second_per_gpu, f.tokens_per_second_per_gpu),
        ratio(now.step_time_seconds, f.step_time_seconds),
        ratio(now.mfu, f.mfu),
        ratio(now.tokens_per_joule, f.tokens_per_joule),
    )


@dataclass(frozen=True, slots=True)
class Against:
    """A job on this node and the library: its figures, the baseline it matches, the scaling reference."""

    figures: JobFigures
    baseline: Baseline | None
    reference: Baseline | None  # the fewest-GPU baseline of the same workload, GPU model, dtype, convention
    ratios: Comparison | None


def against(j: JobResult, lib: Library) -> Against:
    """The one place a job is matched: the exported gauges and GET /v1/jobs/{job} both read this."""
    fig = job_figures(j)
    if fig.key is None:
        return Against(fig, None, None, None)
    base = lib.match(fig.key)
    ratios = None if base is None else compare(fig.figures, base)
    return Against(fig, base, lib.scaling_reference(fig.key), ratios)


def baseline_json(a: Against) -> dict[str, Any]:
    """The "baseline" part of GET /v1/jobs/{job}: the key, the figures now, the match and the ratios."""
    fig = a.figures
    return {
        "key": None if fig.key is None else asdict(fig.key),
        "why_no_key": fig.why_no_key,
        "gpus_on_node": fig.gpus_on_node,
        "current": asdict(fig.figures),
        "baseline": None if a.baseline is None else a.baseline.to_dict(),
        "ratios": None if a.ratios is None else asdict(a.ratios),
        "scaling_reference": None if a.reference is None else a.reference.name,
    }
