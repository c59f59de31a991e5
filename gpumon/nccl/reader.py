"""Reads the Inspector's dump directory every few seconds on a thread of its own, into a NcclLedger.

What the reading met is counted for the exposition (gpumon_training_nccl_records_total by outcome, bytes
skipped, files followed); a directory that cannot be listed is logged once until it can be again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpumon.nccl.ledger import NcclLedger, Outcome
from gpumon.nccl.records import BadRecord, parse
from gpumon.nccl.tail import DumpDir

log = logging.getLogger("gpumon.nccl")

READ_EVERY = 5.0
BUDGET = 8 << 20  # bytes parsed per pass: about 4,000 records a second; more are skipped (a sample)
INVALID = "invalid"  # not a v4 record
FOREIGN = "foreign"  # a record of another process than its file names
OUTCOMES = (Outcome.COUNTED, Outcome.DUPLICATE, Outcome.UNMEASURED, INVALID, FOREIGN)


class InspectorReader:
    def __init__(
        self,
        path: str,
        ledger: NcclLedger | None = None,
        *,
        every: float | None = READ_EVERY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``every``: seconds between passes on this reader's thread; None: passes only by read_once()."""
        self.path = path
        self.ledger = ledger or NcclLedger()
        self.every = every
        self.clock = clock
        self.dump = DumpDir(path)
        self._lock = threading.Lock()
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.skipped_bytes = 0
        self.files = 0
        self._failing: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.every is not None and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpumon-nccl", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def counts(self) -> tuple[dict[str, int], int, int]:
        """(records by outcome, bytes skipped, files followed): what the exposition shows."""
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
        found = self.dump.read(BUDGET)
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
            if (record.hostname, record.pid) != (host, pid):
                counted[FOREIGN] += 1
                continue
            counted[self.ledger.add(record, now)] += 1
        with self._lock:
            for outcome, n in counted.items():
                self.outcomes[outcome] += n
            self.skipped_bytes += found.skipped_bytes
            self.files = found.files
