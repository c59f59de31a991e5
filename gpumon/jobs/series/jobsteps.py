"""A job's step-time histogram on this node: every rank's steps in one, that never goes back.

The per-rank buckets cost 17 series per rank; a job's distribution needs them once. Summing the ranks'
histograms at each render would make the sum fall whenever a rank leaves the node (it finished, moved, or
its ledger expired), which Prometheus reads as a counter reset and counts again in full. So each job keeps
its own totals and adds each rank's growth since the previous render; a rank whose counts fell (a new
ledger for it) adds its counts afresh.

A rank whose process is older than this daemon adds only its growth from its first report here: after a
restart of the daemon the job's histogram starts again (a reset, which Prometheus handles), and the ranks
that report a moment later must not add their whole history to it as new steps. A rank that returns after
the store dropped its offsets (silent over an hour, or pushed out by 4 x --max-ranks others) and with the
same process adds its history again: a known over-count.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

Counts = tuple[float, ...]  # per bucket, not cumulative, +Inf last


@dataclass
class _Job:
    counts: list[float]
    total: float = 0.0
    last: dict[int, tuple[Counts, float]] = field(default_factory=dict)  # rank -> (counts, sum) added


class JobSteps:
    def __init__(self, born: float = float("-inf")) -> None:
        """``born``: when this daemon started (its clock)."""
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._born = born

    def add(
        self, job: str, rank: int, counts: Counts, total: float, process_started: float | None = None
    ) -> None:
        """The rank's histogram as it stands (cumulative since its first process)."""
        with self._lock:
            j = self._jobs.get(job)
            if j is None:
                j = self._jobs[job] = _Job([0.0] * len(counts))
            before = j.last.get(rank)
            if before is None and process_started is not None and process_started < self._born:
                j.last[rank] = (counts, total)  # counted by the daemon before this one
                return
            fell = before is not None and (
                total < before[1] or any(a < b for a, b in zip(counts, before[0], strict=True))
            )
            if before is None or fell:
                before = ((0.0,) * len(counts), 0.0)
            for i, (a, b) in enumerate(zip(counts, before[0], strict=True)):
                j.counts[i] += a - b
            j.total += total - before[1]
            j.last[rank] = (counts, total)

    def get(self, job: str) -> tuple[Counts, float] | None:
        """(counts per bucket, sum) of the job's steps on this node, once a rank of it was added."""
        with self._lock:
            j = self._jobs.get(job)
            return None if j is None else (tuple(j.counts), j.total)

    def keep(self, ranks: Iterable[tuple[str, int]]) -> None:
        """Forget the ranks whose counters would not continue (the store keeps no offsets for them), and jobs
        left with none: what stays is bounded by the store's ranks. A job that comes back starts afresh."""
        wanted = set(ranks)
        with self._lock:
            for job, j in list(self._jobs.items()):
                for rank in [r for r in j.last if (job, r) not in wanted]:
                    del j.last[rank]
                if not j.last:
                    del self._jobs[job]
