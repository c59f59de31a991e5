"""What the diagnosis remembers between evaluations: a job's unthrottled speed, and the verdict it holds.

Each evaluation (a scrape, an API read) sees one window of signals. Two questions need more than that:

- did throttling cost the job anything? Its busy seconds per step now (the step less the phases
  throttling does not slow: waits, checkpoints, evaluation, whose count in a window varies) against the
  same while its GPUs were not throttled, over the last REFERENCE_SECONDS (the median, so a slow phase of
  its own does not become the reference), or its seconds per step against its baseline's when one is
  recorded;
- is a new verdict real, or one window's excursion? A verdict between two bottlenecks changes only once the
  new one has held for SETTLE_SECONDS of evaluations, and so does one between idle and stalled, and a claim
  given up for "undetermined"; facts (a GPU down, a process gone, progress stopping or resuming), a way out
  of "undetermined" and first verdicts change at once.

Both are bounded: keys not evaluated for FORGET_SECONDS are dropped.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

REFERENCE_SECONDS = 600.0
REFERENCE_EVERY = 5.0  # seconds between two samples of one key's speed
MAX_SAMPLES = REFERENCE_SECONDS / REFERENCE_EVERY
SETTLE_SECONDS = 10.0
# a held verdict not evaluated for this long is history, not a verdict to hold: the same key can come back
# (a job's ranks as they were before a rank that has since expired joined), and its old state must not delay
# the new verdict
STALE_SECONDS = 60.0
FORGET_SECONDS = 900.0
# facts about the rank, taken and left at once
FACTS = frozenset({"gpu_down", "exited"})
NO_PROGRESS = frozenset({"idle", "stalled"})  # progress stopping or resuming is a fact too; which of the two
# it is depends on GPU activity near a threshold, and settles like a bottleneck
WEAK = "undetermined"  # no claim: left at once, and taken only once it has settled


@dataclass
class _Speed:
    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=int(MAX_SAMPLES)))
    seen: float = 0.0


def _forget(keys: dict[Hashable, Any], now: float) -> None:
    """Drop the keys not evaluated for FORGET_SECONDS (a job that went, a rank that restarted)."""
    for key in [k for k, v in keys.items() if now - v.seen > FORGET_SECONDS]:
        del keys[key]


class SpeedReference:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[Hashable, _Speed] = {}
        self._pruned = 0.0

    def slowdown(
        self,
        key: Hashable,
        cost: float | None,
        clean: bool,
        now: float,
        baseline: tuple[float, float] | None = None,
    ) -> tuple[float | None, str | None]:
        """``cost``: busy seconds per step (or per token) now; ``clean``: no clock limits in a settled
        window, so this speed can serve as the reference; ``baseline``: (seconds per step now, the
        baseline's), compared instead when given. Returns (fractional slowdown, what it is measured
        against)."""
        with self._lock:
            if now - self._pruned >= 60.0:
                self._pruned = now
                _forget(self._keys, now)
            speed = self._keys.setdefault(key, _Speed())
            speed.seen = now
            if cost is None or cost <= 0:
                return None, None
            if clean and (not speed.samples or now - speed.samples[-1][0] >= REFERENCE_EVERY):
                speed.samples.append((now, cost))
            recent = [c for t, c in speed.samples if now - t <= REFERENCE_SECONDS]
        if baseline is not None and baseline[1] > 0:
            return baseline[0] / baseline[1] - 1.0, "baseline"
        if not recent:
            return None, None
        return cost / statistics.median(recent) - 1.0, "recent"


@dataclass
class _Held:
    verdict: str
    candidate: str | None = None
    since: float = 0.0  # when the candidate was first seen, unbroken since
    seen: float = 0.0


class VerdictHold:
    def __init__(self, settle: float = SETTLE_SECONDS) -> None:
        self.settle = settle
        self._lock = threading.Lock()
        self._keys: dict[Hashable, _Held] = {}
        self._pruned = 0.0

    def hold(self, key: Hashable, raw: str, now: float) -> str:
        """The verdict to show for ``key`` given this evaluation's ``raw`` one."""
        with self._lock:
            if now - self._pruned >= 60.0:
                self._pruned = now
                _forget(self._keys, now)
            held = self._keys.get(key)
            if (
                held is None
                or now < held.seen
                or now - held.seen > STALE_SECONDS
                or _at_once(held.verdict, raw)
            ):
                self._keys[key] = _Held(raw, seen=now)
                return raw
            held.seen = now
            if raw == held.verdict:
                held.candidate = None
            elif raw != held.candidate:
                held.candidate, held.since = raw, now
            elif now - held.since >= self.settle:
                held.verdict, held.candidate = raw, None
            return held.verdict


def _at_once(held: str, raw: str) -> bool:
    if raw in FACTS or held in FACTS or held == WEAK:
        return True
    return (raw in NO_PROGRESS) != (held in NO_PROGRESS)
