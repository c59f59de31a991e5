"""VictoriaMetrics single-node and vmalert on loopback, for the tests that run gpumon's rules and dashboards
on the second engine.

The Debian package ``victoria-metrics`` (1.79) provides both binaries. VictoriaMetrics scrapes with its own
``-promscrape.config`` and keeps its data in the test's directory; vmalert evaluates the rule files against
it, writes recording results and alert state back to it over remote write, and may notify an Alertmanager.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx

from support.helpers import free_port, require_tool
from support.stack import Process, Prometheus, start

INSTALL = "apt-get install victoria-metrics"

# VictoriaMetrics moves every query for a moment within -search.latencyOffset (default 30 s) of now back to
# now - 30 s, waiting for late samples. vmalert queries at "now", so with the default each level of chained
# recording rules reads the level below 30 s late. The test's scrapes arrive on time: 1 s (releases before
# 1.88 cannot be given 0).
LATENCY_OFFSET = "1s"
# vmalert batches recording results for remote write every 5 s by default; a rule that reads another rule's
# series sees it only after the flush. 1 s, the test's evaluation interval, keeps a chain's lag to a few
# evaluations.
FLUSH_INTERVAL = "1s"


def victoria_metrics_binary() -> str:
    return require_tool("victoria-metrics", INSTALL)


def vmalert_binary() -> str:
    return require_tool("vmalert", INSTALL)


def start_victoria_metrics(scrape_config: Path, work: Path) -> Process:
    """VictoriaMetrics single-node on a free loopback port, scraping as ``scrape_config`` says (a Prometheus
    configuration; only its ``global`` and ``scrape_configs`` are read), its data in ``work``."""
    port = free_port()
    return start(
        "victoria-metrics",
        [
            victoria_metrics_binary(),
            f"-promscrape.config={scrape_config}",
            f"-storageDataPath={work / 'vm-data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-search.latencyOffset={LATENCY_OFFSET}",
            # the tests ask again and again about moments seconds ago: never an answer cached before the
            # last samples of that moment arrived
            "-search.disableCache",
            "-loggerLevel=WARN",
        ],
        f"http://127.0.0.1:{port}",
        "/-/ready",
        work,
    )


def vmalert_args(
    rule_files: list[Path], datasource: str, *, notifier: str | None = None, evaluation_interval: str = "1s"
) -> list[str]:
    """vmalert's command line against the VictoriaMetrics at ``datasource``, which also receives the recorded
    series and the alert state (ALERTS, ALERTS_FOR_STATE)."""
    args = [vmalert_binary(), *(f"-rule={f}" for f in rule_files)]
    args += [
        f"-datasource.url={datasource}",
        f"-remoteWrite.url={datasource}",
        f"-remoteRead.url={datasource}",
        f"-remoteWrite.flushInterval={FLUSH_INTERVAL}",
        f"-evaluationInterval={evaluation_interval}",
        # Prometheus sends alerts without an `alertgroup` label; without this vmalert adds one, and the
        # notifications would differ from Prometheus's by it
        "-disableAlertgroupLabel",
        "-loggerLevel=WARN",
    ]
    # vmalert 1.79 refuses alerting rules without a notifier; nothing listens on port 1 of loopback
    args.append(f"-notifier.url={notifier or 'http://127.0.0.1:1'}")
    return args


def start_vmalert(
    rule_files: list[Path],
    datasource: str,
    work: Path,
    *,
    notifier: str | None = None,
    evaluation_interval: str = "1s",
) -> Process:
    """vmalert evaluating ``rule_files`` against the VictoriaMetrics at ``datasource``, ready on return."""
    port = free_port()
    args = vmalert_args(rule_files, datasource, notifier=notifier, evaluation_interval=evaluation_interval)
    url = f"http://127.0.0.1:{port}"
    return start("vmalert", [*args, f"-httpListenAddr=127.0.0.1:{port}"], url, "/-/ready", work)


def vmalert_dry_run(rule_files: list[Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``vmalert -dryRun`` on the rule files, with its expression and template checks: exit status 0 when
    vmalert would load them, its log (the errors) in stdout otherwise."""
    args = [vmalert_binary(), "-dryRun", "-rule.validateExpressions", "-rule.validateTemplates"]
    args += [f"-rule={f}" for f in rule_files]
    return subprocess.run(
        args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60, check=False
    )


def victoria_scrape_config(prometheus: dict[str, Any], phases: dict[str, float]) -> dict[str, Any]:
    """Prometheus's scrape job for VictoriaMetrics, each target scraped at the moment Prometheus scrapes it.

    ``phases``: each target's scrape time modulo the interval, as Prometheus keeps it. Each engine otherwise
    picks its own moment within the 2 s interval, and a simulated GPU's power or utilisation swings with the
    phase of its job's step from one daemon sample to the next: the two would hold different samples and
    differ by up to half, whatever they computed. scrape_offset (VictoriaMetrics' own setting) needs a job
    per target; each keeps the label job="gpumon". VictoriaMetrics refuses the sections it does not read
    (rule_files, alerting, evaluation_interval)."""
    scrape = {k: v for k, v in prometheus["global"].items() if k.startswith("scrape_")}
    (job,) = prometheus["scrape_configs"]
    jobs = [
        {
            "job_name": f"{job['job_name']}-{i}",
            "scrape_offset": f"{round(phases[target] * 1000)}ms",
            "static_configs": [{"targets": [target]}],
            "relabel_configs": [{"target_label": "job", "replacement": job["job_name"]}],
        }
        for i, target in enumerate(t for c in job["static_configs"] for t in c["targets"])
    ]
    return {"global": scrape, "scrape_configs": jobs}


def scrape_phases(prom: Prometheus, interval: float) -> dict[str, float]:
    """When within each interval Prometheus scrapes each target (seconds), from its `up` samples."""
    phases = {}
    for series in prom.query(f'up{{job="gpumon"}}[{round(interval * 3)}s]'):
        t = float(series["values"][-1][0])
        phases[series["metric"]["instance"]] = t % interval
    return phases


class VictoriaMetrics(Prometheus):
    """The query client of :class:`support.stack.Prometheus` on VictoriaMetrics' Prometheus-compatible API."""

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        # nocache: never an answer computed before the latest samples arrived
        return self._query(expr, at, {"nocache": "1"})


class Vmalert:
    """vmalert's Prometheus-compatible rules and alerts API."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.client = httpx.Client(base_url=process.url, timeout=15)

    def rules(self) -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = self.client.get("/api/v1/rules").json()["data"]["groups"]
        return [r for g in groups for r in g["rules"]]

    def rule_health(self) -> list[str]:
        """Rules vmalert could not evaluate, with the error."""
        return [f"{r['name']}: {r.get('lastError')}" for r in self.rules() if r.get("health") != "ok"]

    def alerts(self) -> list[dict[str, Any]]:
        """Every pending or firing alert, as vmalert's /api/v1/alerts lists it."""
        # null, not [], while none is active
        alerts: list[dict[str, Any]] = self.client.get("/api/v1/alerts").json()["data"]["alerts"] or []
        return alerts

    def close(self) -> None:
        self.client.close()
