"""Connection hygiene for the HTTP listener: deadlines for a request's headers and for the whole request, and
a cap on open connections that sheds idle ones before the process runs out of file descriptors.

uvicorn closes a keep-alive connection that stays silent after a response (``timeout_keep_alive``) and
nothing else: a connection that never sends a request, or sends its headers a byte at a time, stays open
for good, and about a thousand of them exhaust the default 1,024-fd limit (docs/performance.md, "Connection
hygiene"). uvicorn's ``limit_concurrency`` does not help: it answers 503 to requests but still accepts the
connections. The deadlines and the cap are added here, as a subclass of the protocol class uvicorn chose
(httptools or h11); both keep the request in flight in ``cycle`` and call ``on_response_complete``, which is
all this needs.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumon import metrics as M

log = logging.getLogger(__name__)

# fds the process needs besides HTTP connections (NVML's device files, the listeners, logs, /proc reads,
# the baseline library) plus one accept burst: asyncio accepts up to the listen backlog (128) connections
# before any of them reaches the cap below
FD_RESERVE = 256
DEFAULT_MAX_CONNECTIONS = 1024
REASONS = ("header_timeout", "request_timeout", "shed")


@dataclass(frozen=True)
class Limits:
    header_timeout: float = 10.0  # request line and headers, from connect or from the previous response
    request_timeout: float = 30.0  # a whole request: headers and body, from its first byte
    keep_alive: float = 5.0  # silence allowed after a response before the connection is closed
    max_connections: int = DEFAULT_MAX_CONNECTIONS


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as Go programs do at start): the 1,024 soft default
    of many systems and container runtimes is too small for a daemon that scrapers, probes and every training
    rank connect to. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # e.g. above fs.nr_open
            log.debug("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, target, exc)
    return soft


def connection_cap(wanted: int, fd_limit: int) -> int:
    """``wanted``, lowered so that open connections can never take the fds the daemon itself needs."""
    return max(1, min(wanted, fd_limit - FD_RESERVE))


class Gate:
    """The open HTTP connections of every listener (TCP and unix share the fd table), oldest first, and what
    was closed by force, by reason."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._open: dict[Any, None] = {}  # insertion-ordered: the newest last
        self.closed: Counter[str] = Counter()

    @property
    def open(self) -> int:
        return len(self._open)

    def admit(self, conn: Any) -> None:
        self._open[conn] = None
        while len(self._open) > self.limits.max_connections:
            # the newest idle one: the oldest are nearest their deadline anyway, and a connection that has
            # already been served (a scraper's keep-alive) has shown it is a client; a flood is recent. With
            # every other connection busy answering a request, the newcomer is the one turned away.
            victim = next(
                (c for c in reversed(self._open) if c is not conn and c.idle() and not c.closing()), conn
            )
            victim.drop("shed")  # releases it: each turn of this loop frees a place
            if victim is conn:
                return

    def release(self, conn: Any) -> None:
        self._open.pop(conn, None)

    def dropped(self, conn: Any, reason: str) -> None:
        """``conn`` is being closed by force: released now, not when asyncio reports the loss (its fd is
        freed on the next turn of the loop), and counted."""
        self.release(conn)
        self.closed[reason] += 1

    def describe(self) -> list[Metric]:
        """Its families by name, so that ``/metrics?name[]=`` can select them."""
        kinds = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily}
        return [kinds[m.type](m.name, m.help, labels=m.labels) for m in M.SERVING]

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(M.HTTP_CONNECTIONS.name, M.HTTP_CONNECTIONS.help, value=self.open)
        yield GaugeMetricFamily(
            M.HTTP_CONNECTIONS_LIMIT.name, M.HTTP_CONNECTIONS_LIMIT.help, value=self.limits.max_connections
        )
        closed = CounterMetricFamily(
            M.HTTP_CONNECTIONS_CLOSED.name,
            M.HTTP_CONNECTIONS_CLOSED.help,
            labels=M.HTTP_CONNECTIONS_CLOSED.labels,
        )
        for reason in REASONS:
            closed.add_metric([reason], self.closed[reason])
        yield closed


def guarded(protocol_class: type[asyncio.Protocol], gate: Gate) -> type[asyncio.Protocol]:
    """``protocol_class`` (uvicorn's httptools or h11 protocol) with the gate's deadlines and cap."""

    class Guarded(protocol_class):  # type: ignore[valid-type,misc]
        _deadline: asyncio.TimerHandle | None = None
        _current: Any = None  # the request whose headers were last completed (uvicorn's cycle)
        _dropped = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._loop = asyncio.get_running_loop()
            self._arm(gate.limits.header_timeout, "header_timeout")
            self._request_deadline: asyncio.TimerHandle | None = None
            gate.admit(self)

        def connection_lost(self, exc: Exception | None) -> None:
            gate.release(self)
            self._disarm()
            self._disarm_request()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._request_deadline is None and self.idle():
                # the first byte of a request: from here it has request_timeout in all
                self._request_deadline = self._loop.call_later(
                    gate.limits.request_timeout, self.drop, "request_timeout"
                )
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and cycle is not self._current:
                self._current = cycle  # headers complete: a new request is in
                self._disarm()
            if cycle is not None and cycle is self._current and not cycle.more_body:
                self._disarm_request()  # the whole request arrived; the response is ours to make

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.idle():
                self._arm(gate.limits.header_timeout, "header_timeout")

        def idle(self) -> bool:
            """Waiting for a request: none yet, or the last one answered (uvicorn's own test at shutdown)."""
            return self.cycle is None or bool(self.cycle.response_complete)

        def closing(self) -> bool:
            return self._dropped or self.transport is None or self.transport.is_closing()

        def drop(self, reason: str) -> None:
            if self.closing():
                return
            if reason != "shed" and not self.idle() and not self._reading():
                return  # the request arrived and is being answered: the deadline was for reading it
            self._dropped = True
            gate.dropped(self, reason)
            log.debug("closing connection from %s: %s", self.client, reason)
            self.transport.abort()  # at once, the fd with it: an idle peer has nothing to flush to

        def _reading(self) -> bool:
            cycle = self.cycle
            return cycle is not None and cycle is self._current and bool(cycle.more_body)

        def _arm(self, seconds: float, reason: str) -> None:
            self._disarm()
            self._deadline = self._loop.call_later(seconds, self.drop, reason)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _disarm_request(self) -> None:
            if self._request_deadline is not None:
                self._request_deadline.cancel()
                self._request_deadline = None

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{protocol_class.__name__}"
    return Guarded
