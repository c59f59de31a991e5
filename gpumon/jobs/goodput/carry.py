"""When a restart booked from another node's process reaches /metrics: after the rank's series exist.

A rank that moved to another node (its predecessor named by the SDK's state file) books the dead gap since
the predecessor's last step as ``restart`` at its first report. On this node its series are new, and a
counter born at its value is invisible to Prometheus's rate() and increase(), which see only growth between
samples: the gap would never show. So the exposition publishes the carried seconds (and the restart they
count) only once the rank's series have been served without them at least twice (two scrapes, or one scrape
each of an HA pair scraping together). The ledger and GET /v1/jobs have them at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from gpumon.jobs.goodput.ledger import LedgerView

SERVED_FIRST = 2  # /metrics renders that show a rank's series before a carried restart joins them


class CarryGate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (job, rank) -> [carried seconds published, moves published, renders since more was carried]
        self._state: dict[tuple[str, int], list[float]] = {}

    def held(self, key: tuple[str, int], ledger: LedgerView) -> tuple[float, int]:
        """What of the ledger's carried restarts this render leaves out: (seconds, restarts)."""
        with self._lock:
            st = self._state.get(key)
            if st is None:
                st = self._state[key] = [0.0, 0.0, 0.0]
            if ledger.carried < st[0] or ledger.moves < st[1]:  # a new ledger for the rank (it expired)
                st[0], st[1], st[2] = min(st[0], ledger.carried), min(st[1], ledger.moves), 0.0
            if ledger.carried > st[0] or ledger.moves > st[1]:
                if st[2] >= SERVED_FIRST:
                    st[0], st[1], st[2] = ledger.carried, float(ledger.moves), 0.0
                else:
                    st[2] += 1
            return ledger.carried - st[0], ledger.moves - int(st[1])

    def keep(self, keys: Iterable[tuple[str, int]]) -> None:
        """Forget ranks no longer exported."""
        wanted = set(keys)
        with self._lock:
            for key in [k for k in self._state if k not in wanted]:
                del self._state[key]
