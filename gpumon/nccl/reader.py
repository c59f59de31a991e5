"""Reads the Inspector's dump directory every few seconds on a thread of its own, into a NcclLedger, and adds
each pass's growth to the jobs whose ranks report the processes (jobtotals.py).

Only the files of processes that ranks report to this daemon are read (``claims``: their job, hostname, pid
and start): a directory shared by a fleet, or floods from processes nobody reports, cost a listing. A process
claimed by ranks of two jobs (a rank reporting another's hostname and pid, pods on the host's network with
one pid) is joined to neither. What the reading met is counted for the exposition
(gpumon_training_nccl_records_total by outcome, bytes skipped, files); a directory that cannot be listed is
logged once until it can be again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from gpumon.nccl.jobtotals import JobNccl
from gpumon.nccl.ledger import NcclLedger, Outcome
from gpumon.nccl.records import BadRecord, parse
from gpumon.nccl.tail import DumpDir

log = logging.getLogger("gpumon.nccl")

READ_EVERY = 5.0
BUDGET = 4 << 20  # bytes parsed per pass: about 1,800 records a second; more are skipped (a sample)
INVALID = "invalid"  # not a v4 record
FOREIGN = "foreign"  # a record of another process than its file names
STATS = "stats"  # a v4 record of the plugin's own counts (dump_stats), no operation
OUTCOMES = (Outcome.COUNTED, Outcome.DUPLICATE, Outcome.UNMEASURED, STATS, INVALID, FOREIGN)


class Claim(NamedTuple):
    """A rank reporting to this daemon, as the dumps know its process."""

    job: str
    hostname: str
    pid: int
    started: float | None  # the process's start (unix seconds), where its SDK said


class InspectorReader:
    def __init__(
        self,
        path: str,
        ledger: NcclLedger | None = None,
        *,
        claims: Callable[[], Iterable[Claim]] | None = None,
        every: float | None = READ_EVERY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``claims``: the ranks reporting now (None: read every file, join none); ``every``: seconds between
        passes on this reader's thread; None: passes only by read_once()."""
        self.path = path
        self.ledger = ledger or NcclLedger()
        self.claims = claims
        self.jobs = JobNccl()
        self.every = every
        self.clock = clock
        self.dump = DumpDir(path)
        self._lock = threading.Lock()
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.skipped_bytes = 0
        self.files = (0, 0)  # read, left unread
        self._failing: str | None = None
        self._warned: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.every is not None and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpumon-nccl", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def counts(self) -> tuple[dict[str, int], int, tuple[int, int]]:
        """(records by outcome, bytes skipped, (files read, files left unread)): what the exposition shows."""
        with self._lock:
            return dict(self.outcomes), self.skipped_bytes, self.files

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.read_once()
            except Exception:  # one bad pass must not end the reading
                log.exception("reading the NCCL Inspector's dumps in %s failed", self.path)
            self._stop.wait(self.every or READ_EVERY)

    def read_once(self) -> None:
        claims = None if self.claims is None else list(self.claims())
        owners: dict[tuple[str, int], set[str]] = {}
        started: dict[tuple[str, int], float | None] = {}
        for c in claims or ():
            owners.setdefault((c.hostname, c.pid), set()).add(c.job)
            started[(c.hostname, c.pid)] = c.started
        ambiguous = frozenset(p for p, jobs in owners.items() if len(jobs) > 1)
        for process in ambiguous - self._warned:
            log.warning(
                "NCCL Inspector dump of %s pid %d: ranks of jobs %s all report this process; its records "
                "join none of them",
                *process,
                ", ".join(sorted(owners[process])),
            )
        self._warned = set(ambiguous)
        self.ledger.ambiguous = ambiguous
        for process, at in started.items():
            self.ledger.claim(process, at)
        first = self.dump.first
        found = self.dump.read(None if claims is None else started, BUDGET)
        if first and found.error is None:
            log.info(
                "NCCL Inspector dumps in %s: %d files there now are read from their end, newer ones whole",
                self.path,
                found.listed,
            )
        if found.error is not None:
            if self._failing != found.error:
                log.warning("cannot read NCCL Inspector dumps: %s", found.error)
            self._failing = found.error
        elif self._failing is not None:
            log.info("reading NCCL Inspector dumps in %s again", self.path)
            self._failing = None
        now = self.clock()
        counted = dict.fromkeys(OUTCOMES, 0)
        for host, pid, line in found.lines:
            try:
                record = parse(line)
            except BadRecord:
                counted[INVALID] += 1
                continue
            if record is None:
                counted[STATS] += 1
            elif (record.hostname, record.pid) != (host, pid):
                counted[FOREIGN] += 1
            else:
                counted[self.ledger.add(record, now)] += 1
        if claims is not None:
            # each job adds its processes' growth now, not at a scrape: a rank that restarts or finishes
            # between two scrapes keeps what its last dump brought; a process two jobs claim adds to neither
            for process, jobs in owners.items():
                generation, totals = self.ledger.generation_totals(*process)
                for job in jobs:
                    note = self.jobs.hold if process in ambiguous else self.jobs.add
                    note(job, process, generation, totals, now)
            self.jobs.keep({job for jobs in owners.values() for job in jobs}, now)
            self.ledger.forget(now, owners)
        with self._lock:
            for outcome, n in counted.items():
                self.outcomes[outcome] += n
            self.skipped_bytes += found.skipped_bytes
            self.files = (found.files, found.unread)
