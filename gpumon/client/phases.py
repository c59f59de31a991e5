"""Phase timers: the context managers a Reporter hands out to time data loading, compute, communication.

On the hot path: entering and leaving a phase reads perf_counter and does arithmetic, nothing else.
Standard library only: this module runs inside training processes.
"""

from __future__ import annotations

import time

_perf = time.perf_counter


class Phase:
    """Times one named phase; Reporter.phase() hands out one cached instance per name. Nesting the same
    phase times only the outermost block. Being shared, it belongs to one thread (the training loop's);
    other threads time themselves and call add_phase()."""

    __slots__ = ("_depth", "_start", "name", "seconds")

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds = 0.0
        self._depth = 0
        self._start = 0.0

    def __enter__(self) -> Phase:
        if self._depth == 0:
            self._start = _perf()
        self._depth += 1
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        depth = self._depth - 1
        if depth > 0:
            self._depth = depth
        elif depth == 0:
            self._depth = 0
            self.seconds += _perf() - self._start
        # below 0: an exit without its enter (a block entered before a fork, say) is ignored

    def _discard(self) -> None:
        """Leave the block without counting its time: the framework callbacks hold ``data_wait`` open from
        their last hook before a fetch, and a later hook (a validation, a save, the epoch's end) shows that
        the time since was not spent waiting for data."""
        if self._depth > 0:
            self._depth -= 1


class NullPhase:
    """What a disabled Reporter, or a bad phase name, hands out."""

    __slots__ = ()

    def __enter__(self) -> NullPhase:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        return None

    def _discard(self) -> None:
        return None


NULL_PHASE = NullPhase()
