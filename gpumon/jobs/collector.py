"""Job store + analysis → Prometheus metric families, built fresh per scrape (reports arrive between them)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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
from gpumon.jobs.goodput.ledger import CAUSES, LedgerView
from gpumon.jobs.series.families import RowFamily
from gpumon.jobs.series.jobsteps import JobSteps
from gpumon.jobs.store import RankView
from gpumon.nccl.reader import InspectorReader
from gpumon.ranges import runs
from gpumon.zerofirst import ZeroFirst

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
_ALWAYS = (
    M.INGEST_REPORTS,
    M.INGEST_EXPIRED,
    M.LIBRARY_ENTRIES,
    M.LIBRARY_OK,
    M.NCCL_RECORDS,
    M.NCCL_SKIPPED,
    M.NCCL_FILES,
)
_NCCL = (M.NCCL_OPERATIONS, M.NCCL_SECONDS, M.NCCL_BUS_BYTES, M.NCCL_RECORDS, M.NCCL_SKIPPED, M.NCCL_FILES)
_LE = [*(floatToGoString(b) for b in P.BUCKETS), "+Inf"]  # "1.0", as prometheus_client writes it
# a job's step-time buckets on the node: the ranks' from 10 ms (a training step under 10 ms is a toy's; the
# per-rank buckets under rank-step-buckets keep the finer ones)
JOB_STEP_FROM = 0.01
_JOB_LE = {le for b, le in zip(P.BUCKETS, _LE, strict=False) if b >= JOB_STEP_FROM} | {"+Inf"}


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


def _family(m: M.Metric, typ: str | None = None) -> RowFamily:
    return RowFamily(m.name, m.help, typ or m.type, m.labels)


def _plus(offset: tuple[float, ...], counts: tuple[float, ...]) -> tuple[float, ...]:
    """A histogram's counts per bucket over the rank's processes: the earlier ones' and the current one's."""
    return tuple(a + b for a, b in zip(offset, counts, strict=True))


def _cumulative(counts: tuple[float, ...]) -> list[tuple[str, float]]:
    total = 0.0
    out = []
    for le, n in zip(_LE, counts, strict=True):
        total += n
        out.append((le, total))
    return out


@dataclass
class _Render:
    """One render's families and what the collector keeps between renders."""

    f: dict[str, Any]
    first: ZeroFirst
    steps: JobSteps
    now: float  # the render's clock
    rates: bool  # rank-rates: the windowed figures per rank
    buckets: bool  # rank-step-buckets

    def opt(self, m: M.Metric, labels: list[str], value: float | None) -> None:
        """A value where there is one, of a family this render serves (an opt-in detail's only when on)."""
        if value is not None and m.name in self.f:
            self.f[m.name].add_metric(labels, value)

    def rare(
        self, m: M.Metric, labels: list[str], value: float | None, process_started: float | None = None
    ) -> None:
        """A counter of a rare event: absent until the first, then 0 before its value (zerofirst.py).
        ``process_started``: for a counter the training process keeps itself."""
        if value is None:
            return
        key = (labels[0], int(labels[1]), m.name, tuple(labels[2:]))
        shown = self.first.value(key, value, self.now, process_started)
        if shown is not None:
            self.f[m.name].add_metric(labels, shown)


class TrainingCollector:
    def __init__(
        self,
        analysis: Analysis,
        stats: IngestStats,
        library: LibraryWatch | None = None,
        details: frozenset[str] = frozenset(),
        counter_hold: float = 60.0,
        nccl: InspectorReader | None = None,
    ) -> None:
        """``counter_hold``: seconds a rare event's counter shows 0 before its first value
        (gpumon/zerofirst.py); ``nccl``: the reader of --nccl-inspector-dir, whose records join the ranks."""
        self.analysis = analysis
        self.stats = stats
        self.library = library
        self.details = details
        born = analysis.clock()
        self.first = ZeroFirst(born, counter_hold)
        self.steps = JobSteps(born)
        self.nccl = nccl
        self._metrics = [
            m
            for m in M.TRAINING_FLOW
            if (not m.detail or m.detail in details) and (nccl is not None or m not in _NCCL)
        ]
        self._per_scrape = [m for m in self._metrics if m not in _ALWAYS]
        self._step_type = "histogram" if "rank-step-buckets" in details else None

    def _family(self, m: M.Metric) -> RowFamily:
        return _family(m, self._step_type if m is M.STEP_DURATION else None)

    def describe(self) -> list[Metric]:
        """Every family this collector can yield, so ``/metrics?name[]=`` can select training series."""
        return [self._family(m) for m in self._metrics]

    def collect(self) -> Iterator[Metric]:
        now = self.analysis.clock()
        out = _Render(
            {m.name: self._family(m) for m in self._per_scrape},
            self.first,
            self.steps,
            now,
            "rank-rates" in self.details,
            "rank-step-buckets" in self.details,
        )
        f = out.f
        lib = self.library.library() if self.library is not None else None
        live: set[tuple[str, int]] = set()
        jobs = self.analysis.jobs(now)
        for job in jobs:
            _add_job(out, job)
            live.update((job.job, r.view.report.rank) for r in job.ranks)
            if lib is not None:
                _add_baseline(out, job, lib, self.analysis.store.baseline_steps)
        retained = self.analysis.store.retained()
        self.steps.keep(retained)
        if self.nccl is not None:
            self._add_nccl(f, jobs)
        exported = set(live)
        for job_name, rank, ledger in self.analysis.store.gone_ledgers(now):
            if (job_name, rank) not in live:  # it went between the two reads: exported above already
                _add_ledger(out, [job_name, str(rank)], ledger)
                exported.add((job_name, rank))
        self.first.keep(exported, retained)
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
        if self.nccl is not None:
            outcomes, skipped, (read, unread) = self.nccl.counts()
            records = _family(M.NCCL_RECORDS)
            for outcome, n in outcomes.items():
                records.add_metric([outcome], n)
            gone, followed = _family(M.NCCL_SKIPPED), _family(M.NCCL_FILES)
            gone.add_metric([], skipped)
            followed.add_metric(["read"], read)
            followed.add_metric(["unread"], unread)
            yield from (records, gone, followed)

    def _add_nccl(self, f: dict[str, Any], jobs: list[JobResult]) -> None:
        """Each job's NCCL counters, as the reader adds its processes' records (joined by host and pid)."""
        assert self.nccl is not None
        for job in jobs:
            for op, (n, seconds, bus) in self.nccl.jobs.get(job.job).items():
                f[M.NCCL_OPERATIONS.name].add_metric([job.job, op], n)
                f[M.NCCL_SECONDS.name].add_metric([job.job, op], seconds)
                f[M.NCCL_BUS_BYTES.name].add_metric([job.job, op], bus)


def _add_job(out: _Render, j: JobResult) -> None:
    f, jl = out.f, [j.job]
    f[M.JOB_RANKS.name].add_metric([*jl, rank_ranges(r.view.report.rank for r in j.ranks)], len(j.ranks))
    if any(r.gone is None for r in j.ranks):  # a job with no rank running has no throughput to add up
        out.opt(M.JOB_TOKENS_RATE, jl, j.tokens_per_second)
        out.opt(M.JOB_MFU, jl, j.mfu)
        out.opt(M.JOB_FLOPS, jl, j.flops)
        out.opt(M.JOB_PEAK_FLOPS, jl, j.peak_flops)
    f[M.JOB_BOTTLENECK.name].add_metric([*jl, j.verdict.bottleneck], 1)
    for r in j.ranks:
        _add_rank(out, r)
    steps = out.steps.get(j.job)
    if steps is not None:
        buckets = [(le, n) for le, n in _cumulative(steps[0]) if le in _JOB_LE]
        f[M.JOB_STEP_DURATION.name].add_metric(jl, buckets, steps[1])


RANGES_MAX = 120  # characters: a node's ranks are few; an odd spread of them is cut, not a huge label


def rank_ranges(ranks: Iterable[int]) -> str:
    """The ranks as runs, "8-15" or "0-3,6,9-10": what an alert prints to name a node's share of a job."""
    text = runs(ranks)
    return text if len(text) <= RANGES_MAX else text[: text.rfind(",", 0, RANGES_MAX - 3)] + ",..."


def _add_rank(out: _Render, r: RankResult) -> None:
    f = out.f
    rep = r.view.report
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
    out.opt(M.LAST_REPORT, rl, rep.time)
    out.opt(M.LAST_PROGRESS, rl, rep.updated)
    out.rare(M.RESTARTS, rl, r.view.restarts + r.view.ledger.moves)
    totals = r.view.totals()
    f[M.STEPS.name].add_metric(rl, totals["steps"])
    f[M.TOKENS.name].add_metric(rl, totals["tokens"])
    f[M.SAMPLES_TOTAL.name].add_metric(rl, totals["samples"])
    if rep.kind == "inference" or totals["requests"]:
        f[M.REQUESTS.name].add_metric(rl, totals["requests"])
    h = rep.step_seconds
    counts = _plus(off.step_counts, h.counts)
    step_sum = off.step_sum + h.sum
    if out.buckets:
        f[M.STEP_DURATION.name].add_metric(rl, _cumulative(counts), step_sum)
    else:
        f[M.STEP_DURATION.name].add_metric(rl, sum(counts), step_sum)
    if rep.kind == "train":
        out.steps.add(rep.job, rep.rank, counts, step_sum, rep.started)
    if rep.request_seconds is not None:
        q = rep.request_seconds
        f[M.REQUEST_DURATION.name].add_metric(
            rl, _cumulative(_plus(off.request_counts, q.counts)), off.request_sum + q.sum
        )
    for phase, seconds in r.view.phases().items():
        f[M.PHASE_SECONDS.name].add_metric([*rl, phase], seconds)
    if out.rates:
        if r.counts:  # a rank gone, or loading, has no rates: the job's rules add up the ranks that step
            _add_rates(out, rl, r)
        for b in BOTTLENECKS:
            f[M.BOTTLENECK.name].add_metric([*rl, b], 1 if r.verdict.bottleneck == b else 0)
    if rep.kind == "train":
        _add_ledger(out, rl, r.view.ledger)
    _add_allocator(out, rl, r.view)


def _add_rates(out: _Render, rl: list[str], r: RankResult) -> None:
    rt = r.rates
    out.opt(M.TOKENS_RATE, rl, rt.tokens_per_second)
    out.opt(M.SAMPLES_RATE, rl, rt.samples_per_second)
    out.opt(M.STEP_TIME, rl, rt.step_time_seconds)
    for phase, ratio in sorted(rt.phase_ratios.items()):
        out.f[M.PHASE_RATIO.name].add_metric([*rl, phase], ratio)
    out.opt(M.FLOPS, rl, r.flops)
    out.opt(M.PEAK_FLOPS, rl, r.peak.flops)
    out.opt(M.MFU, rl, r.mfu)
    out.opt(M.TOKENS_PER_JOULE, rl, r.tokens_per_joule)
    out.opt(M.STRAGGLER, rl, r.straggler)


def _add_ledger(out: _Render, rl: list[str], ledger: LedgerView) -> None:
    out.f[M.GOODPUT.name].add_metric(rl, ledger.goodput)
    for cause in CAUSES:
        out.rare(M.BADPUT, [*rl, cause], ledger.badput[cause])
    out.rare(M.STEPS_REDONE, rl, ledger.steps_redone)


def _add_allocator(out: _Render, rl: list[str], v: RankView) -> None:
    m = v.report.memory
    if m is not None:
        out.opt(M.ALLOCATOR_ALLOCATED, rl, m.allocated_bytes)
        out.opt(M.ALLOCATOR_RESERVED, rl, m.reserved_bytes)
        out.opt(M.ALLOCATOR_ALLOCATED_PEAK, rl, m.allocated_peak_bytes)
        out.opt(M.ALLOCATOR_RESERVED_PEAK, rl, m.reserved_peak_bytes)
        out.opt(M.ALLOCATOR_FRAGMENTATION, rl, fragmentation(m.allocated_bytes, m.reserved_bytes))
    # the counters stay once known, through a report without them: a series that went and came back lower
    # would read as a reset
    counts = v.allocator_counts()
    if counts is not None:
        out.rare(M.ALLOCATOR_RETRIES, rl, counts[0], v.report.started)
        out.rare(M.ALLOCATOR_OOMS, rl, counts[1], v.report.started)


def fragmentation(allocated: float | None, reserved: float | None) -> float | None:
    """1 - allocated/reserved: the share of the allocator's memory not holding tensors."""
    if allocated is None or not reserved:
        return None
    return min(1.0, max(0.0, 1.0 - allocated / reserved))


def _add_baseline(out: _Render, j: JobResult, lib: Library, steps: dict[str, float]) -> None:
    a = against(j, lib)
    note_baseline_step(steps, j.job, a)
    base, c = a.baseline, a.ratios
    if base is None or c is None:
        return
    jl = [j.job]
    k = base.key
    info = [*jl, base.name, k.workload, k.gpu_model, str(k.gpus), k.dtype, k.flops_convention]
    out.f[M.BASELINE_INFO.name].add_metric(info, 1)
    b = base.figures
    out.opt(M.BASELINE_TOKENS, jl, b.tokens_per_second_per_gpu)
    out.opt(M.BASELINE_STEP_TIME, jl, b.step_time_seconds)
    out.opt(M.BASELINE_MFU, jl, b.mfu)
    out.opt(M.BASELINE_TPJ, jl, b.tokens_per_joule)
    ref = a.reference
    if ref is not None and ref.figures.tokens_per_second_per_gpu is not None:
        per_gpu = ref.figures.tokens_per_second_per_gpu
        out.f[M.SCALING_BASELINE.name].add_metric([*jl, str(ref.key.gpus)], per_gpu)
    out.opt(M.THROUGHPUT_RATIO, jl, c.tokens_per_second_per_gpu)
    out.opt(M.MFU_RATIO, jl, c.mfu)
    out.opt(M.STEP_TIME_RATIO, jl, c.step_time_seconds)
    out.opt(M.TPJ_RATIO, jl, c.tokens_per_joule)


def note_baseline_step(steps: dict[str, float], job: str, a: Against) -> None:
    """Keep the job's baseline step time where the goodput ledger reads it (its slow steps)."""
    step = a.baseline.figures.step_time_seconds if a.baseline is not None else None
    if step:
        steps[job] = step
    else:
        steps.pop(job, None)
