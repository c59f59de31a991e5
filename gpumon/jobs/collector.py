"""Job store + analysis → Prometheus metric families, built fresh per scrape (reports arrive between them)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

from gpumon import metrics as M
from gpumon.baselines.jobfigures import Against, against
from gpumon.baselines.library import Library
from gpumon.baselines.watch import LibraryWatch
from gpumon.client import protocol as P
from gpumon.jobs.analysis import Analysis, JobResult, RankResult
from gpumon.jobs.diagnosis import BOTTLENECKS
from gpumon.jobs.families import RowFamily
from gpumon.jobs.goodput.carry import CarryGate
from gpumon.jobs.goodput.ledger import CAUSES, LedgerView
from gpumon.jobs.store import RankView

OUTCOMES = (
    "accepted",
    "duplicate",
    "invalid",
    "unauthorized",
    "forbidden",
    "too_large",
    "timeout",
    "job_limit",
    "rank_limit",
    "conflict",
)
_ALWAYS = (M.INGEST_REPORTS, M.INGEST_EXPIRED, M.LIBRARY_ENTRIES, M.LIBRARY_OK)
_PER_SCRAPE = [m for m in M.TRAINING_FLOW if m not in _ALWAYS]
_LE = [*(floatToGoString(b) for b in P.BUCKETS), "+Inf"]  # "1.0", as prometheus_client writes it


class IngestStats:
    """Report outcomes since start; every outcome is exported from the start, so rate() sees the first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(OUTCOMES, 0)

    def count(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1

    @property
    def total(self) -> int:
        """Every report counted so far: it changes whenever the job store may have."""
        return sum(self.counts.values())


def _family(m: M.Metric) -> RowFamily:
    return RowFamily(m.name, m.help, m.type, m.labels)


def _buckets(offset: tuple[float, ...], counts: tuple[float, ...]) -> list[tuple[str, float]]:
    total = 0.0
    out = []
    for le, a, b in zip(_LE, offset, counts, strict=True):
        total += a + b
        out.append((le, total))
    return out


class TrainingCollector:
    def __init__(self, analysis: Analysis, stats: IngestStats, library: LibraryWatch | None = None) -> None:
        self.analysis = analysis
        self.stats = stats
        self.library = library
        self.carry = CarryGate()

    def describe(self) -> list[Metric]:
        """Every family this collector can yield, so ``/metrics?name[]=`` can select training series."""
        return [_family(m) for m in M.TRAINING_FLOW]

    def collect(self) -> Iterator[Metric]:
        f: dict[str, Any] = {m.name: _family(m) for m in _PER_SCRAPE}
        lib = self.library.library() if self.library is not None else None
        now = self.analysis.clock()
        live: set[tuple[str, int]] = set()
        for job in self.analysis.jobs(now):
            _add_job(f, job, self.carry)
            live.update((job.job, r.view.report.rank) for r in job.ranks)
            if lib is not None:
                _add_baseline(f, job, lib, self.analysis.store.baseline_steps)
        exported = set(live)
        for job_name, rank, ledger in self.analysis.store.gone_ledgers(now):
            if (job_name, rank) not in live:  # it went between the two reads: exported above already
                _add_ledger(f, [job_name, str(rank)], ledger, self.carry.held((job_name, rank), ledger)[0])
                exported.add((job_name, rank))
        self.carry.keep(exported)
        for job_name, lost in self.analysis.store.lost(now).items():
            f[M.RANKS_LOST.name].add_metric([job_name], lost)
        yield from (fam for fam in f.values() if fam.rows)
        reports = _family(M.INGEST_REPORTS)
        for outcome, n in self.stats.counts.items():
            reports.add_metric([outcome], n)
        yield reports
        expired = _family(M.INGEST_EXPIRED)
        expired.add_metric([], self.analysis.store.expired)
        yield expired
        if self.library is not None:
            entries, ok = _family(M.LIBRARY_ENTRIES), _family(M.LIBRARY_OK)
            entries.add_metric([], len(lib.baselines) if lib is not None else 0)
            ok.add_metric([], 1 if self.library.ok else 0)
            yield entries
            yield ok


def _opt(f: dict[str, Any], m: M.Metric, labels: list[str], value: float | None) -> None:
    if value is not None:
        f[m.name].add_metric(labels, value)


def _add_job(f: dict[str, Any], j: JobResult, carry: CarryGate) -> None:
    jl = [j.job]
    f[M.JOB_RANKS.name].add_metric([*jl, rank_ranges(r.view.report.rank for r in j.ranks)], len(j.ranks))
    if any(r.gone is None for r in j.ranks):  # a job with no rank running has no throughput to add up
        _opt(f, M.JOB_TOKENS_RATE, jl, j.tokens_per_second)
        _opt(f, M.JOB_MFU, jl, j.mfu)
    for b in BOTTLENECKS:
        f[M.JOB_BOTTLENECK.name].add_metric([*jl, b], 1 if j.verdict.bottleneck == b else 0)
    for r in j.ranks:
        _add_rank(f, r, carry)


RANGES_MAX = 120  # characters: a node's ranks are few; an odd spread of them is cut, not a huge label


def rank_ranges(ranks: Iterable[int]) -> str:
    """The ranks as runs, "8-15" or "0-3,6,9-10": what an alert prints to name a node's share of a job."""
    runs: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return text if len(text) <= RANGES_MAX else text[: text.rfind(",", 0, RANGES_MAX - 3)] + ",..."


def _add_rank(f: dict[str, Any], r: RankResult, carry: CarryGate) -> None:
    rep = r.view.report
    held, moves = carry.held((rep.job, rep.rank), r.view.ledger)
    off = r.view.offsets
    rl = [rep.job, str(rep.rank)]
    f[M.RANK_INFO.name].add_metric(
        [
            *rl,
            str(rep.world_size),
            "" if rep.local_rank is None else str(rep.local_rank),
            rep.kind,
            rep.workload or "",
            rep.dtype or "",
            rep.flops_convention or "",
        ],
        1,
    )
    # a rank gone holds no GPU, one loading none yet that steps: the job's GPU count leaves them out
    for u in r.gpus if r.counts else ():
        w = u.window
        f[M.RANK_GPU_INFO.name].add_metric([*rl, str(w.index), w.uuid, w.mig_uuid or "", u.via], 1)
    f[M.LAST_REPORT.name].add_metric(rl, rep.time)
    _opt(f, M.LAST_PROGRESS, rl, rep.updated)
    f[M.RESTARTS.name].add_metric(rl, r.view.restarts + r.view.ledger.moves - moves)
    totals = r.view.totals()
    f[M.STEPS.name].add_metric(rl, totals["steps"])
    f[M.TOKENS.name].add_metric(rl, totals["tokens"])
    f[M.SAMPLES_TOTAL.name].add_metric(rl, totals["samples"])
    if rep.kind == "inference" or totals["requests"]:
        f[M.REQUESTS.name].add_metric(rl, totals["requests"])
    h = rep.step_seconds
    f[M.STEP_DURATION.name].add_metric(rl, _buckets(off.step_counts, h.counts), off.step_sum + h.sum)
    if rep.request_seconds is not None:
        q = rep.request_seconds
        f[M.REQUEST_DURATION.name].add_metric(
            rl, _buckets(off.request_counts, q.counts), off.request_sum + q.sum
        )
    for phase, seconds in r.view.phases().items():
        f[M.PHASE_SECONDS.name].add_metric([*rl, phase], seconds)
    if r.counts:  # a rank gone, or loading, has no rates: the job's rules add up the ranks that step
        _add_rates(f, rl, r)
    for b in BOTTLENECKS:
        f[M.BOTTLENECK.name].add_metric([*rl, b], 1 if r.verdict.bottleneck == b else 0)
    if rep.kind == "train":
        _add_ledger(f, rl, r.view.ledger, held)
    _add_allocator(f, rl, r.view)


def _add_rates(f: dict[str, Any], rl: list[str], r: RankResult) -> None:
    rt = r.rates
    _opt(f, M.TOKENS_RATE, rl, rt.tokens_per_second)
    _opt(f, M.SAMPLES_RATE, rl, rt.samples_per_second)
    _opt(f, M.STEP_TIME, rl, rt.step_time_seconds)
    for phase, ratio in sorted(rt.phase_ratios.items()):
        f[M.PHASE_RATIO.name].add_metric([*rl, phase], ratio)
    _opt(f, M.FLOPS, rl, r.flops)
    _opt(f, M.PEAK_FLOPS, rl, r.peak.flops)
    _opt(f, M.MFU, rl, r.mfu)
    _opt(f, M.TOKENS_PER_JOULE, rl, r.tokens_per_joule)
    _opt(f, M.STRAGGLER, rl, r.straggler)


def _add_ledger(f: dict[str, Any], rl: list[str], ledger: LedgerView, held: float) -> None:
    """``held``: restart seconds carried from another node's process, not yet published (goodput/carry.py)."""
    f[M.GOODPUT.name].add_metric(rl, ledger.goodput)
    for cause in CAUSES:
        seconds = ledger.badput[cause] - (held if cause == "restart" else 0.0)
        f[M.BADPUT.name].add_metric([*rl, cause], seconds)
    f[M.STEPS_REDONE.name].add_metric(rl, ledger.steps_redone)


def _add_allocator(f: dict[str, Any], rl: list[str], v: RankView) -> None:
    m = v.report.memory
    if m is not None:
        _opt(f, M.ALLOCATOR_ALLOCATED, rl, m.allocated_bytes)
        _opt(f, M.ALLOCATOR_ALLOCATED_PEAK, rl, m.allocated_peak_bytes)
        _opt(f, M.ALLOCATOR_RESERVED, rl, m.reserved_bytes)
        _opt(f, M.ALLOCATOR_RESERVED_PEAK, rl, m.reserved_peak_bytes)
        _opt(f, M.ALLOCATOR_FRAGMENTATION, rl, fragmentation(m.allocated_bytes, m.reserved_bytes))
    # the counters stay once known, through a report without them: a series that went and came back lower
    # would read as a reset
    counts = v.allocator_counts()
    if counts is not None:
        _opt(f, M.ALLOCATOR_RETRIES, rl, counts[0])
        _opt(f, M.ALLOCATOR_OOMS, rl, counts[1])


def fragmentation(allocated: float | None, reserved: float | None) -> float | None:
    """1 - allocated/reserved: the share of the allocator's memory not holding tensors."""
    if allocated is None or not reserved:
        return None
    return min(1.0, max(0.0, 1.0 - allocated / reserved))


def _add_baseline(f: dict[str, Any], j: JobResult, lib: Library, steps: dict[str, float]) -> None:
    a = against(j, lib)
    note_baseline_step(steps, j.job, a)
    base, c = a.baseline, a.ratios
    if base is None or c is None:
        return
    jl = [j.job]
    k = base.key
    info = [*jl, base.name, k.workload, k.gpu_model, str(k.gpus), k.dtype, k.flops_convention]
    f[M.BASELINE_INFO.name].add_metric(info, 1)
    b = base.figures
    _opt(f, M.BASELINE_TOKENS, jl, b.tokens_per_second_per_gpu)
    _opt(f, M.BASELINE_STEP_TIME, jl, b.step_time_seconds)
    _opt(f, M.BASELINE_MFU, jl, b.mfu)
    _opt(f, M.BASELINE_TPJ, jl, b.tokens_per_joule)
    ref = a.reference
    if ref is not None and ref.figures.tokens_per_second_per_gpu is not None:
        f[M.SCALING_BASELINE.name].add_metric([*jl, str(ref.key.gpus)], ref.figures.tokens_per_second_per_gpu)
    _opt(f, M.THROUGHPUT_RATIO, jl, c.tokens_per_second_per_gpu)
    _opt(f, M.MFU_RATIO, jl, c.mfu)
    _opt(f, M.STEP_TIME_RATIO, jl, c.step_time_seconds)
    _opt(f, M.TPJ_RATIO, jl, c.tokens_per_joule)


def note_baseline_step(steps: dict[str, float], job: str, a: Against) -> None:
    """Keep the job's baseline step time where the goodput ledger reads it (its slow steps)."""
    step = a.baseline.figures.step_time_seconds if a.baseline is not None else None
    if step:
        steps[job] = step
    else:
        steps.pop(job, None)
