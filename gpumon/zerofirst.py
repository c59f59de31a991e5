"""Counters of rare events, absent until the first one and then shown at 0 before their value.

Most ranks never restart, redo steps, retry an allocation or lose time to most badput causes; a series per
cause per rank from 0 made ten series of zeros per rank. Such a counter is left out until it is first above
0. A counter born at its value is invisible to Prometheus's rate() and increase(), which see only growth
between samples: the first restart would never show. So when one first has a value, the exposition serves
it at 0 for at least ``hold`` seconds (--counter-hold: longer than the interval of every scraper) and
SERVED_FIRST renders, and only then its value. Time, not renders alone: a second scraper (an HA pair, a
vmagent, a curl loop) would otherwise use up the renders at 0 that Prometheus needed to see. The ledger and
GET /v1/jobs have the value at once. This also covers a restart carried from another node (a rank that
moved: its restart series are new here).

A counter the training process itself keeps (the allocator's retries and OOMs) of a process older than this
daemon is served at its value at once: the daemon before this one exported it, and a dip to 0 would count it
twice. The daemon's own counters (the ledger, restarts) start afresh with a new daemon and always dip.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable

SERVED_FIRST = 2  # renders that show a counter at 0 before its first value, however long the hold

Rank = tuple[str, int]
Key = tuple[str, int, str, Hashable]  # job, rank, metric name, the rest of its labels


class ZeroFirst:
    def __init__(self, born: float, hold: float = 60.0) -> None:
        """``born``: when this daemon started (its clock); ``hold``: seconds a new counter shows 0."""
        self._lock = threading.Lock()
        # when the counter was first served at 0 and the renders since; None: its value now
        self._shown: dict[Key, tuple[float, int] | None] = {}
        self._born = born
        self.hold = hold
        self._seen: set[Rank] = set()  # ranks exported by an earlier render, while retained

    def value(self, key: Key, value: float, now: float, process_started: float | None = None) -> float | None:
        """What to export for the counter this render: None (no series), 0, or its value.
        ``process_started``: for a counter the training process keeps, when that process started."""
        with self._lock:
            if key not in self._shown:
                if value <= 0:
                    return None
                kept = (
                    process_started is not None
                    and process_started < self._born
                    and (key[0], key[1]) not in self._seen
                )
                self._shown[key] = None if kept else (now, 1)
                return value if kept else 0.0
            shown = self._shown[key]
            if shown is None:
                return value
            since, renders = shown
            if renders < SERVED_FIRST or now - since < self.hold:
                self._shown[key] = (since, renders + 1)
                return 0.0
            self._shown[key] = None
            return value

    def keep(self, exported: Iterable[Rank], retained: Iterable[Rank]) -> None:
        """``exported``: the ranks this render served; ``retained``: those whose counters continue if they
        report again (the store keeps their offsets). The counters of any other rank are forgotten: one
        that comes back starts afresh, as its counters do."""
        wanted = set(retained) | set(exported)
        with self._lock:
            for key in [k for k in self._shown if (k[0], k[1]) not in wanted]:
                del self._shown[key]
            # shown by any earlier render while retained: a rank (a GPU, a port) missing from one render,
            # then back with a counter's first rise, must still show it at 0 first
            self._seen = (self._seen | set(exported)) & wanted
