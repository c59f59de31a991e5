"""Reading a running daemon's JSON API from the CLI (diagnose, estimate --job): stdlib, one-line errors.

The daemon is found where the SDK reports to: ``http://``, ``https://`` or ``unix:///path`` (the daemon's
``--ingest-socket``), the same URL forms as ``GPUMON_URL``; ``https://user:password@host:port`` for a daemon
with basic auth (the certificate is checked against the system's CAs, or ``SSL_CERT_FILE``).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import time
import urllib.parse
from typing import Any

from gpumon.client.protocol import DEFAULT_URL
from gpumon.client.transport import (
    DeadlineConnection,
    HTTPSDeadlineConnection,
    UnixHTTPConnection,
    tls_context,
)
from gpumon.config import ConfigError

MAX_ANSWER_BYTES = 64 * 1024 * 1024  # a /v1/jobs document for hundreds of ranks is a few MB at most


class DaemonError(Exception):
    """The daemon could not be reached, does not know what was asked, or answered something unreadable."""


class NotFound(DaemonError):
    """The daemon answered 404: it does not know what was asked (a job that never reported, or went)."""


def default_url() -> str:
    """The SDK's own setting, so the CLI looks where the training processes report."""
    return os.environ.get("GPUMON_URL") or DEFAULT_URL


def check_url(base: str) -> str:
    parsed = urllib.parse.urlsplit(base)
    if parsed.scheme == "unix" and parsed.path:
        return base
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(
            f"--url: expected the daemon's http://HOST:PORT, https://[USER:PASSWORD@]HOST:PORT or "
            f"unix:///PATH, got {base!r}"
        )
    return base.rstrip("/")


def _connection(base: str, timeout: float) -> tuple[DeadlineConnection, str]:
    """A connection to the daemon and the path prefix its URL carries. Connecting, sending and reading
    share one deadline (the SDK's connections): a daemon, or whatever holds its port, that answers a byte at
    a time cannot hold the command past ``timeout``."""
    parts = urllib.parse.urlsplit(base)
    conn: DeadlineConnection
    if parts.scheme == "unix":
        conn, prefix = UnixHTTPConnection(parts.path, timeout), ""
    elif parts.scheme == "https":
        host, port = parts.hostname or "", parts.port
        conn = HTTPSDeadlineConnection(host, port, timeout=timeout, context=tls_context())
        prefix = parts.path.rstrip("/")
    else:
        conn, prefix = (
            DeadlineConnection(parts.hostname or "", parts.port, timeout=timeout),
            parts.path.rstrip("/"),
        )
    conn.set_deadline(time.monotonic() + timeout)
    return conn, prefix


def get_json(base: str, path: str, *, timeout: float = 5.0, missing: str | None = None) -> dict[str, Any]:
    """GET ``path`` from the daemon at ``base`` as a JSON object. ``missing``: the message for a 404."""
    where = display_url(check_url(base).rstrip("/")) + path
    conn, prefix = _connection(base, timeout)
    try:
        conn.request("GET", prefix + path, headers={"Accept": "application/json", **_credentials(base)})
        response = conn.getresponse()
        body = response.read(MAX_ANSWER_BYTES)
    except (OSError, http.client.HTTPException) as exc:
        raise DaemonError(
            f"cannot reach the gpumon daemon at {where}: {exc} (is `gpumon serve` running? pass --url)"
        ) from None
    finally:
        conn.close()
    if response.status == 401:
        raise DaemonError(
            f"the daemon at {where} requires basic auth (its --web-config): pass --url "
            "https://USER:PASSWORD@HOST:PORT, or use its unix socket (--url unix:///PATH)"
        )
    if response.status == 404:
        raise NotFound(missing or f"the daemon at {display_url(base)} knows no {path}")
    if response.status != 200:
        raise DaemonError(f"the daemon answered {where} with HTTP {response.status} {response.reason}")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise DaemonError(f"the daemon answered {where} with something that is not JSON") from None
    if not isinstance(data, dict):
        raise DaemonError(f"the daemon answered {where} with JSON that is not an object")
    return data


def _credentials(base: str) -> dict[str, str]:
    """Basic auth from the URL's user info (``https://user:password@host:9478``), as curl and browsers do."""
    parts = urllib.parse.urlsplit(base)
    if parts.username is None:
        return {}
    pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


def display_url(url: str) -> str:
    """The URL as messages show it: a password in it becomes ***."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def job_path(job: str) -> str:
    if not job.strip():
        raise ConfigError("--job: expected a job name, got an empty string")
    return "/v1/jobs/" + urllib.parse.quote(job, safe="")
