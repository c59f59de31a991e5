"""Counters of rare events, absent until the first one and then shown at 0 before their value.

Most ranks never restart, redo steps, retry an allocation or lose time to most badput causes; a series per
cause per rank from 0 made ten series of zeros per rank. Such a counter is left out until it is first above
0. A counter born at its value is invisible to Prometheus's rate() and increase(), which see only growth
between samples: the first restart would never show. So when one first has a value, the exposition serves
it at 0 for SERVED_FIRST renders (two scrapes, or one scrape each of an HA pair scraping together) and only
then its value. The ledger and GET /v1/jobs have the value at once. This also covers a restart carried from
another node (a rank that moved: its restart series are new here).

Except after a restart of the daemon: a rank whose process is older than this daemon, seen for the first
time, had its counters exported by the daemon before; a dip to 0 would read as a reset and count them
twice. Those are served at their value at once.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable

SERVED_FIRST = 2  # renders that show a counter at 0 before its first value

Rank = tuple[str, int]
Key = tuple[str, int, str, Hashable]  # job, rank, metric name, the rest of its labels


class ZeroFirst:
    def __init__(self, born: float) -> None:
        """``born``: when this daemon started (its clock)."""
        self._lock = threading.Lock()
        self._shown: dict[Key, int] = {}  # renders served at 0 so far (SERVED_FIRST: its value now)
        self._born = born
        self._seen: set[Rank] = set()  # ranks exported by an earlier render

    def value(self, key: Key, value: float, started: float | None = None) -> float | None:
        """What to export for the counter this render: None (no series), 0, or its value. ``started``: when
        the rank's process started, if known."""
        with self._lock:
            shown = self._shown.get(key)
            if shown is None:
                if value <= 0:
                    return None
                inherited = (
                    started is not None and started < self._born and (key[0], key[1]) not in self._seen
                )
                self._shown[key] = SERVED_FIRST if inherited else 1
                return value if inherited else 0.0
            if shown < SERVED_FIRST:
                self._shown[key] = shown + 1
                return 0.0
            return value

    def keep(self, ranks: Iterable[Rank]) -> None:
        """The render's exported ranks: the counters of any other are forgotten (one that comes back starts
        afresh)."""
        wanted = set(ranks)
        with self._lock:
            for key in [k for k in self._shown if (k[0], k[1]) not in wanted]:
                del self._shown[key]
            self._seen = wanted
