"""Work that is abandoned stops, and work that piles up is bounded (issue 30 item 2): a request whose
client left is not rendered, selected or password-checked; name[] selections are bounded and cached; the
password queue refuses at once when full; uvicorn's per-request warnings are rate-limited and counted."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import socket
import threading
import time
from pathlib import Path

import bcrypt
import httpx
import pytest
import yaml
from support.helpers import ManualClock, start_daemon

from gpumon.web import guard as guard_module
from gpumon.web import webconfig
from gpumon.web.connections import Sparse
from gpumon.web.guard import (
    BCRYPT_CONCURRENCY,
    BCRYPT_WAITING,
    BCRYPT_WAITING_PER_CLIENT,
    Guard,
    PasswordsBusy,
)
from gpumon.web.peer import Abandoned

PASSWORD = "correct horse battery staple"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


def header(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def _guard(tmp_path: Path, hashed: str = HASH) -> Guard:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prom": hashed}}))
    return Guard(webconfig.load(str(path)), None, ManualClock())


def test_the_password_queue_refuses_at_once_when_full_and_skips_the_departed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = _guard(tmp_path)
    checks = []
    release = threading.Event()

    def slow_check(password: bytes, hashed: bytes) -> bool:
        checks.append(password)
        release.wait(10)
        return bcrypt.checkpw(password, hashed)

    monkeypatch.setattr(guard_module, "_check", slow_check)

    async def scenario() -> None:
        wrong = [asyncio.create_task(guard.authorized(header("prom", f"wrong{i}"))) for i in range(100)]
        await asyncio.sleep(0.1)
        refused = [t for t in wrong if t.done() and isinstance(t.exception(), PasswordsBusy)]
        assert len(refused) == 100 - BCRYPT_WAITING - BCRYPT_CONCURRENCY, "past the queue: refused at once"
        assert len(checks) == BCRYPT_CONCURRENCY
        release.set()
        results = await asyncio.gather(*wrong, return_exceptions=True)
        assert results.count(False) == BCRYPT_WAITING + BCRYPT_CONCURRENCY
        # a client that left while it waited is not checked
        release.clear()
        blocker = [asyncio.create_task(guard.authorized(header("prom", f"b{i}"))) for i in range(2)]
        await asyncio.sleep(0.05)
        departed = asyncio.create_task(guard.authorized(header("prom", PASSWORD), lambda: True))
        await asyncio.sleep(0.05)
        release.set()
        with pytest.raises(Abandoned):
            await departed
        await asyncio.gather(*blocker)
        assert header("prom", PASSWORD)[6:] not in checks and PASSWORD.encode() not in checks
        assert await guard.authorized(header("prom", PASSWORD))

    asyncio.run(scenario())


def test_one_address_cannot_fill_the_password_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: one address's flood of wrong passwords kept the queue full, and another user's valid
    first login was told 503 on every try (9 of 9 over 8 s). One address may have BCRYPT_WAITING_PER_CLIENT
    checks waiting or running; a login from elsewhere still gets a place."""
    guard = _guard(tmp_path)
    release = threading.Event()

    def slow_check(password: bytes, hashed: bytes) -> bool:
        release.wait(10)
        return bcrypt.checkpw(password, hashed)

    monkeypatch.setattr(guard_module, "_check", slow_check)

    async def scenario() -> None:
        flood = [
            asyncio.create_task(guard.authorized(header("prom", f"wrong{i}"), client="10.0.0.9"))
            for i in range(100)
        ]
        await asyncio.sleep(0.1)
        refused = [t for t in flood if t.done() and isinstance(t.exception(), PasswordsBusy)]
        assert len(refused) == 100 - BCRYPT_WAITING_PER_CLIENT
        login = asyncio.create_task(guard.authorized(header("prom", PASSWORD), client="10.0.0.1"))
        await asyncio.sleep(0.05)
        assert not login.done(), "queued, not refused"
        release.set()
        assert await login
        await asyncio.gather(*flood, return_exceptions=True)
        assert not guard._waiting_from, "nothing left counted"

    asyncio.run(scenario())


def test_logins_survive_a_reload_that_keeps_their_hash(tmp_path: Path) -> None:
    """Found by review: any change to the web config forgot every checked login, so during a flood of wrong
    passwords a reload would have sent every scraper back to the password queue."""
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prom": HASH}}))
    clock = ManualClock()
    guard = Guard(webconfig.load(str(path)), None, clock)
    assert asyncio.run(guard.authorized(header("prom", PASSWORD)))
    other = bcrypt.hashpw(b"x", bcrypt.gensalt(4)).decode()
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prom": HASH, "grafana": other}}))
    for _ in range(2):  # a change is taken once it has held still for one more look
        clock.advance(5)
        guard.maybe_reload()
    assert "grafana" in guard.config.users, "reloaded"
    assert len(guard._logins) == 1, "prom's hash is unchanged: its login stands"
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prom": other}}))
    for _ in range(2):
        clock.advance(5)
        guard.maybe_reload()
    assert not guard._logins, "a changed hash forgets the login"


def test_repeated_warnings_are_logged_once_a_minute_with_the_count(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("gpumon.test.sparse")
    sparse = Sparse(frozenset({"Invalid HTTP request received."}), interval=0.2)
    log.addFilter(sparse)
    try:
        with caplog.at_level(logging.WARNING, logger="gpumon.test.sparse"):
            for _ in range(1000):
                log.warning("Invalid HTTP request received.")
            log.warning("something else")
            time.sleep(0.25)
            log.warning("Invalid HTTP request received.")
    finally:
        log.removeFilter(sparse)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "Invalid HTTP request received.",
        "something else",
        "Invalid HTTP request received. (999 more like it not logged in the last 0.2 s)",
    ]


def _refused(d, reason: str) -> float:
    m = re.search(rf'gpumon_http_requests_refused_total{{reason="{reason}"}} (\S+)', d.get("/metrics").text)
    assert m, f"no refused counter for {reason}"
    return float(m.group(1))


def _send_and_close(port: int, requests: list[bytes]) -> None:
    """Each request on a connection of its own, closed as soon as it is sent: a burst whose answers nobody
    waits for."""
    for raw in requests:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(raw)


@pytest.mark.slow
def test_garbage_requests_are_counted_and_logged_sparsely() -> None:
    d = start_daemon("--simulate", "1xH100-SXM")
    try:
        port = int(d.url.rsplit(":", 1)[1])
        _send_and_close(port, [b"\x16\x03\x01 not http at all\r\n\r\n"] * 300)
        time.sleep(0.5)
        assert _refused(d, "bad_request") == 300
        assert sum("Invalid HTTP request" in line for line in d.log) <= 1, "one line for 300 bad requests"
    finally:
        d.stop()


@pytest.mark.slow
def test_a_burst_of_selections_sent_and_closed_leaves_plain_scrapes_alone() -> None:
    """The break: a burst of /metrics?name[]=... requests (3,000 names each), sent and closed at once, held
    plain /metrics for 50 s. Now more than MAX_NAMES names is a 400 at once, and selections whose client
    left are not made."""
    d = start_daemon("--simulate", "8xH100-SXM")
    try:
        port = int(d.url.rsplit(":", 1)[1])
        names = "&".join(f"name[]=gpumon_{i}" for i in range(3000))
        big = f"GET /metrics?{names} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        assert len(big) < 64 * 1024
        r = d.get(f"/metrics?{names}")
        assert r.status_code == 400 and "at most 256 series names" in r.text
        one = "name[]=gpumon_gpu_temperature_celsius"
        few = [f"GET /metrics?{one}&name[]=x{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(200)]
        threads = [threading.Thread(target=_send_and_close, args=(port, [big] * 100)) for _ in range(2)]
        threads.append(threading.Thread(target=_send_and_close, args=(port, few)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        start = time.monotonic()
        r = httpx.get(d.url + "/metrics", timeout=30)
        took = time.monotonic() - start
        # before: 50 s, with RSS at 526-688 MiB afterwards
        assert r.status_code == 200 and took < 5.0, f"plain /metrics took {took:.1f} s after the burst"
        assert _refused(d, "too_many_names") > 0  # (a close that meets our answer resets: not all are read)
    finally:
        d.stop()


@pytest.mark.slow
def test_a_flood_of_wrong_passwords_cannot_hold_a_valid_first_login(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()  # as a real file would have
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {"prom": hashed}}))
    d = start_daemon("--simulate", "1xH100-SXM", "--web-config", str(web), ready=False)
    try:
        d.wait_ready()
        port = int(d.url.rsplit(":", 1)[1])
        wrong = base64.b64encode(b"prom:wrong").decode()
        flood = [f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {wrong}\r\n\r\n".encode()] * 400
        threads = [threading.Thread(target=_send_and_close, args=(port, flood)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        start = time.monotonic()
        r = httpx.get(d.url + "/metrics", auth=("prom", PASSWORD), timeout=60)
        while r.status_code == 503:  # the queue was full as it arrived: told at once, and retried
            time.sleep(0.2)
            r = httpx.get(d.url + "/metrics", auth=("prom", PASSWORD), timeout=60)
        took = time.monotonic() - start
        assert r.status_code == 200 and took < 5.0, f"a valid login waited {took:.1f} s behind the flood"
        text = r.text
        refused = {
            m.group(1): float(m.group(2))
            for m in re.finditer(r'gpumon_http_requests_refused_total{reason="(\w+)"} (\S+)', text)
        }
        assert refused["passwords_busy"] + refused["abandoned"] > 0, refused
    finally:
        d.stop()
