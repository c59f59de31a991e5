"""The ASGI middleware in front of the app: basic auth, the configured response headers, a rate limit, and
picking up a changed web config or a renewed certificate while serving.

What it guards: every request over TCP, except the probes (/healthz, /readyz: Kubernetes and Docker probe
without credentials, and they reveal nothing) and SDK reports (POST /v1/report has its own policy: this
node only, optional bearer token). Requests over the unix ingest socket (marked by listen.MarkUnixSocket,
never inferred from a missing peer address) are not asked for a password: who may connect is decided by
the socket file's permissions.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import math
import os
import ssl
import time
from collections import Counter
from collections.abc import Callable

import bcrypt
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpumon.client.protocol import PATH as REPORT_PATH
from gpumon.web import webconfig
from gpumon.web.answer import plain
from gpumon.web.listen import via_unix_socket
from gpumon.web.peer import Abandoned, client_address, client_gone
from gpumon.web.tls import load_certificate
from gpumon.web.webconfig import WebConfig

log = logging.getLogger("gpumon.access")

OPEN_PATHS = frozenset({"/healthz", "/readyz", REPORT_PATH})
PAGE_HEADER = b"x-gpumon-page"  # sent by the node page's scripts with each request (assets/poll.js)
RELOAD_CHECK_SECONDS = 1.0
MAX_CACHED_LOGINS = 256
MAX_AUTHORIZATION_BYTES = 4096  # refused before decoding: nobody's user name and password are longer
BCRYPT_MAX_PASSWORD = 72  # bcrypt reads no further; Go's (exporter-toolkit's) compares these bytes only
BCRYPT_CONCURRENCY = 2  # checks at once: anonymous floods cannot take every core
# checks that may wait for one of those; more are refused at once (503): a flood of wrong passwords queued
# without bound, each check still run after its client had left, and a valid first login waited 30 s
BCRYPT_WAITING = 16
# of those, from one client address: found by review, one address's flood kept the queue full and a second
# user's valid first login was told 503 on every try for as long as it lasted
BCRYPT_WAITING_PER_CLIENT = 4
# a valid hash of a random password: unknown users cost one bcrypt check too, so timing does not tell
# which user names exist
_DUMMY_HASH = b"$2b$10$EZUfbJvXZ4AiPd0kLkz9SuzT7Dd8dFPkAWjas6pprpQKnfrkNfVg."


class PasswordsBusy(Exception):
    """Too many password checks are waiting: this one is refused without being made."""


class Guard:
    """The current web config, its TLS context, and the checks; swapped in place when the file changes."""

    def __init__(
        self,
        config: WebConfig,
        ssl_context: ssl.SSLContext | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.ssl_context = ssl_context
        self.clock = clock
        self._logins: set[tuple[str, bytes, bytes]] = set()  # (user, stored hash, sha256 of password)
        self._waiting_from: Counter[str | None] = Counter()  # checks waiting or running, by client address
        self._tokens = float(config.rate_limit.burst) if config.rate_limit else 0.0
        self._refilled = clock()
        self._signature = _signature(config.files())
        self._checked = clock()
        self._bad_signature: tuple[object, ...] | None = None
        self._pending: tuple[object, ...] | None = None
        self._listener = _listener_settings(config)  # what the listening socket really has, until restart
        self._bcrypt: asyncio.Semaphore | None = None  # made on the event loop, on first use
        self._waiting = 0  # password checks waiting for or holding a slot

    # --- reload ---
    async def watch(self) -> None:
        """Check the files every second on the event loop, where handshakes and requests also run: a
        renewed certificate must be picked up even when no client can complete a handshake with the old."""
        while True:
            await asyncio.sleep(RELOAD_CHECK_SECONDS)
            try:
                self.maybe_reload()
            except Exception:  # never let the watcher die silently: the next change is still followed
                log.exception("web config reload failed")

    def maybe_reload(self) -> None:
        """Like exporter-toolkit, follow the file while serving: new users, headers and a renewed
        certificate apply without a restart. Settings that shape the listener itself (TLS on or off, versions,
        client certificates) are read at startup only; a change to them is logged, not half-applied."""
        now = self.clock()
        if now - self._checked < RELOAD_CHECK_SECONDS:
            return
        self._checked = now
        signature = _signature(self.config.files())
        if signature in (self._signature, self._bad_signature):
            self._pending = None
            return
        if signature != self._pending:
            # changed since the last look: wait until it holds still for one more check, so a file being
            # written, or a certificate renewed before its key, is not taken half-way
            self._pending = signature
            return
        self._pending = None
        try:
            new = webconfig.load(self.config.path)
            if new.tls is not None and self.ssl_context is not None:
                load_certificate(self.ssl_context, new.tls, f"web config {new.path}: tls_server_config")
        except Exception as exc:  # whatever it is, the running configuration stays
            self._bad_signature = signature
            log.error("%s; still serving with the previous web config", exc)
            return
        old = self.config
        if _listener_settings(new) != self._listener:
            log.warning(
                "web config %s: TLS settings other than the certificate changed; they apply when gpumon "
                "restarts",
                new.path,
            )
        if old.users and not new.users:
            log.warning("web config %s now lists no basic_auth_users: /metrics is open to anyone", new.path)
        self.config = new
        self._signature = signature if new.files() == old.files() else _signature(new.files())
        self._bad_signature = None
        # a login stays valid while its user's hash is the same: cleared, a reload during a flood of wrong
        # passwords would send every scraper back to the password queue
        self._logins = {k for k in self._logins if new.users.get(k[0]) == k[1]}
        if new.rate_limit != old.rate_limit:
            self._tokens = float(new.rate_limit.burst) if new.rate_limit else 0.0
        log.info("web config %s reloaded (%d basic auth users)", new.path, len(new.users))

    # --- checks ---
    async def authorized(
        self, authorization: bytes | None, gone: Callable[[], bool] = lambda: False, client: str | None = None
    ) -> bool:
        """Whether the credentials are valid. Raises PasswordsBusy when BCRYPT_WAITING checks are queued, or
        BCRYPT_WAITING_PER_CLIENT from ``client`` (its address), and Abandoned when ``gone()`` says the
        client left while its check waited."""
        users = self.config.users
        if not users:
            return True
        if authorization is not None and len(authorization) > MAX_AUTHORIZATION_BYTES:
            return False
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        stored = users.get(user)
        digest = hashlib.sha256(password).digest()
        key = (user, stored or b"", digest)
        if stored is not None and key in self._logins:
            return True
        # bcrypt costs tens of milliseconds by design: off the event loop, so scrapes and reports go on, and
        # a few at a time, so a flood of wrong passwords queues here instead of taking every core
        if self._bcrypt is None:
            self._bcrypt = asyncio.Semaphore(BCRYPT_CONCURRENCY)
        if self._waiting >= BCRYPT_WAITING + BCRYPT_CONCURRENCY or (
            client is not None and self._waiting_from[client] >= BCRYPT_WAITING_PER_CLIENT
        ):
            raise PasswordsBusy()
        self._waiting += 1
        self._waiting_from[client] += 1
        try:
            async with self._bcrypt:
                if gone():
                    raise Abandoned()
                ok = await asyncio.to_thread(_check, password, stored or _DUMMY_HASH)
        finally:
            self._waiting -= 1
            self._waiting_from[client] -= 1
            if not self._waiting_from[client]:
                del self._waiting_from[client]
        if ok and stored is not None:
            if len(self._logins) >= MAX_CACHED_LOGINS:
                self._logins.clear()
            self._logins.add(key)
            return True
        return False

    def admit(self) -> bool:
        """A token bucket over the guarded requests: ``burst`` at once, then one per ``interval``."""
        limit = self.config.rate_limit
        if limit is None:
            return True
        now = self.clock()
        self._tokens = min(float(limit.burst), self._tokens + (now - self._refilled) / limit.interval)
        self._refilled = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class Access:
    """ASGI middleware: ``Guard``'s checks on every guarded request, its headers on every response."""

    def __init__(self, app: ASGIApp, guard: Guard, refused: Counter[str] | None = None) -> None:
        self.app = app
        self.guard = guard
        self.refused: Counter[str] = Counter() if refused is None else refused  # the gate's, by reason

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        guard = self.guard
        headers = [(k.lower().encode(), v.encode()) for k, v in guard.config.headers]
        if headers:
            send = _with_headers(send, headers)
        if scope["path"] in OPEN_PATHS or via_unix_socket(scope):
            await self.app(scope, receive, send)
            return
        if not guard.admit():
            limit = guard.config.rate_limit
            retry = str(max(1, math.ceil(limit.interval))).encode() if limit else b"1"
            await plain(
                send, 429, "too many requests (the web config's rate_limit)", [(b"retry-after", retry)]
            )
            return
        request_headers = dict(scope["headers"])
        try:
            peer = scope.get("client")
            ok = await guard.authorized(
                request_headers.get(b"authorization"),
                lambda: client_gone(scope),
                client_address(str(peer[0])) if peer else None,
            )
        except PasswordsBusy:
            self.refused["passwords_busy"] += 1
            await plain(
                send,
                503,
                "busy: too many password checks are waiting (basic_auth_users); retry in a moment",
                [(b"retry-after", b"1")],
            )
            return
        except Abandoned:
            self.refused["abandoned"] += 1
            return  # nobody to answer
        if not ok:
            # the node page's own requests get no challenge: a browser would answer it with a sign-in prompt
            # that a fetch waits on (forever, headless), where the page should say 401 and how to sign in
            challenge = (
                [] if request_headers.get(PAGE_HEADER) else [(b"www-authenticate", b'Basic realm="gpumon"')]
            )
            await plain(
                send,
                401,
                "unauthorized: this gpumon requires basic auth (basic_auth_users in its web config)",
                challenge,
            )
            return
        await self.app(scope, receive, send)


def _with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    async def sender(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sender


def _basic_credentials(header: bytes | None) -> tuple[str, bytes] | None:
    if not header or header[:6].lower() != b"basic ":
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode(), password
    except UnicodeDecodeError:
        return None


def _check(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password[:BCRYPT_MAX_PASSWORD], hashed)
    except ValueError:  # a hash bcrypt cannot read (the file's hashes were checked for shape, not content)
        return False


def _signature(paths: tuple[str, ...]) -> tuple[object, ...]:
    out: list[object] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


def _listener_settings(config: WebConfig) -> object:
    """What the listening socket was built with at startup (not the certificate's contents)."""
    tls = config.tls
    if tls is None:
        return None
    ca = tls.client_ca.encode() if tls.client_ca else b""
    if tls.client_ca_file:
        try:
            with open(tls.client_ca_file, "rb") as fh:
                ca = fh.read()
        except OSError:
            ca = b"unreadable"
    return (
        tls.client_auth_type,
        hashlib.sha256(ca).hexdigest(),  # the CA's contents: replacing the file changes the trust
        tls.min_version,
        tls.max_version,
        tls.cipher_suites,
        tls.prefer_server_cipher_suites,
    )
