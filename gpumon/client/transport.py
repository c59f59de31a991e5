"""Getting reports to the node's gpumon daemon: one keep-alive HTTP connection (TCP or unix socket), the
policy around it (sequence numbers, backoff, one log line per outage) and the thread that drives it.

Standard library only, Python >= 3.9: this module runs inside training processes.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import random
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from gpumon.client.protocol import PATH

log = logging.getLogger("gpumon.client")

# the daemon's answers are a few bytes; more than this is not a gpumon daemon
MAX_RESPONSE_BYTES = 64 * 1024
# a daemon's detail is a sentence (the longest, a 409's, names two pids and what to change); the rest is cut
MAX_DETAIL = 300
MAX_BACKOFF = 30.0
# distinct 4xx answers logged per Reporter: one per (status, detail), then silence
MAX_REJECTION_LOGS = 8


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix stream socket; the Host header stays "localhost"."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
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
        self._conn: http.client.HTTPConnection | None = None
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

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self._socket_path is not None:
            return UnixHTTPConnection(self._socket_path, timeout)
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def post(self, body: bytes, timeout: float | None = None) -> tuple[int, str]:
        """(HTTP status, the daemon's detail or the transport error); status 0 when no answer came."""
        limit = self.timeout if timeout is None else max(0.001, min(timeout, self.timeout))
        for attempt in (0, 1):
            conn = self._conn
            reused = conn is not None
            if conn is None:
                conn = self._conn = self._connect(limit)
            else:
                conn.timeout = limit
                if conn.sock is not None:
                    conn.sock.settimeout(limit)
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
        # never the global random: training scripts seed it and expect their own sequence
        self._random = random.Random()

    def send(self, report: dict[str, Any], timeout: float | None = None) -> bool:
        """Send ``report`` (its "seq" is filled in here); True when the daemon has this data."""
        self.seq += 1
        report["seq"] = self.seq
        try:
            body = json.dumps(report, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            log.warning("gpumon: could not encode a report (%s); this one is skipped", exc)
            return False
        status, detail = self.transport.post(body, timeout)
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
