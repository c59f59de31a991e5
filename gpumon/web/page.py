"""The node page at ``/``: this node's GPUs and jobs, redrawn every few seconds from /v1/gpus and /v1/jobs.

One self-contained document: nodes are often air-gapped, so the style and scripts are inline (from
``assets/``, shipped as package data) and nothing is loaded from anywhere else. The Content-Security-Policy
allows exactly those inline blocks, by hash, and fetches from this origin only; whatever a job or process
name contains, the scripts put it in the page as text, and the policy would refuse a script that slipped in
anyway. The scripts are formatted with ``prettier --print-width 110``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from functools import cache
from importlib import resources

from gpumon import __version__
from gpumon.gpu.types import THROTTLE_REASONS
from gpumon.jobs.gpus import THROTTLING

REFRESH_SECONDS = 3.0  # the default; ?refresh=SECONDS overrides it (0.5 to 300)
STYLE = "page.css"
SCRIPTS = ("kit.js", "gpus.js", "jobs.js", "poll.js")  # in this order: each uses the ones before it

_BANNERS = {
    "sim": "<b>Simulated GPUs.</b> These numbers come from gpumon's simulator, not from hardware "
    '(gpumon_build_info{backend="sim"}).',
    "replay": "<b>Replayed GPUs.</b> These numbers are a recording of another node's NVML answers "
    '(gpumon_build_info{backend="replay"}).',
}
_GPU_COLUMNS = ("GPU", "Utilisation", "HBM used", "Power", "Temp.", "SM clock, throttling", "XIDs", "Used by")
_JOB_COLUMNS = ("Job", "Tokens/s", "MFU", "Step time", "Verdict and evidence", "Against baseline")


@cache
def asset(name: str) -> str:
    return (resources.files("gpumon.web") / "assets" / name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def headers() -> dict[str, str]:
    """The page's response headers (a new dict each time: the caller may add to it)."""
    return {
        "Content-Security-Policy": _policy(),
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "no-store",
        "Referrer-Policy": "no-referrer",
    }


@cache
def _policy() -> str:
    """``img-src data:`` is for the empty favicon, which stops the browser asking for /favicon.ico (a 404
    in its console on every load)."""
    return "; ".join(
        (
            "default-src 'none'",
            "script-src " + " ".join(_sha256(asset(name)) for name in SCRIPTS),
            f"style-src {_sha256(asset(STYLE))}",
            "connect-src 'self'",
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )


def render(backend: str, *, jobs: bool, node: str | None) -> str:
    """The document. Only server-side values are written into it here (escaped); everything from the API
    is drawn by the script."""
    throttle = json.dumps([[bit, name, bool(bit & THROTTLING)] for bit, name, _ in THROTTLE_REASONS])
    banner = f'<p class="banner">{_BANNERS[backend]}</p>' if backend in _BANNERS else ""
    where = f' <span class="node">{html.escape(node)}</span>' if node else ""
    links = [("/metrics", "Prometheus metrics"), ("/v1/gpus", "GPUs as JSON")]
    if jobs:
        links += [("/v1/jobs", "jobs as JSON"), ("/v1/baselines", "baselines as JSON")]
        job_body = (
            '<p class="facts" id="jobs-window"></p><div class="scroll"><table><thead>'
            f'{_head(_JOB_COLUMNS)}</thead><tbody id="job-rows"></tbody></table></div>'
        )
    else:
        job_body = (
            '<p class="note">Training telemetry is off on this daemon (started with --no-ingest): it tracks '
            "no jobs.</p>"
        )
    links += [("/healthz", "liveness"), ("/readyz", "readiness")]
    footer = "".join(f'<a href="{path}">{html.escape(text)}</a>' for path, text in links)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>gpumon{' · ' + html.escape(node) if node else ''}</title>"
        f'<link rel="icon" href="data:,"><style>{asset(STYLE)}</style></head>'
        f'<body data-jobs="{"on" if jobs else "off"}" data-refresh="{REFRESH_SECONDS:g}" '
        f'data-throttle="{html.escape(throttle)}">'
        f'<header><h1>gpumon{where}</h1><p id="status" class="status loading">loading…</p></header>{banner}'
        '<noscript><p class="note">This page draws itself with JavaScript; without it, read /v1/gpus and '
        "/v1/jobs.</p></noscript>"
        '<section id="gpus"><h2>GPUs</h2><p class="facts" id="node-facts"></p><div class="scroll"><table>'
        f'<thead>{_head(_GPU_COLUMNS)}</thead><tbody id="gpu-rows"></tbody></table></div></section>'
        f'<section id="jobs"><h2>Jobs</h2>{job_body}</section>'
        f"<footer>{footer}<span>gpumon {html.escape(__version__)} · backend {html.escape(backend)}</span>"
        "</footer>" + "".join(f"<script>{asset(name)}</script>" for name in SCRIPTS) + "</body></html>"
    )


def _head(columns: tuple[str, ...]) -> str:
    return "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>"
