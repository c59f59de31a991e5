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
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from socket import AF_UNIX
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumon import metrics as M
from gpumon.web.peer import Tagged, client_address, peer_of

log = logging.getLogger(__name__)

# fds the process needs besides HTTP connections (NVML's device files, the listeners, logs, /proc reads,
# the baseline library) plus one accept burst: asyncio accepts up to the listen backlog (128) connections
# before any of them reaches the cap below
FD_RESERVE = 256
DEFAULT_MAX_CONNECTIONS = 1024
REASONS = ("header_timeout", "request_timeout", "write_timeout", "header_too_large", "pipeline", "shed")
REFUSALS = ("bad_request", "passwords_busy", "too_many_names", "selections_busy", "abandoned")
# a request line and headers larger than this are refused (431): the header deadline bounds time, not bytes,
# and a head streamed without an end made the parser copy a growing URL or value again and again
MAX_HEAD_BYTES = 64 * 1024
# requests a connection may queue behind the one being answered (HTTP pipelining): each holds its parsed head
# and a task to be; no scraper or SDK pipelines, and a client that sends hundreds without reading an answer
# is closed
MAX_PIPELINED = 16
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: 43\r\n\r\nrequest line and headers larger than 64 KiB\n"
)


@dataclass(frozen=True)
class Limits:
    header_timeout: float = 10.0  # request line and headers, from connect or from the previous response
    request_timeout: float = 30.0  # a whole request: headers and body, from its first byte
    keep_alive: float = 5.0  # silence allowed after a response before the connection is closed
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # on the TCP listener
    # on the unix ingest socket, apart: network clients cannot take the ranks' places, nor ranks theirs
    # (0 without one)
    max_unix_connections: int = 0


# A connection still receiving its request this long is slow (a report arrives in milliseconds; a scraper's
# request is one packet): at the cap it is closed to let a newcomer in, the longest-reading first, rather
# than turn away a probe or a rank behind a thousand stalled bodies
SLOW_READ = 1.0
# A request being answered this long is waiting behind others (a render queue, the password slots): at a
# full cap, with nothing idle and nothing slow to send, the longest-waiting goes before a newcomer is turned
# away. Found by review: 80 keep-alive loops of distinct name[] selections against a cap of 64 kept every
# connection busy, and 159 of 184 probes were reset. A scrape is answered in milliseconds.
SLOW_ANSWER = 1.0
# A connection that has had this many requests answered per second of its life is a loop, not a scraper
# (one every 15 s), a probe (a connection per probe) or a rank (one a second): at a full cap, with nothing
# else to shed, the fastest such goes before a newcomer is turned away. Found by review: 64 connections from
# 64 loopback addresses, each answered back to back (and pipelining), turned every newcomer away, on TCP
# and on the unix socket (where every rank is the same "address").
LOOP_RATE = 5.0
# A connection this young that has sent nothing yet is not taken for idle: a probe sends its request within
# milliseconds of connecting, and was shed as "the newest idle" by the next loop reconnecting
FIRST_REQUEST_GRACE = 1.0


def _arriving(conn: Any, now: float) -> bool:
    """Connected under FIRST_REQUEST_GRACE ago and nothing asked yet: its first request is on its way."""
    opened = getattr(conn, "opened", None)
    return opened is not None and conn.answered == 0 and now - opened < FIRST_REQUEST_GRACE


def _host(conn: Any) -> str | None:
    """The client's address as one client (peer.client_address); None over the unix socket."""
    client = getattr(conn, "client", None)
    return client_address(str(client[0])) if client else None


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


def _cancel(timer: asyncio.TimerHandle | None) -> asyncio.TimerHandle | None:
    """Cancel a deadline if one is armed; returns what the attribute that held it becomes (None)."""
    if timer is not None:
        timer.cancel()
    return None


def _family(m: M.Metric) -> CounterMetricFamily | GaugeMetricFamily:
    kind = CounterMetricFamily if m.type == "counter" else GaugeMetricFamily
    return kind(m.name, m.help, labels=m.labels)


def connection_cap(wanted: int, fd_limit: int, lanes: int = 1) -> int:
    """``wanted`` per lane, lowered so that the open connections of every lane together can never take the
    fds the daemon itself needs."""
    return max(1, min(wanted, (fd_limit - FD_RESERVE) // lanes))


class Gate:
    """The open HTTP connections of every listener (TCP and unix share the fd table), oldest first, and what
    was closed by force, by reason."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        # per lane (TCP, unix), insertion-ordered: the newest last
        self._open: dict[bool, dict[Any, None]] = {False: {}, True: {}}
        self.closed: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # requests not served, by REFUSALS

    @property
    def open(self) -> int:
        return sum(len(lane) for lane in self._open.values())

    def cap(self, unix: bool) -> int:
        return self.limits.max_unix_connections if unix else self.limits.max_connections

    def admit(self, conn: Any) -> None:
        lane = self._open[bool(conn.unix)]
        lane[conn] = None
        while len(lane) > self.cap(bool(conn.unix)):
            victim = self._victim(lane, conn)
            victim.drop("shed")  # releases it: each turn of this loop frees a place
            if victim is conn:
                return

    def _victim(self, lane: dict[Any, None], conn: Any) -> Any:
        """Which connection of a full lane goes. The newest idle one (or one whose peer stopped reading our
        answer), of the client address holding most, but not one that has just connected and not yet sent
        its first request (FIRST_REQUEST_GRACE): the oldest are nearest their deadline anyway, and a
        connection that has already been served (a scraper's keep-alive) has shown it is a client; a flood
        is recent. An idle connection costs its client nothing to lose: it connects again. Else the
        one that has been receiving its request longest, if for over SLOW_READ (a stalled body or head).
        Else the one whose request has waited longest for its answer, if for over SLOW_ANSWER (queued
        behind others; with pipelining, from the first request of an unbroken run). Else the newest of the
        address holding most, if it holds more than the newcomer's. Else the one answered fastest over its
        life, at LOOP_RATE requests a second or more. Else the newest idle one that has just connected.
        Else the newcomer.

        Found by review: 80 loops of quickly refused requests from one address left no connection idle or
        slow at the instant a probe arrived, so the probe was turned away, or, admitted while it had not yet
        sent its request (idle), pushed out by the next of the loops reconnecting. A rule that no address
        may displace a lighter one failed where the ranks report over loopback: the probes' address was
        the heaviest, and could displace none of 64 loops from 64 other addresses."""
        others = [c for c in lane if c is not conn and not c.closing()]
        held = Counter(_host(c) for c in (*others, conn))  # per address, the newcomer's included
        floor = held[_host(conn)]
        order = {c: i for i, c in enumerate(others)}
        now = self.clock()
        idle = [c for c in others if c.sheddable()]
        settled = [c for c in idle if not _arriving(c, now)]
        if settled:
            return max(settled, key=lambda c: (held[_host(c)], order[c]))
        for since, limit in (("reading_since", SLOW_READ), ("answering_since", SLOW_ANSWER)):
            waited = [(t, c) for c in others if (t := getattr(c, since)()) is not None and now - t >= limit]
            if waited:
                return min(waited, key=lambda x: x[0])[1]
        heavy = [c for c in others if held[_host(c)] > floor]
        if heavy:
            return max(heavy, key=lambda c: (held[_host(c)], order[c]))
        rates = [(rate(now), c) for c in others if (rate := getattr(c, "answer_rate", None)) is not None]
        loops = [(r, c) for r, c in rates if r >= LOOP_RATE]
        if loops:
            return max(loops, key=lambda x: x[0])[1]
        # a flood of connections that never send: each is young, and the newest goes
        return max(idle, key=lambda c: (held[_host(c)], order[c])) if idle else conn

    def release(self, conn: Any) -> None:
        for lane in self._open.values():
            lane.pop(conn, None)

    def dropped(self, conn: Any, reason: str) -> None:
        """``conn`` is being closed by force: released now, not when asyncio reports the loss (its fd is
        freed on the next turn of the loop), and counted."""
        self.release(conn)
        self.closed[reason] += 1

    def describe(self) -> list[Metric]:
        """Its families by name, so that ``/metrics?name[]=`` can select them."""
        return [_family(m) for m in M.SERVING]

    def collect(self) -> Iterator[Metric]:
        f = {m.name: _family(m) for m in M.SERVING}
        f[M.HTTP_CONNECTIONS.name].add_metric([], self.open)
        f[M.HTTP_CONNECTIONS_LIMIT.name].add_metric(
            [], self.limits.max_connections + self.limits.max_unix_connections
        )
        for reason in REASONS:
            f[M.HTTP_CONNECTIONS_CLOSED.name].add_metric([reason], self.closed[reason])
        for reason in REFUSALS:
            f[M.HTTP_REQUESTS_REFUSED.name].add_metric([reason], self.refused[reason])
        yield from f.values()


class Sparse(logging.Filter):
    """Lets through one record per ``interval`` of each message in ``messages`` (uvicorn's per-request
    warnings: one client sending garbage wrote 4,000 lines a second), saying how many it held back."""

    def __init__(self, messages: frozenset[str], interval: float = 60.0) -> None:
        super().__init__()
        self.messages = messages
        self.interval = interval
        self._last: dict[str, float] = {}
        self._held: Counter[str] = Counter()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if not isinstance(msg, str) or msg not in self.messages:
            return True
        now = time.monotonic()
        if now - self._last.get(msg, float("-inf")) < self.interval:
            self._held[msg] += 1
            return False
        self._last[msg] = now
        held = self._held.pop(msg, 0)
        if held:
            record.msg = f"{msg} ({held} more like it not logged in the last {self.interval:g} s)"
        return True


# uvicorn's warnings per bad request; gpumon_http_requests_refused_total{reason="bad_request"} counts them all
_SPARSE = Sparse(frozenset({"Invalid HTTP request received.", "Unsupported upgrade request."}))


def guarded(protocol_class: type[asyncio.Protocol], gate: Gate) -> type[asyncio.Protocol]:
    """``protocol_class`` (uvicorn's httptools or h11 protocol) with the gate's deadlines and cap."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if _SPARSE not in uvicorn_log.filters:
        uvicorn_log.addFilter(_SPARSE)

    class Guarded(protocol_class):  # type: ignore[valid-type,misc]
        _deadline: asyncio.TimerHandle | None = None  # for the request's head
        _request_deadline: asyncio.TimerHandle | None = None  # for the whole request, from its first byte
        _write_deadline: asyncio.TimerHandle | None = None  # armed while the peer does not read
        _current: Any = None  # the request whose headers were last completed (uvicorn's cycle)
        _running: Any = None  # the request being answered (httptools: pipelining puts it behind cycle)
        _head = 0  # bytes received towards the current request's head
        _dropped = False
        _began = 0.0  # gate clock: when the request being received began to arrive
        _asked: float | None = None  # gate clock: when the request being answered had arrived
        answered = 0  # responses completed
        opened: float | None = None  # gate clock: when the connection was made
        unix = False  # on the unix ingest socket (its own lane)
        app: Any  # uvicorn's: the ASGI app this connection's requests go to

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._loop = asyncio.get_running_loop()
            sock = transport.get_extra_info("socket")
            self.unix = sock is not None and sock.family == AF_UNIX
            # its requests carry whether it has closed, and over the unix socket who connected (peer.py)
            self.app = Tagged(self.app, self.closing, None if sock is None else peer_of(sock))
            self._arm(gate.limits.header_timeout, "header_timeout")
            self.opened = gate.clock()
            gate.admit(self)

        def connection_lost(self, exc: Exception | None) -> None:
            gate.release(self)
            self._deadline = _cancel(self._deadline)
            self._request_deadline = _cancel(self._request_deadline)
            self._write_deadline = _cancel(self._write_deadline)
            # uvicorn marks only the last parsed request as disconnected; one still being answered behind
            # pipelined ones would then write to a closed transport and log a traceback
            for cycle in (self._running, *(c for c, _ in getattr(self, "pipeline", ()))):
                if cycle is not None and not cycle.response_complete:
                    cycle.disconnected = True
                    cycle.message_event.set()
            super().connection_lost(exc)
            # requests queued behind an unanswered one never run now; each holds this protocol (its
            # on_response), a reference cycle per request left to the interpreter's rare full collections
            # (200 pipelined requests: 1,400 objects)
            if pipeline := getattr(self, "pipeline", None):
                pipeline.clear()
            self._current = self._running = None

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:  # httptools only
            self._running = cycle
            super()._start_asgi_task(cycle, app)

        def data_received(self, data: bytes) -> None:
            # every byte that is not the body of the request being read belongs to a head: between requests,
            # or pipelined behind one being answered (uvicorn reads on while it answers; such bytes went
            # uncounted, and an endless request line grew its URL by 64 MiB). Not the rest of a body still
            # arriving after its answer, as after a 413.
            heading = not self._reading()
            if heading:
                if self._request_deadline is None and self.idle():
                    # the first byte of a request: from here it has request_timeout in all
                    self._request_deadline = self._loop.call_later(
                        gate.limits.request_timeout, self.drop, "request_timeout"
                    )
                    self._began = gate.clock()
                self._head += len(data)
            super().data_received(data)
            if len(getattr(self, "pipeline", ())) > MAX_PIPELINED:  # httptools queues them; h11 stops reading
                self.drop("pipeline")
                return
            cycle = self.cycle
            if cycle is not None and cycle is not self._current:
                self._current = cycle  # headers complete: a new request is in
                self._head = 0
                self._deadline = _cancel(self._deadline)
            elif heading and self._head > MAX_HEAD_BYTES and not self.closing():
                self._refuse_head()  # still no end of the head
                return
            if cycle is not None and cycle is self._current and not cycle.more_body:
                # the whole request arrived; the response is ours to make
                self._request_deadline = _cancel(self._request_deadline)
                if self._asked is None:
                    self._asked = gate.clock()
                if self._deadline is None and self.idle() and not self.closing():
                    self._arm(gate.limits.header_timeout, "header_timeout")  # answered before its body ended

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.answered += 1
            if self.idle():  # with pipelined requests still to answer, the run goes on: its clock too
                self._asked = None
            if not self.transport.is_closing() and self.idle() and not self._reading():
                self._arm(gate.limits.header_timeout, "header_timeout")

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_deadline is None:  # the peer stopped reading: it has request_timeout to resume
                self._write_deadline = self._loop.call_later(
                    gate.limits.request_timeout, self.drop, "write_timeout"
                )

        def resume_writing(self) -> None:
            super().resume_writing()
            self._write_deadline = _cancel(self._write_deadline)

        def send_400_response(self, msg: str) -> None:
            # uvicorn's answer to bytes that are not HTTP; it logs a warning for each (log.py limits them)
            gate.refused["bad_request"] += 1
            super().send_400_response(msg)

        def _unsupported_upgrade_warning(self) -> None:
            # uvicorn warns (twice) for every request asking for an upgrade, before any credentials are
            # checked: a flood of them would flood the log. gpumon upgrades nothing; the request is answered.
            log.debug("ignoring an upgrade request from %s", self.client)

        def reading_since(self) -> float | None:
            """When the request it is still receiving (head or body) began to arrive; None when it is
            not receiving one."""
            return self._began if self._request_deadline is not None else None

        def answering_since(self) -> float | None:
            """When the connection last began to be answered after being idle (the first request of a run
            of pipelined ones) had fully arrived; None when none is being answered."""
            return None if self.idle() else self._asked

        def answer_rate(self, now: float) -> float:
            """Requests answered per second of the connection's life (its first second counted whole)."""
            return self.answered / max(1.0, now - (self.opened or now))

        def idle(self) -> bool:
            """Waiting for a request: none yet, or the last one answered (uvicorn's own test at shutdown)."""
            return self.cycle is None or bool(self.cycle.response_complete)

        def sheddable(self) -> bool:
            """Idle, or stalled on a peer that does not read what it asked for."""
            return self.idle() or self._write_deadline is not None

        def _refuse_head(self) -> None:
            self._dropped = True
            gate.dropped(self, "header_too_large")
            if self.idle():
                self.transport.write(_TOO_LARGE)
                self.transport.close()
            else:  # an answer is being written: a 431 would land in the middle of it
                self.transport.abort()

        def closing(self) -> bool:
            return self._dropped or self.transport is None or self.transport.is_closing()

        def drop(self, reason: str) -> None:
            if self.closing():
                return
            if reason in ("header_timeout", "request_timeout") and not self.idle() and not self._reading():
                return  # the request arrived and is being answered: the deadline was for reading it
            self._dropped = True
            gate.dropped(self, reason)
            log.debug("closing connection from %s: %s", self.client, reason)
            self.transport.abort()  # at once, the fd with it: an idle peer has nothing to flush to

        def _reading(self) -> bool:
            cycle = self.cycle
            return cycle is not None and cycle is self._current and bool(cycle.more_body)

        def _arm(self, seconds: float, reason: str) -> None:
            _cancel(self._deadline)
            self._deadline = self._loop.call_later(seconds, self.drop, reason)

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{protocol_class.__name__}"
    return Guarded
