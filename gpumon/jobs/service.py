"""The training-telemetry half of the daemon, assembled from settings: store, analysis, ingest policy,
the baseline library and the job history that ``gpumon baseline record`` reads."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from gpumon.baselines.history import JobHistory
from gpumon.baselines.jobfigures import against
from gpumon.baselines.watch import LibraryWatch
from gpumon.config import Settings
from gpumon.gpu.compat_dcgm import node_hostname
from gpumon.gpu.snapshot import Snapshot
from gpumon.jobs.analysis import Analysis
from gpumon.jobs.api import IngestPolicy
from gpumon.jobs.collector import IngestStats, TrainingCollector, note_baseline_step
from gpumon.jobs.diagnosis import Thresholds
from gpumon.jobs.store import JobStore
from gpumon.nccl.reader import Claim, InspectorReader


@dataclass(frozen=True)
class Training:
    analysis: Analysis
    stats: IngestStats
    policy: IngestPolicy
    library: LibraryWatch | None = None
    history: JobHistory | None = None
    counter_hold: float = 60.0
    nccl: InspectorReader | None = None  # --nccl-inspector-dir

    def collector(self, details: frozenset[str] = frozenset()) -> TrainingCollector:
        """``details``: the --collect names; the training flow reads rank-rates, rank-step-buckets and
        rank-detail."""
        return TrainingCollector(
            self.analysis, self.stats, self.library, details, self.counter_hold, self.nccl
        )

    def state(self) -> tuple[Hashable, ...]:
        """What the training families depend on besides the GPU snapshot and the clock: the reports counted,
        the ranks expired and the baseline library. Any request that changes one of them (a report, GET
        /v1/jobs expiring a rank) changes this, and so does a changed library file: asking looks at the
        file (at most every 2 s), so a job document shared before the reload is not reused after it."""
        library = None if self.library is None else (self.library.library(), *self.library.state()[1:])
        return self.stats.total, self.analysis.store.expired, library

    def observe(self, snap: Snapshot | None = None) -> None:
        """A sampler listener: the GPU history gets every sweep; the job history a sample every 10 s."""
        self.analysis.observe(snap)
        if self.history is not None and self.history.due():
            now = time.time()
            jobs = self.analysis.jobs(now)
            self.history.record(jobs, now)
            if self.library is not None:  # the ledger's slow steps need baselines between scrapes too
                library = self.library.library()
                steps = self.analysis.store.baseline_steps
                for job in jobs:
                    note_baseline_step(steps, job.job, against(job, library))


def from_settings(settings: Settings, source: Callable[[], Snapshot | None]) -> Training:
    store = JobStore(
        max_jobs=settings.max_jobs,
        max_ranks=settings.max_ranks,
        ttl=settings.rank_ttl,
        window=settings.rate_window,
    )
    nccl = None
    if settings.nccl_inspector_dir:
        nccl = InspectorReader(
            settings.nccl_inspector_dir, claims=lambda: [Claim(*p) for p in store.processes()]
        )
    analysis = Analysis(
        store,
        source,
        thresholds=Thresholds(**settings.thresholds),
        peak_override=settings.peak_tflops,
        nccl=None if nccl is None else nccl.ledger,
    )
    policy = IngestPolicy(token=settings.ingest_token, allow_remote=settings.ingest_allow_remote)
    history = JobHistory(node=settings.node_name or node_hostname())
    library = LibraryWatch(settings.baselines)
    return Training(analysis, IngestStats(), policy, library, history, settings.counter_hold, nccl)
