"""Reading a running daemon's JSON API from the CLI (diagnose, estimate --job): stdlib, one-line errors."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpumon.client.protocol import DEFAULT_URL
from gpumon.config import ConfigError


class DaemonError(Exception):
    """The daemon could not be reached, does not know what was asked, or answered something unreadable."""


class NotFound(DaemonError):
    """The daemon answered 404: it does not know what was asked (a job that never reported, or went)."""


def default_url() -> str:
    """The SDK's own setting, so the CLI looks where the training processes report."""
    url = os.environ.get("GPUMON_URL", DEFAULT_URL)
    return DEFAULT_URL if url.startswith("unix:") else url


def check_url(base: str) -> str:
    parsed = urllib.parse.urlsplit(base)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"--url: expected the daemon's http://HOST:PORT, got {base!r}")
    return base.rstrip("/")


def get_json(base: str, path: str, *, timeout: float = 5.0, missing: str | None = None) -> dict[str, Any]:
    """GET ``base + path`` as a JSON object. ``missing``: the message for a 404 (else a generic one)."""
    url = check_url(base) + path
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise NotFound(missing or f"the daemon at {base} knows no {path}") from None
        raise DaemonError(f"the daemon answered {url} with HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DaemonError(
            f"cannot reach the gpumon daemon at {url}: {reason} (is `gpumon serve` running? pass --url)"
        ) from None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise DaemonError(f"the daemon answered {url} with something that is not JSON") from None
    if not isinstance(data, dict):
        raise DaemonError(f"the daemon answered {url} with JSON that is not an object")
    return data


def job_path(job: str) -> str:
    if not job.strip():
        raise ConfigError("--job: expected a job name, got an empty string")
    return "/v1/jobs/" + urllib.parse.quote(job, safe="")
