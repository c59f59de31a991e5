"""The NICs over the diagnosis window: each port's traffic as a share of its line rate, and its errors.

A communication verdict needs the network's side: a rank that spends its step in collectives while its NICs
move data near their line rate is network-bound; one whose NICs idle meanwhile waits for a slower peer. This
keeps one point per NIC reading (the daemon reads the ports every few seconds, net/reader.py) and gives,
for the NICs nearest a rank's GPUs, the busier direction's bytes per second over the window as a share of
the link's rate, and the error counters' growth.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from gpumon.gpu.snapshot import Snapshot
from gpumon.net.rdma import CONGESTION, ERRORS, RETRANSMITS

MAX_POINTS = 512  # per port: over an hour of readings every 5 s, far beyond any window
KEEP_AFTER = 30.0  # seconds beyond the window: a finished rank is judged by a window that ended earlier
MAX_GONE = 256  # NICs remembered as gone


class _Point(NamedTuple):
    t: float
    receive: int | None
    transmit: int | None
    errors: dict[str, int]  # the ERRORS counters read this time
    up: bool | None
    speed: float | None
    retransmits: dict[str, int]  # the RETRANSMITS counters read this time (none: not a RoCE port of mlx5)
    cnps: dict[str, int]  # the CONGESTION counters read this time


@dataclass(frozen=True, slots=True)
class NicUse:
    """The NICs nearest a rank's GPUs over its window."""

    nics: tuple[str, ...]  # their RDMA devices
    utilization: float | None  # the busiest port's busier direction, of its line rate; None: too few points
    errors: float | None  # the error counters' growth over the window, all ports together
    down: tuple[str, ...]  # ports not ACTIVE now, as device/port, and NICs gone from the readings
    retransmit_rate: float | None = None  # the transport's retries a second, all ports together (RoCE)
    cnp_rate: float | None = None  # congestion notifications handled a second, all ports together


class NicHistory:
    def __init__(self) -> None:
        self._points: dict[tuple[str, int], deque[_Point]] = {}
        self._seen: float | None = None
        self._gone: set[str] = set()  # NICs an earlier reading had and the latest has not
        self._lock = threading.Lock()

    def observe(self, snap: Snapshot | None, window: float) -> None:
        """One point per port of a new NIC reading (a snapshot whose reading was seen already adds none)."""
        if snap is None or snap.nics is None or snap.nics_at is None:
            return
        with self._lock:
            if snap.nics_at == self._seen:
                return
            self._seen = at = snap.nics_at
            live = set()
            for p in snap.nics:
                key = (p.device, p.port)
                live.add(key)
                point = _Point(
                    at,
                    p.receive_bytes,
                    p.transmit_bytes,
                    _only(p.errors, ERRORS),
                    p.up,
                    p.rate_bytes_per_second,
                    _only(p.hw_counters, RETRANSMITS),
                    _only(p.hw_counters, CONGESTION),
                )
                points = self._points.setdefault(key, deque(maxlen=MAX_POINTS))
                if points and at <= points[-1].t:  # a clock stepped back: start afresh
                    points.clear()
                points.append(point)
                while len(points) > 2 and points[1].t < at - window - KEEP_AFTER:
                    points.popleft()
            before = {k[0] for k in self._points}
            for key in set(self._points) - live:  # a port gone (an adapter reset, unplugged)
                del self._points[key]
            now_read = {k[0] for k in live}
            self._gone = (self._gone | (before - now_read)) - now_read
            while len(self._gone) > MAX_GONE:  # names can churn (a hostile --sys-root tree)
                self._gone.pop()

    def use(self, devices: Iterable[str], now: float, window: float) -> NicUse | None:
        """The ports of ``devices`` over [now - window, now]; None when none of them was read."""
        wanted = tuple(sorted(set(devices)))
        with self._lock:
            gone = set(self._gone)
            ports = {
                k: [p for p in v if now - window <= p.t <= now]
                for k, v in self._points.items()
                if k[0] in wanted
            }
        ports = {k: v for k, v in ports.items() if v}
        # a NIC that vanished from the readings (reset, unplugged, its driver unloaded) is down, not unknown
        down = [f"{d} (gone)" for d in wanted if d in gone]
        if not ports and not down:
            return None
        shares: list[float] = []
        grew: list[int] = []  # per port
        retries: list[float] = []
        cnps: list[float] = []
        for (device, port), points in sorted(ports.items()):
            first, last = points[0], points[-1]
            if last.up is False:
                down.append(f"{device}/{port}")
            if last.t <= first.t:
                continue
            span = last.t - first.t
            rates = [
                (b - a) / span
                for a, b in ((first.receive, last.receive), (first.transmit, last.transmit))
                if a is not None and b is not None and b >= a  # a counter that went back: reset, no rate
            ]
            if rates and last.speed:
                shares.append(min(1.0, max(rates) / last.speed))
            if (errors := _growth(first.errors, last.errors)) is not None:
                grew.append(errors)
            for out, a, b in ((retries, first.retransmits, last.retransmits), (cnps, first.cnps, last.cnps)):
                if (more := _growth(a, b)) is not None:
                    out.append(more / span)
        return NicUse(
            nics=wanted,
            utilization=max(shares) if shares else None,
            errors=float(sum(grew)) if grew else None,
            down=tuple(down),
            retransmit_rate=sum(retries) if retries else None,
            cnp_rate=sum(cnps) if cnps else None,
        )


def _only(counters: dict[str, int], names: tuple[str, ...]) -> dict[str, int]:
    return {n: counters[n] for n in names if n in counters}


def _growth(first: dict[str, int], last: dict[str, int]) -> int | None:
    """How much the counters read at both points grew; None where none was, or one went back (a reset). A
    counter missing from one reading (a firmware query that timed out) is left out, not counted whole."""
    both = first.keys() & last.keys()
    if not both or any(last[n] < first[n] for n in both):
        return None
    return sum(last[n] - first[n] for n in both)
