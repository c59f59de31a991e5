"""The SDK's transport against a real recording HTTP server over loopback TCP and a unix socket.

RecordingServer is also used by test_reporter.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.helpers import free_port

from gpumon.client import Reporter
from gpumon.client.protocol import PATH
from gpumon.client.transport import MAX_BACKOFF, Sender, Transport


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class RecordingServer:
    """A stand-in daemon: records every POSTed JSON body and answers as told (204, a status with a
    ``{"detail": ...}`` body, after an optional sleep). HTTP/1.1 keep-alive, like the real daemon."""

    def __init__(self, port: int = 0, unix_path: str | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 204
        self.detail = ""
        self.sleep = 0.0
        # (status, detail) per body, when set: a daemon that answers by content (an older protocol, say)
        self.judge: Callable[[dict[str, Any]], tuple[int, str]] | None = None
        self._cond = threading.Condition()
        self._conns: set[socket.socket] = set()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                recorder._conns.add(self.connection)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, detail, sleep = recorder.status, recorder.detail, recorder.sleep
                if recorder.judge is not None:
                    status, detail = recorder.judge(json.loads(body))
                with recorder._cond:
                    recorder.requests.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": json.loads(body),
                            "status": status,
                            "peer": self.client_address,
                        }
                    )
                    recorder._cond.notify_all()
                if sleep:
                    time.sleep(sleep)
                if status == 204:
                    self.send_response(204)
                    self.end_headers()
                    return
                payload = json.dumps({"detail": detail}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server: socketserver.BaseServer
        if unix_path is not None:
            self.server = _UnixHTTPServer(unix_path, Handler)
            self.url = f"unix://{unix_path}"
        else:
            self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
            self.server.daemon_threads = True
            self.port = int(self.server.server_address[1])
            self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02})
        self._thread.daemon = True
        self._thread.start()

    @property
    def bodies(self) -> list[dict[str, Any]]:
        with self._cond:
            return [r["body"] for r in self.requests]

    def accepted(self) -> list[dict[str, Any]]:
        with self._cond:
            return [r["body"] for r in self.requests if r["status"] == 204]

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0) -> dict[str, Any]:
        """The first recorded body that satisfies ``predicate``, waiting for it up to ``timeout``."""
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                for request in self.requests:
                    if predicate(request["body"]):
                        return request["body"]  # type: ignore[no-any-return]
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching report in {len(self.requests)} received")
                self._cond.wait(left)

    def stop(self) -> None:
        """Stop like a killed daemon: the listener and every open connection go away."""
        self.server.shutdown()
        for conn in list(self._conns):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.server.server_close()
        self._thread.join(5)


@pytest.fixture
def server() -> Iterator[Callable[..., RecordingServer]]:
    started: list[RecordingServer] = []

    def start(port: int = 0, unix_path: str | None = None) -> RecordingServer:
        srv = RecordingServer(port, unix_path)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.sleep = 0.0
        srv.stop()


def test_posts_reuse_one_keepalive_connection(server: Callable[..., RecordingServer]) -> None:
    srv = server()
    transport = Transport(srv.url)
    assert transport.post(b'{"a":1}') == (204, "")
    assert transport.post(b'{"a":2}') == (204, "")
    peers = {tuple(r["peer"]) for r in srv.requests}
    assert len(peers) == 1, "the second post should reuse the first connection"
    assert [r["path"] for r in srv.requests] == [PATH, PATH]
    assert srv.requests[0]["headers"]["Content-Type"] == "application/json"
    assert "Authorization" not in srv.requests[0]["headers"]
    transport.close()


def test_token_is_sent_as_bearer(server: Callable[..., RecordingServer]) -> None:
    srv = server()
    assert Transport(srv.url, token="s3cret").post(b"{}")[0] == 204
    assert srv.requests[0]["headers"]["Authorization"] == "Bearer s3cret"


def test_reporter_token_from_env(
    server: Callable[..., RecordingServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = server()
    monkeypatch.setenv("GPUMON_INGEST_TOKEN", "from-env")
    monkeypatch.setenv("GPUMON_URL", srv.url)
    with Reporter(job="tok") as reporter:
        assert reporter.flush()
    assert {r["headers"]["Authorization"] for r in srv.requests} == {"Bearer from-env"}


def test_url_path_prefix_is_kept(server: Callable[..., RecordingServer]) -> None:
    srv = server()
    Transport(srv.url + "/gpumon/").post(b"{}")
    assert srv.requests[0]["path"] == "/gpumon" + PATH


def test_unix_socket_transport(server: Callable[..., RecordingServer], tmp_path: Path) -> None:
    srv = server(unix_path=str(tmp_path / "gpumon.sock"))
    with Reporter(url=srv.url, job="unix", interval=0.05) as reporter:
        reporter.step(tokens=3)
        reporter.step(tokens=4)
        assert reporter.flush()
    final = srv.wait_for(lambda b: b["final"])
    assert final["totals"]["tokens"] == 7
    assert srv.requests[0]["headers"]["Host"] == "localhost"


def test_unix_socket_missing_is_an_outage_not_an_error(tmp_path: Path) -> None:
    transport = Transport(f"unix://{tmp_path}/absent.sock")
    status, detail = transport.post(b"{}")
    assert status == 0 and "FileNotFoundError" in detail


def test_reconnects_after_server_restart_on_same_port(server: Callable[..., RecordingServer]) -> None:
    srv = server()
    transport = Transport(srv.url)
    assert transport.post(b"{}")[0] == 204
    srv.stop()
    assert transport.post(b"{}")[0] == 0
    srv2 = server(port=srv.port)
    assert transport.post(b'{"again":true}')[0] == 204
    assert srv2.bodies == [{"again": True}]


def test_stale_keepalive_connection_is_retried_once(server: Callable[..., RecordingServer]) -> None:
    """The daemon restarted between two reports: the kept-alive connection is dead, the post still lands."""
    srv = server()
    transport = Transport(srv.url)
    assert transport.post(b"{}")[0] == 204
    srv.stop()
    srv2 = server(port=srv.port)
    assert transport.post(b'{"n":2}')[0] == 204
    assert srv2.bodies == [{"n": 2}]


def test_slow_daemon_times_out(server: Callable[..., RecordingServer]) -> None:
    srv = server()
    srv.sleep = 1.0
    transport = Transport(srv.url, timeout=0.2)
    start = time.monotonic()
    status, detail = transport.post(b"{}")
    assert status == 0 and "timeout" in detail.lower()
    assert time.monotonic() - start < 0.8, "a timeout must not be retried"


def test_error_detail_is_returned(server: Callable[..., RecordingServer]) -> None:
    srv = server()
    srv.status, srv.detail = 429, "too many jobs on this node"
    assert Transport(srv.url).post(b"{}") == (429, "too many jobs on this node")


def test_bad_urls_are_refused() -> None:
    for url in ("ftp://x", "http://", "unix://", "127.0.0.1:9478", "http://host:notaport"):
        with pytest.raises(ValueError):
            Transport(url)


def test_reporter_with_bad_url_is_off_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        reporter = Reporter(url="ftp://nowhere", job="x")
    assert not reporter.enabled
    reporter.step(tokens=1)
    assert "reporting is off" in caplog.text


def test_backoff_doubles_to_the_cap_with_jitter() -> None:
    sender = Sender(Transport(f"http://127.0.0.1:{free_port()}", timeout=0.5), interval=1.0)
    assert sender.next_delay() == 1.0
    bases = []
    for _ in range(8):
        assert sender.send({}) is False
        bases.append(sender._backoff)
        assert 0.8 * sender._backoff <= sender.next_delay() <= 1.2 * sender._backoff
    assert bases[:5] == [2.0, 4.0, 8.0, 16.0, MAX_BACKOFF]
    assert max(bases) == MAX_BACKOFF


def test_every_send_is_a_new_seq_changed_or_not(server: Callable[..., RecordingServer]) -> None:
    """Reports are the rank's heartbeat: unchanged totals are sent again, each with the next seq, so the
    daemon never mistakes one for a duplicate and keeps the rank alive while it does not step."""
    srv = server()
    srv.status = 500
    sender = Sender(Transport(srv.url), interval=1.0)
    report: dict[str, Any] = {}
    assert not sender.send(report)
    srv.status = 204
    assert sender.send(report)
    assert sender.send(report)
    assert [r["body"]["seq"] for r in srv.requests] == [0, 1, 2]


def test_unix_url_names_the_socket_path(tmp_path: Path) -> None:
    """unix:// URLs name the socket by absolute path; the netloc part is not a host."""
    path = str(tmp_path / "d.sock")
    transport = Transport("unix://" + path)
    assert transport._socket_path == path
    assert os.path.isabs(transport._socket_path)


@pytest.mark.parametrize("garbage", ["status line", "body"])
def test_a_garbage_reply_reaches_the_log_short_and_printable(garbage: str) -> None:
    # not a gpumon daemon: 60 KiB of binary with terminal escapes, as a status line (http.client quotes the
    # whole line in its exception) or as the body of a 400
    junk = b"\x1b[2J\x1b]0;pwned\x07" + bytes(range(256)) * 240
    reply = (
        junk + b"\r\n"
        if garbage == "status line"
        else (b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(junk), junk))
    )
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        status, detail = Transport(f"http://127.0.0.1:{listener.getsockname()[1]}").post(b"{}")
    finally:
        thread.join(10)
        listener.close()
    assert status == (0 if garbage == "status line" else 400)
    assert len(detail) <= 303 and detail.isprintable() and "\x1b" not in detail, detail


@pytest.mark.parametrize("scheme", ["http", "unix", "https"])
def test_a_daemon_that_trickles_its_reply_cannot_hold_a_report_past_its_deadline(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One byte every 0.2 s: each read is well within the socket timeout, so before, a report never ended (the
    timeout bounded each read, not the report). Now connect, send and read share one deadline."""
    from support import certs
    from support.trickle import trickling

    reply = b"HTTP/1.1 204 No Content\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    tls = None
    if scheme == "https":
        import ssl

        made = certs.make(tmp_path)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(made.server_cert, made.server_key)
        monkeypatch.setenv("SSL_CERT_FILE", str(made.ca))  # the SDK trusts the system's CAs, and this one
    with trickling(scheme, tmp_path, reply, every=0.2, tls=tls) as url:
        start = time.monotonic()
        status, detail = Transport(url, timeout=1.0).post(b"{}")
        took = time.monotonic() - start
    assert status == 0 and "timed out" in detail, detail
    assert took < 1.5, f"the report took {took:.2f} s against a 1 s deadline"
