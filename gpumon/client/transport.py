"""Getting reports to the node's gpumon daemon: one keep-alive HTTP connection (TCP or unix socket), the
policy around it (sequence numbers, backoff, one log line per outage) and the thread that drives it.

Standard library only: this module runs inside training processes.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import math
import os
import random
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from gpumon.client.protocol import EXTENSIONS, PATH
from gpumon.client.report import core

log = logging.getLogger("gpumon.client")

# the daemon's answers are a few bytes; more than this is not a gpumon daemon
MAX_RESPONSE_BYTES = 64 * 1024
# a daemon's detail is a sentence (the longest, a 409's, names two pids and what to change); the rest is cut
MAX_DETAIL = 300
MAX_BACKOFF = 30.0
# distinct 4xx answers logged per Reporter: one per (status, detail), then silence
MAX_REJECTION_LOGS = 8


def _remaining(deadline: float) -> float | None:
    """Seconds left until ``deadline``; None without one (the socket's own timeout applies)."""
    if deadline == math.inf:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out: no answer within the report's deadline")
    return left


class _Deadline:
    """A socket whose every send and receive waits at most until ``deadline`` (time.monotonic()). A plain
    socket timeout bounds each call alone, so a daemon that trickles its reply a byte a second would hold a
    report for good; this bounds the report: connect, send and read together."""

    deadline = math.inf

    def _arm(self) -> None:
        left = _remaining(self.deadline)
        if left is not None:
            self.settimeout(left)  # type: ignore[attr-defined]

    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        self._arm()
        return super().recv_into(*args, **kwargs)  # type: ignore[misc]

    def recv(self, *args: Any, **kwargs: Any) -> bytes:
        self._arm()
        return super().recv(*args, **kwargs)  # type: ignore[misc]

    def send(self, *args: Any, **kwargs: Any) -> int:
        self._arm()
        return super().send(*args, **kwargs)  # type: ignore[misc]

    def sendall(self, *args: Any, **kwargs: Any) -> None:
        self._arm()  # since Python 3.5 a sendall's timeout is its whole duration
        return super().sendall(*args, **kwargs)  # type: ignore[misc]


class _DeadlineSocket(_Deadline, socket.socket):
    pass


def _adopt(sock: socket.socket, deadline: float) -> _DeadlineSocket:
    """``sock``'s connection as a _DeadlineSocket (the same file descriptor)."""
    timeout = sock.gettimeout()
    adopted = _DeadlineSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    adopted.settimeout(timeout)
    adopted.deadline = deadline
    return adopted


class DeadlineConnection(http.client.HTTPConnection):
    """An HTTP connection whose socket keeps the deadline of the report in flight (``deadline``)."""

    deadline = math.inf

    def _left(self) -> float | None:
        left = _remaining(self.deadline)
        return self.timeout if left is None else left  # type: ignore[no-any-return]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = self._connect_by_deadline  # an instance attribute in http.client

    def _connect_by_deadline(self, address: Any, timeout: Any = None, source: Any = None) -> socket.socket:
        # connecting takes its share of the deadline, and a TLS handshake after it only what is left
        sock = socket.create_connection(address, self._left(), source)
        return _adopt(sock, self.deadline)

    def set_deadline(self, deadline: float) -> None:
        self.deadline = deadline
        if isinstance(self.sock, _Deadline):
            self.sock.deadline = deadline


class HTTPSDeadlineConnection(DeadlineConnection, http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        if isinstance(self.sock, _Deadline):  # the TLS socket made by the context's sslsocket_class
            self.sock.deadline = self.deadline


def tls_context() -> Any:
    import ssl  # here: a training process that reports over http or unix never loads it

    class DeadlineSSLSocket(_Deadline, ssl.SSLSocket):
        pass

    context = ssl.create_default_context()  # what HTTPSConnection would use: verify, system CAs
    context.sslsocket_class = DeadlineSSLSocket
    return context


class UnixHTTPConnection(DeadlineConnection):
    """HTTP over a unix stream socket; the Host header stays "localhost"."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = _DeadlineSocket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self._left())
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        sock.deadline = self.deadline
        self.sock = sock


class Transport:
    """POSTs report bodies to ``url``: "http://host:port[/prefix]", "https://…" or "unix:///path/to.sock".

    One connection is kept alive and reused; any error drops it and the next post reconnects. A post that
    fails on a reused connection (the daemon restarted and closed it) is retried once on a fresh one: the
    report's seq makes a duplicate harmless.
    """

    def __init__(self, url: str, token: str | None = None, timeout: float = 2.0) -> None:
        parts = urlsplit(url)
        self.url = url
        self.timeout = timeout
        self._conn: DeadlineConnection | None = None
        self._tls: Any = None  # the TLS context, made at the first https connection
        if parts.scheme == "unix":
            # "unix:///run/gpumon.sock": the socket path is everything after the scheme's "//"
            path = parts.netloc + parts.path
            if not path:
                raise ValueError(f"no socket path in {url!r}")
            self._socket_path: str | None = path
            self._path = PATH
        elif parts.scheme in ("http", "https"):
            if not parts.hostname:
                raise ValueError(f"no host in {url!r}")
            port = parts.port  # raises ValueError for a malformed port
            self._socket_path = None
            self._host = parts.hostname
            self._port = port
            self._https = parts.scheme == "https"
            self._path = parts.path.rstrip("/") + PATH
        else:
            raise ValueError(f"unsupported URL scheme in {url!r} (http, https or unix)")
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def _connect(self, timeout: float) -> DeadlineConnection:
        if self._socket_path is not None:
            return UnixHTTPConnection(self._socket_path, timeout)
        if self._https:
            if self._tls is None:
                self._tls = tls_context()
            return HTTPSDeadlineConnection(self._host, self._port, timeout=timeout, context=self._tls)
        return DeadlineConnection(self._host, self._port, timeout=timeout)

    def post(self, body: bytes, timeout: float | None = None) -> tuple[int, str]:
        """(HTTP status, the daemon's detail or the transport error); status 0 when no answer came. The whole
        post, a retry on a fresh connection included, ends within ``timeout`` (at most the transport's)."""
        limit = self.timeout if timeout is None else max(0.001, min(timeout, self.timeout))
        deadline = time.monotonic() + limit
        for attempt in (0, 1):
            conn = self._conn
            reused = conn is not None
            if conn is None:
                conn = self._conn = self._connect(limit)
            conn.timeout = limit
            conn.set_deadline(deadline)
            try:
                conn.request("POST", self._path, body, self._headers)
                response = conn.getresponse()
                data = response.read(MAX_RESPONSE_BYTES)
                status = response.status
                if response.will_close or not response.isclosed():
                    self.close()
                return status, _detail(data)
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                # a reused connection the daemon closed fails at once; a timeout means a slow daemon
                if reused and attempt == 0 and not isinstance(exc, socket.timeout):
                    continue
                # printable: http.client quotes a garbage status line whole (up to 64 KiB) in its exception
                return 0, printable(f"{type(exc).__name__}: {exc}".rstrip(": "))
        return 0, "unreachable"  # pragma: no cover - the loop always returns

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()

    def abandon(self) -> None:
        """In a forked child: close this process's copy of the connection's socket and nothing else. No
        shutdown() and no TLS close_notify, so the parent's connection is untouched; nor conn.close(), which
        could wait forever on a buffered-reader lock the parent's sender thread held at fork time."""
        conn, self._conn = self._conn, None
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                os.close(sock.detach())  # detached: the socket object will not close the fd number again


CORE_RETRY = 600.0  # seconds between tries of the optional fields with a daemon that refused them


def _refuses_extension(detail: str) -> bool:
    """The answer of a daemon that does not know an optional field: 'unknown field 'memory' (...)'."""
    return any(detail.startswith(f"unknown field {name!r}") for name in EXTENSIONS)


def _detail(data: bytes) -> str:
    try:
        parsed = json.loads(data.decode("utf-8", "replace")) if data else None
    except ValueError:
        return printable(data[:MAX_DETAIL].decode("utf-8", "replace"))
    detail = parsed.get("detail", parsed) if isinstance(parsed, dict) else parsed
    text = detail if isinstance(detail, str) else json.dumps(detail)
    return printable(text) if detail is not None else ""


def printable(text: str) -> str:
    """At most MAX_DETAIL characters, each printable: what a reply puts in the training log cannot flood it
    or send the terminal escape sequences."""
    cut = text[:MAX_DETAIL]
    return "".join(c if c.isprintable() else "?" for c in cut) + ("..." if len(text) > MAX_DETAIL else "")


class Sender:
    """Sends reports through a Transport and decides when to send the next one.

    Every report is sent, changed or not, with the next ``seq``: it is the rank's heartbeat, which keeps a
    rank that is alive but not stepping (a long evaluation, a hung collective) on the daemon's books, where
    it shows as idle or stalled rather than expiring. Failures to reach the daemon (refused, timeout, 5xx)
    back off exponentially from the interval to 30 s with jitter and log one warning per outage; a 4xx is
    logged once per distinct answer and retried at the normal interval.
    """

    def __init__(self, transport: Transport, interval: float) -> None:
        self.transport = transport
        self.interval = interval
        self.seq = -1
        self._backoff = 0.0
        self._outage = False
        self._rejections: set[tuple[int, str]] = set()
        # a daemon older than the optional fields refuses them as unknown: then they are left out, and tried
        # again every CORE_RETRY seconds in case the daemon was upgraded
        self.core_only = False
        self._core_since = 0.0
        # never the global random: training scripts seed it and expect their own sequence
        self._random = random.Random()

    def send(self, report: dict[str, Any], timeout: float | None = None) -> bool:
        """Send ``report`` (its "seq" is filled in here); True when the daemon has this data."""
        self.seq += 1
        report["seq"] = self.seq
        if self.core_only and time.monotonic() - self._core_since >= CORE_RETRY:
            self.core_only = False
        full = report
        if self.core_only:
            report = core(report)
        try:
            body = json.dumps(report, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            log.warning("gpumon: could not encode a report (%s); this one is skipped", exc)
            return False
        started = time.monotonic()
        status, detail = self.transport.post(body, timeout)
        # every released daemon answers an unknown field with 422 (400 for a body that is not JSON)
        if status in (400, 422) and not self.core_only and _refuses_extension(detail):
            if not self._core_since:
                log.info(
                    "gpumon: daemon at %s predates the goodput and allocator fields (%s); sending reports "
                    "without them", self.transport.url, detail,
                )  # fmt: skip
            self.core_only, self._core_since = True, time.monotonic()
            left = None if timeout is None else timeout - (time.monotonic() - started)
            if left is not None and left <= 0.0:
                return False  # no time left to resend: the next report carries the same totals
            return self.send(full, left)
        if 200 <= status < 300:
            if self._outage or self._rejections:
                log.info("gpumon: daemon at %s accepts reports again", self.transport.url)
            self._outage = False
            self._rejections.clear()
            self._backoff = 0.0
            return True
        if status == 0 or status >= 500:
            if not self._outage:
                log.warning(
                    "gpumon: daemon at %s is not taking reports (%s); counting continues and the totals will "
                    "be sent when it is back (GPUMON_REPORT=0 turns reporting off)",
                    self.transport.url,
                    detail or f"HTTP {status}",
                )
            self._outage = True
            self._backoff = min(MAX_BACKOFF, max(self.interval, self._backoff) * 2)
            return False
        # one line per kind of refusal: the detail names the field first ("totals.tokens: ..."), and the
        # value after it changes with every report
        key = (status, detail.split(":", 1)[0])
        if key not in self._rejections and len(self._rejections) < MAX_REJECTION_LOGS:
            log.warning(
                "gpumon: daemon at %s rejected a report: HTTP %d %s", self.transport.url, status, detail
            )
            self._rejections.add(key)
        self._backoff = 0.0
        return False

    def next_delay(self) -> float:
        """Seconds until the next report: the interval, or the current backoff with +-20 % jitter."""
        if self._backoff <= 0.0:
            return self.interval
        return self._backoff * self._random.uniform(0.8, 1.2)

    def close(self) -> None:
        self.transport.close()


class Shipper:
    """The background half of a Reporter: a daemon thread sending a report every interval (later while the
    daemon is away), and flush() and close() from the caller's thread, one report in flight at a time.

    The Reporter's report builder is held through a WeakMethod: the thread never keeps a Reporter alive, and
    collecting one stops its thread.
    """

    def __init__(self, sender: Sender, build: Callable[[bool], dict[str, Any]]) -> None:
        self.sender = sender
        stop = self._stop = threading.Event()
        self._build = weakref.WeakMethod(build, lambda _ref: stop.set())
        self._lock = threading.Lock()
        self._closed = False
        self._logged_error = False
        self._last: dict[str, Any] | None = None  # the final report of a Reporter collected without close()
        self.thread = threading.Thread(target=self._run, name="gpumon-reporter", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _ship(self, final: bool, timeout: float | None) -> bool:
        build = self._build()
        if build is None:
            return False
        report = build(final)
        del build
        return self.sender.send(report, timeout=timeout)

    def _error(self, where: str) -> None:
        if not self._logged_error:
            self._logged_error = True
            log.warning("gpumon: internal error in %s; reporting carries on", where, exc_info=True)

    def _run(self) -> None:
        delay = 0.0
        while not self._stop.wait(delay):
            with self._lock:
                if self._closed or self._build() is None:
                    break
                try:
                    self._ship(False, None)
                    delay = self.sender.next_delay()
                except Exception:
                    self._error("the reporter thread")
                    delay = MAX_BACKOFF
        self._finish()

    def orphan(self, report: dict[str, Any]) -> None:
        """The Reporter was collected without close(): the thread sends ``report``, its final one, then ends.
        Takes no lock and does no I/O: the collection may happen on any thread, this one included."""
        self._last = report
        self._stop.set()

    def _finish(self) -> None:
        """The thread's way out: an orphaned Reporter's final report, then the connection closed. close() may
        have stopped waiting for a report in flight, whose answer then left the connection kept alive; when it
        did not, its final report opens a fresh connection, one connect per Reporter."""
        report, self._last = self._last, None
        with self._lock:
            try:
                if report is not None and not self._closed:
                    self._closed = True
                    self.sender.send(report)
            except Exception:
                self._error("the final report")
            finally:
                self.sender.close()

    def join(self, timeout: float) -> None:
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(max(0.0, timeout))

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return False
        try:
            return not self._closed and self._ship(False, deadline - time.monotonic())
        except Exception:
            self._error("flush()")
            return False
        finally:
            self._lock.release()

    def close(self, timeout: float) -> None:
        """Stop the thread and send the final report, all within ``timeout`` seconds: an in-flight report to
        a slow daemon may use the whole budget, and then the final one is skipped rather than waited for."""
        deadline = time.monotonic() + max(0.0, timeout)
        self._closed = True
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(max(0.0, deadline - time.monotonic()))
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return
        try:
            self._ship(True, deadline - time.monotonic())
        except Exception:
            self._error("close()")
        finally:
            self.sender.close()
            self._lock.release()
