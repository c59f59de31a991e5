"""A real Prometheus and Alertmanager on loopback, and a webhook receiver, for the end-to-end test.

The Debian packages' binaries (`prometheus`, `prometheus-alertmanager`) run as subprocesses with their state
in a temporary directory; the webhook receiver is a plain HTTP server thread that records every notification.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpumon import alerting
from support.helpers import ROOT, free_port, require_tool

ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")


def alertmanager_binary() -> str:
    for name in ALERTMANAGER_BINARIES:
        if shutil.which(name):
            return str(shutil.which(name))
    return require_tool(ALERTMANAGER_BINARIES[0])  # fails in CI, skips locally


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[str]
    url: str
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} log ---\n" + "\n".join(text.splitlines()[-lines:])


def start(name: str, args: list[str], url: str, ready: str, workdir: Path, timeout: float = 60.0) -> Process:
    log = workdir / f"{name}.log"
    fh = log.open("w")
    proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, text=True, cwd=workdir)
    p = Process(name, proc, url, log)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}\n{p.tail()}")
        try:
            if httpx.get(url + ready, timeout=2).status_code == 200:
                return p
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    p.stop()
    raise AssertionError(f"{name} not ready after {timeout:.0f} s\n{p.tail()}")


def start_prometheus(config: Path, work: Path) -> Process:
    """The real Prometheus on a free loopback port, its data in ``work``, ready when this returns."""
    port = free_port()
    return start(
        "prometheus",
        [
            require_tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        f"http://127.0.0.1:{port}",
        "/-/ready",
        work,
    )


@dataclass
class Webhook:
    """Alertmanager's webhook receiver: every POSTed notification, in arrival order."""

    notifications: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/alerts"

    def start(self) -> Webhook:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with hook.lock:
                    hook.notifications.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert of every notification (each with its receiver), oldest first."""
        with self.lock:
            return [
                {**a, "receiver": n.get("receiver")} for n in self.notifications for a in n.get("alerts", [])
            ]

    def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [a for a in self.alerts() if predicate(a)]
            if found:
                return found[0]
            time.sleep(0.5)
        seen = sorted({(a["labels"].get("alertname"), a["status"]) for a in self.alerts()})
        raise AssertionError(f"no {what} within {timeout:.0f} s; the webhook saw {seen}")


RULE_FILES = ("recording.rules.yml", "alerting.rules.yml")


def shortened_rules(seconds: float, fors: Mapping[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """The shipped rule files as (file name, document) with every for:/keep_firing_for: set to ``seconds``
    (gpumon.alerting.with_short_for), slow groups evaluated every second too, and the alerts in ``fors``
    given their own for: instead."""
    out = []
    for name in RULE_FILES:
        doc = yaml.safe_load(alerting.with_short_for((ROOT / "alerts" / name).read_text(), seconds))
        for group in doc["groups"]:  # slow groups (a 7-day median every 5m) evaluate every second too
            if "interval" in group:
                group["interval"] = "1s"
            for rule in group["rules"]:
                if rule.get("alert") in fors:
                    rule["for"] = fors[rule["alert"]]
        out.append((name, doc))
    return out


class Prometheus:
    def __init__(self, process: Process) -> None:
        self.process = process
        self.client = httpx.Client(base_url=process.url, timeout=15)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant query's result at ``at`` (Unix seconds; default: now)."""
        return self._query(expr, at, {})

    def _query(self, expr: str, at: float | None, extra: dict[str, str]) -> list[dict[str, Any]]:
        params = {"query": expr, **extra}
        if at is not None:
            params["time"] = f"{at:.3f}"
        r = self.client.get("/api/v1/query", params=params)
        body = r.json()
        if body.get("status") != "success":
            raise AssertionError(f"query failed: {expr}\n{body.get('error')}")
        result = body["data"]["result"]
        return result if isinstance(result, list) else [result]

    def wait(self, expr: str, timeout: float, what: str | None = None) -> list[dict[str, Any]]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = self.query(expr)
            if found:
                return found
            time.sleep(1.0)
        raise AssertionError(f"{what or expr}: no data within {timeout:.0f} s")

    def rule_health(self) -> list[str]:
        """Rules Prometheus could not evaluate, with the error."""
        groups = self.client.get("/api/v1/rules").json()["data"]["groups"]
        return [
            f"{r['name']}: {r.get('lastError')}"
            for g in groups
            for r in g["rules"]
            if r.get("health") == "err"
        ]

    def close(self) -> None:
        self.client.close()
