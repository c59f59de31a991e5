"""A job's NCCL counters on this node: its processes' operations in one set of counters that never goes back.

The ledger (gpumon/nccl/ledger.py) keeps totals per training process. A job's sum over its ranks' current
processes would fall whenever a rank restarts or leaves the node, which Prometheus reads as a reset and
counts again in full. So each job keeps its own totals and adds each process's growth since the previous
render; a process whose totals fell (the ledger forgot it) adds its totals afresh. A process counts once
however many of the job's ranks it reports (one process driving several GPUs writes one dump).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpumon.nccl.ledger import Totals

Process = tuple[str, int]  # hostname, pid


@dataclass
class _Job:
    totals: dict[str, list[float]] = field(default_factory=dict)  # operation → operations, seconds, bus bytes
    last: dict[Process, dict[str, Totals]] = field(default_factory=dict)  # per process, as added


class JobNccl:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}

    def add(self, job: str, process: Process, totals: Mapping[str, Totals]) -> None:
        """The totals of a process of the job's, as they stand."""
        with self._lock:
            j = self._jobs.setdefault(job, _Job())
            before = j.last.get(process, {})
            if any(op not in totals or totals[op].operations < t.operations for op, t in before.items()):
                before = {}
            for op, t in totals.items():
                was = before.get(op, Totals(0, 0.0, 0.0))
                acc = j.totals.setdefault(op, [0.0, 0.0, 0.0])
                acc[0] += t.operations - was.operations
                acc[1] += max(0.0, t.seconds - was.seconds)
                acc[2] += max(0.0, t.bus_bytes - was.bus_bytes)
            j.last[process] = dict(totals)

    def get(self, job: str) -> dict[str, tuple[float, float, float]]:
        with self._lock:
            j = self._jobs.get(job)
            return {} if j is None else {op: (t[0], t[1], t[2]) for op, t in sorted(j.totals.items())}

    def keep(self, processes: Iterable[tuple[str, Process]]) -> None:
        """Keep the (job, process) pairs ranks report now; forget the others, and jobs left with none (a job
        that returns starts afresh)."""
        wanted = set(processes)
        with self._lock:
            for job, j in list(self._jobs.items()):
                for process in [p for p in j.last if (job, p) not in wanted]:
                    del j.last[process]
                if not j.last:
                    del self._jobs[job]
