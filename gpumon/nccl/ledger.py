"""The records read, per training process (hostname, pid): cumulative totals per operation for the job's
counters, and recent points for the diagnosis window.

A record is counted once. The plugin drains each communicator's ring of completed operations at every dump,
but a file read from its start again (truncated, replaced) or a plugin that writes the latest operation at
each dump (NCCL 2.28 and older) repeats sequence numbers; and operations complete out of their numbering
(a communicator's sends and receives share one counter, numbered when they start). So each communicator's
rank and kind keeps its highest sequence number and which of the SEEN numbers below it were read: one read
again, or older than that, counts nothing. Sequence numbers that skip (a ring that overflowed between dumps,
the older plugin's one per dump) are not made up: the totals are of the operations read, a sample whose bus
bandwidth (bus bytes over seconds) is NCCL's own.

Bounded: MAX_PROCESSES processes (the least recently written go first), MAX_COMMUNICATORS per process,
MAX_OPERATIONS names per process (later names count under "_other"), MAX_POINTS points per process, one per
operation and read, none older than KEEP_POINTS.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from gpumon.nccl.records import Record

MAX_PROCESSES = 1024
MAX_COMMUNICATORS = 64
MAX_OPERATIONS = 12
MAX_POINTS = 1024
KEEP_POINTS = 3660.0  # seconds: the longest --rate-window, and a finished rank's last minute
SEEN = 256  # sequence numbers below the highest remembered per communicator rank (out-of-order completions)
OTHER = "_other"  # NCCL's names start with a letter: this one cannot be an operation's
FORGET_AFTER = 3600.0  # seconds without a record
START_SLACK = 5.0  # seconds between a process's start and the clock of the reads

Process = tuple[str, int]


class Totals(NamedTuple):
    operations: int
    seconds: float
    bus_bytes: float  # bus bandwidth x time: NCCL's bus bytes


@dataclass(frozen=True, slots=True)
class NcclUse:
    """A process's records over a window."""

    operations: int
    seconds: float  # their execution time, summed over communicators (overlapping ones count twice)
    bus_bytes_per_second: float | None  # their bus bandwidth, weighted by time; None: no time measured
    busiest: str | None  # the operation with the most time


class _Point(NamedTuple):
    """The records of one operation read at one time (one pass of the reader)."""

    t: float
    operation: str
    seconds: float
    bus_bytes: float
    operations: int


@dataclass
class _Process:
    born: float  # when its first record was read
    last: float
    generation: int  # a new one each time the ledger meets the process afresh
    # (communicator, rank, kind) → (highest sequence number, bit i: that number less i was read)
    sns: dict[tuple[str, int, str], tuple[int, int]] = field(default_factory=dict)
    totals: dict[str, list[float]] = field(default_factory=dict)  # operation → [operations, seconds, bytes]
    points: deque[_Point] = field(default_factory=lambda: deque(maxlen=MAX_POINTS))


class Outcome:
    COUNTED = "counted"
    DUPLICATE = "duplicate"
    UNMEASURED = "unmeasured"  # no bus bandwidth ("nan")


class NcclLedger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[Process, _Process] = {}
        self._generations = 0
        self.ambiguous: frozenset[Process] = frozenset()  # claimed by ranks of two jobs: joined to neither

    def add(self, record: Record, now: float) -> str:
        """Count one record, read at ``now``; returns its Outcome."""
        key = (record.hostname, record.pid)
        with self._lock:
            p = self._procs.pop(key, None)  # re-inserted last: the dict's order is recency
            if p is None:
                self._generations += 1
                p = _Process(now, now, self._generations)
                if len(self._procs) >= MAX_PROCESSES:
                    del self._procs[next(iter(self._procs))]
            self._procs[key] = p
            p.last = now
            if not _first_time(p, (record.communicator, record.rank, record.kind), record.sn):
                return Outcome.DUPLICATE
            if record.bus_bytes_per_second is None:
                return Outcome.UNMEASURED
            name = record.operation
            if name not in p.totals and len(p.totals) >= MAX_OPERATIONS:
                name = OTHER
            bus = record.bus_bytes_per_second * record.seconds
            t = p.totals.setdefault(name, [0, 0.0, 0.0])
            t[0] += 1
            t[1] += record.seconds
            t[2] += bus
            _note(p.points, _Point(now, name, record.seconds, bus, 1))
            while p.points and p.points[0].t < now - KEEP_POINTS:
                p.points.popleft()
            return Outcome.COUNTED

    def claim(self, process: Process, started: float | None) -> None:
        """A rank reports ``process``, started at ``started`` (unix seconds; None: unknown): what was read of
        its name before it started is a previous process's (a pid and pod name used again), and goes."""
        if started is None:
            return
        with self._lock:
            p = self._procs.get(process)
            if p is not None and p.born < started - START_SLACK:
                del self._procs[process]

    def generation_totals(self, hostname: str, pid: int) -> tuple[int, dict[str, Totals]]:
        """(the ledger's generation of the process, 0 for none; its totals per operation since this daemon
        first read it)."""
        with self._lock:
            p = self._procs.get((hostname, pid))
            if p is None:
                return 0, {}
            return p.generation, {op: Totals(int(t[0]), t[1], t[2]) for op, t in p.totals.items()}

    def use(self, hostname: str, pid: int, now: float, window: float) -> NcclUse | None:
        """The process's records read within [now - window, now]; None where there are none, or where ranks
        of two jobs claim the process."""
        with self._lock:
            p = None if (hostname, pid) in self.ambiguous else self._procs.get((hostname, pid))
            points = []
            for x in reversed(p.points) if p is not None else ():  # in time order: newest first, stop early
                if x.t < now - window:
                    break
                if x.t <= now:
                    points.append(x)
        if not points:
            return None
        seconds = sum(x.seconds for x in points)
        by_op: dict[str, float] = {}
        for x in points:
            by_op[x.operation] = by_op.get(x.operation, 0.0) + x.seconds
        return NcclUse(
            operations=sum(x.operations for x in points),
            seconds=seconds,
            bus_bytes_per_second=sum(x.bus_bytes for x in points) / seconds if seconds > 0 else None,
            busiest=max(by_op, key=lambda k: by_op[k]),
        )

    def forget(self, now: float, keep: Iterable[Process] = ()) -> None:
        """Drop the processes without a record for FORGET_AFTER, but those in ``keep`` (ranks report them)."""
        kept = set(keep)
        with self._lock:
            for key in [k for k, p in self._procs.items() if now - p.last > FORGET_AFTER and k not in kept]:
                del self._procs[key]

    def processes(self) -> list[Process]:
        with self._lock:
            return list(self._procs)


def _first_time(p: _Process, comm: tuple[str, int, str], sn: int) -> bool:
    """Whether ``sn`` of this communicator rank was not read before (and note it)."""
    before = p.sns.get(comm)
    if before is None:
        if len(p.sns) >= MAX_COMMUNICATORS:
            p.sns.pop(next(iter(p.sns)))
        p.sns[comm] = (sn, 1)
        return True
    high, seen = before
    if sn > high:
        shift = sn - high
        p.sns[comm] = (sn, ((seen << shift) | 1) & ((1 << SEEN) - 1) if shift < SEEN else 1)
        return True
    back = high - sn
    if back >= SEEN or seen >> back & 1:
        return False
    p.sns[comm] = (high, seen | 1 << back)
    return True


def _note(points: deque[_Point], new: _Point) -> None:
    """Add to the point of the same operation and time (a pass reads many records at one time), else append:
    MAX_POINTS then spans MAX_POINTS / (MAX_OPERATIONS + 1) passes however many records each brings."""
    for i in range(1, min(len(points), MAX_OPERATIONS + 1) + 1):
        q = points[-i]
        if q.t != new.t:
            break
        if q.operation == new.operation:
            points[-i] = q._replace(
                seconds=q.seconds + new.seconds,
                bus_bytes=q.bus_bytes + new.bus_bytes,
                operations=q.operations + 1,
            )
            return
    points.append(new)
