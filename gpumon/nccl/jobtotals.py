"""A job's NCCL counters on this node: its processes' operations in one set of counters that never goes back.

The ledger (gpumon/nccl/ledger.py) keeps totals per training process. A job's sum over its ranks' current
processes would fall whenever a rank restarts or leaves the node, which Prometheus reads as a reset and
counts again in full. So each job keeps its own totals and adds each process's growth since the last pass.
What was added of a process is remembered by the ledger's generation of it, for RETAIN seconds after its
last claim: a process that drops out of the claims for a while (its rank silent past --rank-ttl, another
job claiming it for a pass) and comes back adds only its growth, never its whole history again; a new
generation (the ledger forgot the process and met it again) adds its totals afresh. Growth while the
process is claimed by two jobs is added to neither (``hold``). A process counts once however many of the
job's ranks it reports (one process driving several GPUs writes one dump).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpumon.nccl.ledger import Totals

Process = tuple[str, int]  # hostname, pid
RETAIN = 3600.0  # seconds a process's last totals are remembered after its last claim
MAX_REMEMBERED = 4096  # (job, process) pairs remembered at most, the least recently claimed go first


@dataclass
class _Seen:
    generation: int
    totals: dict[str, Totals]
    at: float  # when last claimed


@dataclass
class _Job:
    totals: dict[str, list[float]] = field(default_factory=dict)  # operation → operations, seconds, bus bytes
    last: dict[Process, _Seen] = field(default_factory=dict)  # per process, as added


class JobNccl:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}

    def add(
        self, job: str, process: Process, generation: int, totals: Mapping[str, Totals], now: float
    ) -> None:
        """The totals of a process of the job's, as they stand: their growth since the last pass is added."""
        self._note(job, process, generation, totals, now, add=True)

    def hold(
        self, job: str, process: Process, generation: int, totals: Mapping[str, Totals], now: float
    ) -> None:
        """As add, but the growth is nobody's (the process is claimed by two jobs): it is skipped."""
        self._note(job, process, generation, totals, now, add=False)

    def _note(
        self,
        job: str,
        process: Process,
        generation: int,
        totals: Mapping[str, Totals],
        now: float,
        *,
        add: bool,
    ) -> None:
        with self._lock:
            j = self._jobs.setdefault(job, _Job())
            seen = j.last.get(process)
            before = seen.totals if seen is not None and seen.generation == generation else {}
            if any(op not in totals or totals[op].operations < t.operations for op, t in before.items()):
                before = {}
            for op, t in totals.items() if add else ():
                was = before.get(op, Totals(0, 0.0, 0.0))
                acc = j.totals.setdefault(op, [0.0, 0.0, 0.0])
                acc[0] += t.operations - was.operations
                acc[1] += max(0.0, t.seconds - was.seconds)
                acc[2] += max(0.0, t.bus_bytes - was.bus_bytes)
            j.last[process] = _Seen(generation, dict(totals), now)

    def get(self, job: str) -> dict[str, tuple[float, float, float]]:
        with self._lock:
            j = self._jobs.get(job)
            return {} if j is None else {op: (t[0], t[1], t[2]) for op, t in sorted(j.totals.items())}

    def keep(self, jobs: Iterable[str], now: float) -> None:
        """Forget the jobs no rank of which reports now (a job that returns starts afresh), and what was
        added of processes unclaimed for RETAIN seconds."""
        wanted = set(jobs)
        with self._lock:
            for job in [name for name in self._jobs if name not in wanted]:
                del self._jobs[job]
            pairs = sorted(
                ((seen.at, job, p) for job, j in self._jobs.items() for p, seen in j.last.items()),
            )
            excess = max(0, len(pairs) - MAX_REMEMBERED)
            for i, (at, job, p) in enumerate(pairs):
                if i < excess or now - at > RETAIN:
                    del self._jobs[job].last[p]
