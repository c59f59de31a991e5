"""Join what ranks report with what the GPUs show: rates, MFU, tokens per joule, diagnosis, stragglers.

Computed on demand (a scrape, GET /v1/jobs) from the store's views and the sampler's latest snapshot; it
never calls NVML. Peak FLOP/s come from the rank's own report, else the peak table, else the operator's
override (--peak-tflops) for GPUs the table does not know; a GPU known to none of them leaves MFU absent,
with a warning, rather than borrowing another GPU's figure.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpumon.estimate.breakdown import Estimate
from gpumon.gpu.snapshot import Snapshot
from gpumon.jobs import peaks
from gpumon.jobs.diagnosis import Signals, Thresholds, Verdict, diagnose, straggler_scores
from gpumon.jobs.diagnosis.liveness import Liveness
from gpumon.jobs.diagnosis.state import SpeedReference, VerdictHold
from gpumon.jobs.gpus import Found, GpuHistory, GpuWindow, mean, resolve
from gpumon.jobs.memoryview import rank_estimate
from gpumon.jobs.report import Report
from gpumon.jobs.store import JobStore, RankView
from gpumon.jobs.window import SIDE_PHASES, Rates, measure
from gpumon.nccl.ledger import NcclLedger, NcclUse
from gpumon.net.history import NicHistory, NicUse

log = logging.getLogger(__name__)
# "3g.40gb": a GPU instance of 3 slices; "1c.3g.71gb": a compute instance of 1 slice inside one
_MIG_SLICES = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.")
MIG_COMPUTE_SLICES = 7.0  # A100, H100, H200: a "1g" instance has one seventh of the SMs
# a rate span and GPU samples this long before MFU is set against tensor activity
SETTLED_SECONDS, SETTLED_POINTS = 10.0, 10
# a rank silent this long (its sender thread reports every interval, stalled or not) has stopped: SIGSTOP, a
# frozen host, a lost network; as long as it stays silent it leaves its job's GPU count, throughput and MFU
SILENT_REPORTS, SILENT_FLOOR = 4.0, 6.0


@dataclass(frozen=True, slots=True)
class GpuUse:
    window: GpuWindow
    via: str  # device, mig or process
    sharers: int  # ranks on this node using the same GPU (or MIG device)
    # other jobs on this node using it, and processes NVML lists on it that belong to no rank here
    shared_with: tuple[str, ...] = ()
    labelled: tuple[str, ...] = ()  # the same, each with the GPU's index, as the diagnosis names them


@dataclass(frozen=True, slots=True)
class Peak:
    flops: float | None
    source: str | None  # report, override or table
    problem: str | None  # why there is none


@dataclass(frozen=True, slots=True)
class RankResult:
    view: RankView
    rates: Rates
    gpus: tuple[GpuUse, ...]
    peak: Peak
    flops: float | None
    mfu: float | None
    tokens_per_joule: float | None
    signals: Signals
    verdict: Verdict
    straggler: float | None
    # why the rank no longer counts towards its job's GPUs, throughput and MFU, or None while it does:
    # "finished" (its final report), "exited" (its pid is gone) or "silent" (no report for SILENT_REPORTS
    # of its report intervals, at least SILENT_FLOOR seconds). Its counters and ledger stay until --rank-ttl.
    gone: str | None = None

    @property
    def counts(self) -> bool:
        """It adds to its job's GPUs, throughput and MFU: not gone, and past its first step. A rank still
        loading (a restart landing on another node, a checkpoint being read) would add idle GPUs and their
        peak to a job whose other ranks step, and sag its per-GPU throughput and MFU until it steps."""
        return self.gone is None and self.view.report.anchor_time is not None


@dataclass(frozen=True, slots=True)
class JobResult:
    job: str
    ranks: tuple[RankResult, ...]
    tokens_per_second: float | None
    mfu: float | None
    signals: Signals
    verdict: Verdict
    # the achieved and peak FLOP/s of the running ranks that have both (MFU's two sides)
    flops: float | None = None
    peak_flops: float | None = None


def _sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _most_common(values: list[str | None]) -> str | None:
    known = [v for v in values if v is not None]
    return max(sorted(set(known)), key=known.count) if known else None


def _max(values: list[float | None]) -> float | None:
    return max((v for v in values if v is not None), default=None)


class Analysis:
    def __init__(
        self,
        store: JobStore,
        source: Callable[[], Snapshot | None],
        *,
        thresholds: Thresholds | None = None,
        peak_override: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.time,
        proc: str = "/proc",
        nccl: NcclLedger | None = None,
    ) -> None:
        self.store = store
        self.source = source
        self.thresholds = thresholds or Thresholds()
        self.peak_override = dict(peak_override or {})  # dtype → FLOP/s per GPU, for GPUs the table lacks
        self.clock = clock
        self.history = GpuHistory()
        self.nic_history = NicHistory()
        self.nccl = nccl  # NCCL Inspector records by process (--nccl-inspector-dir), None without
        self.liveness = Liveness(proc)
        self.speeds = SpeedReference()
        self.holds = VerdictHold()
        self._warned: set[tuple[str, str]] = set()

    @property
    def window(self) -> float:
        return self.store.window

    def observe(self, snap: Snapshot | None = None) -> None:
        """Feed the GPU history a snapshot (default: the latest); a sampler listener, so the history has
        every sweep whatever the report and scrape traffic. Cheap when the snapshot was seen already."""
        snap = self.source() if snap is None else snap
        self.history.observe(snap, self.window)
        self.nic_history.observe(snap, self.window)

    def jobs(self, now: float | None = None, only: str | None = None) -> list[JobResult]:
        """Every job on this node, or just ``only`` (its GPUs' sharers still count every job's ranks)."""
        now = self.clock() if now is None else now
        snap = self.source()
        self.history.observe(snap, self.window)
        self.nic_history.observe(snap, self.window)
        nearest = {uuid: nic for uuid, nic, _ in snap.nic_affinity} if snap is not None else {}
        views = self.store.views(now)
        resolved: dict[tuple[str, int], list[Found]] = {
            (v.report.job, v.report.rank): resolve(v.report.devices, v.report.pid, snap) for v in views
        }
        here: dict[str, set[int]] = {}  # each job's ranks on this node
        sharers: dict[str, int] = {}
        jobs_on: dict[str, dict[str, set[int]]] = {}  # per GPU, each job's pids on it
        for v in views:
            here.setdefault(v.report.job, set()).add(v.report.rank)
            for f in resolved[(v.report.job, v.report.rank)]:
                sharers[f.key] = sharers.get(f.key, 0) + 1
                jobs_on.setdefault(f.key, {}).setdefault(v.report.job, set()).add(v.report.pid)
        windows: dict[tuple[str, float, float], GpuWindow] = {}  # per GPU, end and span, however many ranks
        # per GPU, job and pid (and whether NVML lists the pid): one list of neighbours, not one per rank
        neighbours: dict[tuple[str, str, int, bool], tuple[tuple[str, ...], tuple[str, ...]]] = {}
        by_job: dict[str, list[RankResult]] = {}
        for v in views:
            if only is not None and v.report.job != only:
                continue
            # a finished rank is judged by the window that ended with its last report, and no process is
            # judged by what its GPU did before it started (a run reusing a finished one's name)
            end = v.received if v.report.final else now
            span = max(2.0, min(self.window, end - v.report.started))
            uses = []
            for f in resolved[(v.report.job, v.report.rank)]:
                if (f.key, end, span) not in windows:
                    windows[(f.key, end, span)] = self.history.window(f.status, end, span, f.mig)
                w = windows[(f.key, end, span)]
                # NVML lists this rank's pid: the others it lists are strangers
                pid = v.report.pid
                found = (f.key, v.report.job, pid, pid in w.pids_now)
                if found not in neighbours:
                    # another job reporting from this very process (a notebook's earlier Reporter) is not a
                    # neighbour: the process's GPU activity is one, whichever Reporter it counts for
                    others = sorted(
                        j for j, pids in jobs_on[f.key].items() if j != v.report.job and pids != {pid}
                    )
                    if found[3]:
                        reporting = set().union(*jobs_on[f.key].values())
                        others += [f"pid {p}" for p in sorted(set(w.pids_now) - reporting)]
                    neighbours[found] = tuple(others), tuple(f"{o} (GPU {w.index})" for o in others)
                uses.append(GpuUse(w, f.via, sharers[f.key], *neighbours[found]))
            elsewhere = max(0, v.report.world_size - len(here[v.report.job]))
            nics = [nearest[u.window.uuid] for u in uses if u.window.uuid in nearest]
            nic = self.nic_history.use(nics, end, span) if nics else None
            host = v.report.hostname
            nccl = self.nccl.use(host, v.report.pid, end, span) if self.nccl and host else None
            by_job.setdefault(v.report.job, []).append(self._rank(v, tuple(uses), elsewhere, nic, nccl, now))
        if only is None:
            self.liveness.forget({(v.report.job, v.report.rank, v.report.incarnation) for v in views})
        return [self._job(job, ranks, now) for job, ranks in sorted(by_job.items())]

    def _rank(
        self,
        v: RankView,
        uses: tuple[GpuUse, ...],
        elsewhere: int,
        nic: NicUse | None,
        nccl: NcclUse | None,
        now: float,
    ) -> RankResult:
        r = v.report
        rates = measure(v, v.received if r.final else now, self.window)
        peak = self._peak(v, uses)
        flops = None
        if r.flops_per_token is not None and rates.tokens_per_second is not None:
            flops = _finite(rates.tokens_per_second * r.flops_per_token)
        mfu = _finite(flops / peak.flops) if flops is not None and peak.flops else None
        watts = [u.window.power_watts / u.sharers for u in uses if u.window.power_watts is not None]
        tpj = None
        if rates.tokens_per_second is not None and watts and len(watts) == len(uses) and sum(watts) > 0:
            tpj = _finite(rates.tokens_per_second / sum(watts))
        exited = None
        if not r.final and self.liveness.gone(
            (r.job, r.rank, r.incarnation), r.pid, r.started, r.process_started, now
        ):
            exited = f"pid {r.pid} exited or was killed without its final report"
        signals = self._signals(v, rates, uses, mfu, exited, elsewhere, nic, nccl, now)
        key = (r.job, r.rank, r.incarnation)  # a restarted process starts afresh
        verdict = diagnose(signals, self.thresholds, lambda raw: self.holds.hold(key, raw, now))
        gone = "finished" if r.final else "exited" if exited else "silent" if _silent(v, now) else None
        return RankResult(v, rates, uses, peak, flops, mfu, tpj, signals, verdict, None, gone)

    def _peak(self, v: RankView, uses: tuple[GpuUse, ...]) -> Peak:
        r = v.report
        if not uses:
            return Peak(
                None, None, "no GPU known for this rank: report device= or run where NVML sees its pid"
            )
        if r.peak_flops is not None:
            return Peak(sum(r.peak_flops * _mig_fraction(u.window.mig_profile) for u in uses), "report", None)
        if r.dtype is None:
            return Peak(None, None, "the rank did not report its dtype (Reporter(dtype=...))")
        total = 0.0
        sources = set()
        for u in uses:
            per_gpu = peaks.peak_flops(u.window.name, r.dtype)
            source = "table"
            if per_gpu is None:  # the override is for GPUs the table does not know, never over the table
                per_gpu = self.peak_override.get(r.dtype)
                source = "override"
            if per_gpu is None:
                self._warn_unknown(u.window.name, r.dtype)
                return Peak(None, None, f"no {r.dtype} peak known for {u.window.name!r}: set --peak-tflops")
            sources.add(source)
            total += per_gpu * _mig_fraction(u.window.mig_profile)
        return Peak(total, "+".join(sorted(sources)), None)

    def _warn_unknown(self, name: str, dtype: str) -> None:
        if (name, dtype) not in self._warned:
            self._warned.add((name, dtype))
            log.warning(
                "no %s peak FLOP/s known for %r: MFU is left out for jobs on it; set --peak-tflops "
                "(e.g. %s=NNN, TFLOP/s from the datasheet) to supply it",
                dtype,
                name,
                dtype,
            )

    def _signals(
        self,
        v: RankView,
        rates: Rates,
        uses: tuple[GpuUse, ...],
        mfu: float | None,
        exited: str | None,
        elsewhere: int,
        nic: NicUse | None,
        nccl: NcclUse | None,
        now: float,
    ) -> Signals:
        r = v.report
        w = [u.window for u in uses]
        nvlink = []
        for g in w:
            known = peaks.lookup(g.name)
            capacity = known.nvlink_total_bytes_per_second if known else None
            if g.nvlink_bytes_per_second is not None and capacity:
                nvlink.append(g.nvlink_bytes_per_second / capacity)
        down = [g for g in w if not g.up]
        shared = [u for u in uses if u.shared_with]
        gpu = _gpu_signals([_attributed(u, r.pid) for u in uses])
        settled = (
            rates.span is not None
            and rates.span.seconds >= SETTLED_SECONDS
            and all(u.window.points >= SETTLED_POINTS for u in uses)
        )
        slowdown, against = self.speeds.slowdown(
            (r.job, r.rank),
            busy_cost(rates) if rates.progressing else None,
            settled and not gpu["throttled_share"],
            now,
            _against_baseline(rates.step_time_seconds, self.store.baseline_steps.get(r.job)),
        )
        return Signals(
            progressing=rates.progressing,
            gpu_down=(f"GPU {down[0].index}: {down[0].down_reason or 'not answering'}" if down else None),
            data_wait_share=rates.phase_ratios.get("data_wait"),
            communication_share=rates.phase_ratios.get("communication"),
            nvlink_utilization=_max(list(nvlink)),
            mfu=mfu,
            alloc_retries=rates.alloc_retries,
            ooms=rates.ooms,
            finished=rates.finished,
            exited=exited,
            utilization_now=mean([_own_now(u, r.pid) for u in uses]),
            shared_with=shared[0].labelled
            if len(shared) == 1
            else tuple(dict.fromkeys(o for u in shared for o in u.labelled)),
            shared_utilization=mean([u.window.utilization for u in shared]),
            own_utilization=bool(shared) and all(r.pid in u.window.process_utilization for u in shared),
            slowdown=slowdown,
            slowdown_against=against,
            settled=settled,
            unknown_devices=tuple(r.devices) if r.devices and not uses else (),
            open_phase=_open_phase(v, now),
            peers_elsewhere=elsewhere,
            nics=() if nic is None else nic.nics,
            nic_utilization=None if nic is None else nic.utilization,
            nic_errors=None if nic is None else nic.errors,
            nics_down=() if nic is None else nic.down,
            nic_retransmit_rate=None if nic is None else nic.retransmit_rate,
            nic_cnp_rate=None if nic is None else nic.cnp_rate,
            nccl_bus_bandwidth=None if nccl is None else nccl.bus_bytes_per_second,
            nccl_operation=None if nccl is None or nccl.bus_bytes_per_second is None else nccl.busiest,
            **_setup_signals(r, uses),
            **gpu,
        )

    def _job(self, job: str, ranks: list[RankResult], now: float) -> JobResult:
        scores = straggler_scores(_costs(ranks))
        ranks = [dataclasses.replace(r, straggler=s) for r, s in zip(ranks, scores, strict=True)]
        # throughput and MFU of the ranks running: a rank that finished, died or moved to another node, or
        # one not yet stepping, must not sag the job's MFU with its idle GPU; a job none of whose ranks runs
        # keeps its last figures
        counted = [r for r in ranks if r.counts] or ranks
        rates = [r.rates.tokens_per_second for r in counted]
        known = [x for x in rates if x is not None]
        flops = [r.flops for r in counted]
        peak = [r.peak.flops for r in counted]
        # MFU's two sides over the ranks that have both, for the job's MFU across nodes: a rank on a GPU
        # without a known peak must not inflate the numerator. The node's own MFU needs every rank to have
        # both
        both = [(f, p) for f, p in zip(flops, peak, strict=True) if f is not None and p]
        flops_sum = sum(f for f, _ in both) if both else None
        peak_sum = sum(p for _, p in both) if both else None
        mfu = flops_sum / peak_sum if flops_sum is not None and peak_sum and len(both) == len(flops) else None
        sig = [r.signals for r in ranks]
        progressing = [s.progressing for s in sig if s.progressing is not None]
        shared = [s for s in sig if s.shared_with]
        exited = [s.exited for s in sig if s.exited]
        # busy seconds per step when every rank times its steps (and the baseline is one), else per token
        step_times = [r.rates.step_time_seconds for r in ranks]
        timed = all(x is not None for x in step_times)
        if timed:
            cost = mean([busy_cost(r.rates) for r in ranks])
        else:
            side = mean([_side_share(r.rates) for r in ranks]) or 0.0
            cost = (1.0 - side) / sum(known) if known and sum(known) > 0 else None
        slowdown, against = self.speeds.slowdown(
            (job,),
            cost if any(progressing) else None,
            all(s.settled for s in sig) and not _max([s.throttled_share for s in sig]),
            now,
            _against_baseline(mean(step_times), self.store.baseline_steps.get(job)) if timed else None,
        )
        signals = Signals(
            progressing=any(progressing) if progressing else None,
            gpu_down=next((s.gpu_down for s in sig if s.gpu_down), None),
            data_wait_share=mean([s.data_wait_share for s in sig]),
            communication_share=mean([s.communication_share for s in sig]),
            nvlink_utilization=_max([s.nvlink_utilization for s in sig]),
            mfu=mfu,
            alloc_retries=_sum([s.alloc_retries for s in sig]),
            ooms=_sum([s.ooms for s in sig]),
            finished=all(s.finished for s in sig),
            # one rank gone is the job's verdict: its peers wait for it in their next collective
            exited=(f"{len(exited)} of {len(sig)} ranks: {exited[0]}" if len(sig) > 1 else exited[0])
            if exited
            else None,
            # "its GPU is idle now" in an exited verdict is about the gone ranks' GPUs, not their peers'
            utilization_now=mean([s.utilization_now for s in ([s for s in sig if s.exited] or sig)]),
            shared_with=tuple(dict.fromkeys(o for s in shared for o in s.shared_with)),
            shared_utilization=mean([s.shared_utilization for s in shared]),
            own_utilization=bool(shared) and all(s.own_utilization for s in shared),
            slowdown=slowdown,
            slowdown_against=against,
            settled=all(s.settled for s in sig),
            unknown_devices=tuple(dict.fromkeys(d for s in sig for d in s.unknown_devices)),
            open_phase=max((s.open_phase for s in sig if s.open_phase), key=lambda o: o[1], default=None),
            peers_elsewhere=max(s.peers_elsewhere for s in sig),
            # ranks here may share a NIC: the busiest and the most erroring speak for the job
            nics=tuple(sorted({n for s in sig for n in s.nics})),
            nic_utilization=_max([s.nic_utilization for s in sig]),
            nic_errors=_max([s.nic_errors for s in sig]),
            nics_down=tuple(sorted({d for s in sig for d in s.nics_down})),
            nic_retransmit_rate=_max([s.nic_retransmit_rate for s in sig]),
            nic_cnp_rate=_max([s.nic_cnp_rate for s in sig]),
            nccl_bus_bandwidth=mean([s.nccl_bus_bandwidth for s in sig]),
            nccl_operation=_most_common([s.nccl_operation for s in sig]),
            **_worst_setup(sig),
            **_gpu_signals(sig),
        )
        runs = tuple(sorted(r.view.report.incarnation for r in ranks))  # a new run of the name starts afresh
        verdict = diagnose(signals, self.thresholds, lambda raw: self.holds.hold((job, runs), raw, now))
        tokens = sum(known) if known else None
        return JobResult(job, tuple(ranks), tokens, mfu, signals, verdict, flops_sum, peak_sum)


# GPU signals, by how several GPUs (or several ranks) combine: activity averages, pressure is the worst
_MEANS = ("utilization", "sm_active", "tensor_active", "dram_active")
_MAXES = ("pcie_utilization", "throttled_share", "memory_used_ratio")


def _gpu_signals(items: Sequence[object]) -> dict[str, Any]:
    """The GPU half of Signals from GpuWindows (a rank's GPUs) or from Signals (a job's ranks)."""
    out = {name: mean([getattr(x, name) for x in items]) for name in _MEANS}
    out.update({name: _max([getattr(x, name) for x in items]) for name in _MAXES})
    return out


class _Own(NamedTuple):
    """A shared GPU's signals as far as they are one process's (read like a GpuWindow's)."""

    utilization: float | None  # its own SM use, where NVML samples processes
    pcie_utilization: float | None
    throttled_share: float | None
    memory_used_ratio: float | None
    # the profiling counters cover the whole GPU: not attributable
    sm_active: None = None
    tensor_active: None = None
    dram_active: None = None


def _attributed(u: GpuUse, pid: int) -> GpuWindow | _Own:
    """The GPU's activity as far as it is this process's: on a GPU shared with other work, its own SM use
    where NVML samples processes, and nothing of the profiling counters, which cover the whole GPU."""
    if not u.shared_with:
        return u.window
    w = u.window
    return _Own(w.process_utilization.get(pid), w.pcie_utilization, w.throttled_share, w.memory_used_ratio)


def _own_now(u: GpuUse, pid: int) -> float | None:
    if u.shared_with and pid in u.window.process_utilization:
        return u.window.process_utilization[pid]
    return u.window.utilization_now


def _open_phase(v: RankView, now: float) -> tuple[str, float] | None:
    """The longest phase the rank is inside now, and how long it has run (to its report, plus the time
    since, as long as the process reports it still open)."""
    running = v.report.open_phases
    if not running or v.report.final:
        return None
    name = max(running, key=lambda n: running[n])
    return name, running[name] + max(0.0, now - v.received)


def _silent(v: RankView, now: float) -> bool:
    """No report for SILENT_REPORTS of the rank's own report intervals (the median gap between its reports
    in the window), and at least SILENT_FLOOR seconds."""
    times = [p.reported for p in v.points]
    gaps = sorted(b - a for a, b in itertools.pairwise(times) if b > a)
    interval = gaps[len(gaps) // 2] if gaps else 1.0
    return now - v.received > max(SILENT_FLOOR, SILENT_REPORTS * interval)


def _setup_signals(r: Report, uses: tuple[GpuUse, ...]) -> dict[str, float | None]:
    """The declared setup's estimate per GPU (the estimator's result is cached per setup), the allocator's
    peak, and the smallest HBM among the rank's GPUs."""
    est = rank_estimate(r) if r.kind == "train" and r.setup is not None else None
    m = r.memory
    peak = (
        None
        if m is None
        else (m.allocated_peak_bytes if m.allocated_peak_bytes is not None else m.allocated_bytes)
    )
    hbm = [u.window.memory_total_bytes for u in uses if u.window.memory_total_bytes]
    return {
        "setup_estimate_bytes": est.train_total_bytes if isinstance(est, Estimate) else None,
        "allocated_peak_bytes": None if peak is None else float(peak),
        "hbm_bytes": float(min(hbm)) if hbm else None,
    }


def _setup_off(s: Signals) -> float:
    est = s.setup_estimate_bytes
    if not est:
        return -1.0
    if s.hbm_bytes and est > s.hbm_bytes:
        return math.inf
    return 0.0 if s.allocated_peak_bytes is None else abs(s.allocated_peak_bytes / est - 1.0)


def _worst_setup(sig: list[Signals]) -> dict[str, float | None]:
    """The job's setup signals are its rank's furthest from its estimate (ranks of one job declare one setup;
    a rank that differs is the one to show)."""
    if not sig:
        return {}
    w = max(sig, key=_setup_off)
    return {
        "setup_estimate_bytes": w.setup_estimate_bytes,
        "allocated_peak_bytes": w.allocated_peak_bytes,
        "hbm_bytes": w.hbm_bytes,
    }


def _side_share(rates: Rates) -> float:
    return min(0.95, sum(rates.phase_ratios.get(p, 0.0) for p in SIDE_PHASES))


def busy_cost(rates: Rates) -> float | None:
    """Busy seconds per step, else per token: what throttling would raise."""
    if rates.busy_step_seconds is not None:
        return rates.busy_step_seconds
    busy = 1.0 - _side_share(rates)
    return busy / rates.tokens_per_second if rates.tokens_per_second else None


def _against_baseline(step_time: float | None, baseline: float | None) -> tuple[float, float] | None:
    """Seconds per step now and the baseline's, where both are known: a baseline records whole steps."""
    return (step_time, baseline) if step_time is not None and baseline else None


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _mig_fraction(profile: str | None) -> float:
    m = _MIG_SLICES.match(profile or "")
    if not m:
        return 1.0
    return min(1.0, int(m.group(1) or m.group(2)) / MIG_COMPUTE_SLICES)


def _costs(ranks: list[RankResult]) -> list[float | None]:
    """Per rank, the time it needs for its own work: busy seconds per step when every rank reports its
    communication or data-wait phase (in synchronous data parallelism all ranks share one step time; the
    straggler is the one the others wait for), else seconds per token."""
    phased = all(
        r.rates.step_time_seconds is not None
        and ("communication" in r.rates.phase_ratios or "data_wait" in r.rates.phase_ratios)
        for r in ranks
    )
    out: list[float | None] = []
    for r in ranks:
        rt = r.rates
        if phased and rt.step_time_seconds is not None:
            waiting = rt.phase_ratios.get("communication", 0.0) + rt.phase_ratios.get("data_wait", 0.0)
            out.append(rt.step_time_seconds * max(0.0, 1.0 - waiting))
        elif rt.tokens_per_second:
            out.append(1.0 / rt.tokens_per_second)
        else:
            out.append(None)
    return out
