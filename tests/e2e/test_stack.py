"""The shipped rules and dashboards against the real thing: four gpumon daemons, Prometheus, Alertmanager.

On loopback: four `gpumon serve` processes with simulated 8-GPU nodes (a 24-rank job across three of them, a
4-rank job on the fourth, whose other four GPUs idle), a real Prometheus scraping them every 2 s with the
shipped recording and alerting rules, and a real Alertmanager with the shipped routing and inhibition whose
receivers point at a webhook this test owns. Only timings are shortened: every `for:`/`keep_firing_for:` of
the rules, the scrape and evaluation intervals (slow rule groups' included) and Alertmanager's group
waits. The expressions, labels, annotations, routes and inhibitions are the shipped ones.

The test then (1) runs every PromQL expression of every dashboard panel and variable, and every recording
rule, and requires data from each; (2) sees a throughput regression injected through the simulator on one
node reach the webhook as GpumonTrainingThroughputBelowBaseline with the job's labels, then resolve; (3) sees
an injected XID arrive as GpumonGpuXidCritical; and checks nothing alerted about the idle GPUs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.helpers import ROOT, Daemon, free_port, require_tool, run_gpumon, start_daemon
from support.stack import Prometheus, Webhook, alertmanager_binary, start, start_prometheus

from gpumon import alerting, dashboards
from gpumon.baselines import library as B

pytestmark = pytest.mark.slow  # a real Prometheus and Alertmanager scrape four daemons for minutes

JOB, JOB_GPUS, SINGLE = "llama-70b", 24, "bert-ft"
SLOW_START, SLOW_FOR = 80, 50  # seconds after daemon start: the regression on node 2
XID_AT, XID_GPU, XID = 15, 6, 74  # an NVLink error on an idle GPU of node 3
# seconds: every for:/keep_firing_for: of the shipped rules, for the test. Two scrapes and more, so that a
# CPU-starved moment of this shared machine (a scrape over its timeout) is not an outage
SHORT = 5
# Prometheus applies discovered targets on a 5 s tick and scrapes at an offset within the interval, so
# up{job="gpumon"} is absent for the first 5-7 s after it starts: a 5 s `for:` on absent() races that start
# (it fired once on a loaded CI machine). The shipped 10m covers it; here 30 s does.
ABSENT_FOR = "30s"
RATE_INTERVAL = "20s"
REGRESSION = "GpumonTrainingThroughputBelowBaseline"  # $__rate_interval: at least four scrapes


def node_args(i: int, library: Path) -> list[str]:
    args = ["--simulate", "8xH100-SXM", "--seed", str(i), "--node-name", f"node-{i}"]
    # a 2 s sampling interval halves the four daemons' load on this machine's two cores
    args += ["--interval", "2s", "--rate-window", "10s", "--baselines", str(library)]
    if i < 3:
        args += ["--sim-job", f"{JOB}:0-7:{8 * i}/{JOB_GPUS}"]
    else:
        args += ["--sim-job", f"{SINGLE}:0-3", "--sim-fault", f"xid:{XID_GPU}:{XID}@{XID_AT}"]
    if i == 2:
        args += ["--sim-fault", f"slowdown:*=2@{SLOW_START}+{SLOW_FOR}"]
    return args


def prometheus_config(targets: list[str], alertmanager: str, rules: list[str]) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "1s"},
        "rule_files": rules,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [{"job_name": "gpumon", "static_configs": [{"targets": targets}]}],
    }


def alertmanager_config(webhook: str) -> dict[str, Any]:
    """The shipped config with each receiver delivering to the test's webhook, under its own name, and the
    group timings shortened; routes and inhibitions untouched."""
    config = yaml.safe_load((ROOT / "alerts" / "alertmanager.yml").read_text())
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": webhook, "send_resolved": True}]}
        for r in config["receivers"]
    ]

    def shorten(route: dict[str, Any]) -> None:
        for key, value in (("group_wait", "1s"), ("group_interval", "1s"), ("repeat_interval", "1h")):
            if key in route or route is config["route"]:
                route[key] = value
        for child in route.get("routes", []):
            shorten(child)

    shorten(config["route"])
    return config


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict[str, Any]]:
    require_tool("prometheus")  # before anything starts: in CI its absence fails the test
    am_bin = alertmanager_binary()
    work = tmp_path_factory.mktemp("stack")
    library = work / "baselines.toml"
    hook = Webhook().start()
    started: list[Any] = []
    try:
        nodes = [_daemon(i, library, work) for i in range(4)]
        started += nodes
        am_port = free_port()
        (work / "am.yml").write_text(yaml.safe_dump(alertmanager_config(hook.url)))
        am = start(
            "alertmanager",
            [
                am_bin,
                f"--config.file={work / 'am.yml'}",
                f"--storage.path={work / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
            ],
            f"http://127.0.0.1:{am_port}",
            "/-/ready",
            work,
        )
        started.append(am)
        rules = []
        for name in ("recording.rules.yml", "alerting.rules.yml"):
            text = alerting.with_short_for((ROOT / "alerts" / name).read_text(), SHORT)
            doc = yaml.safe_load(text)
            for group in doc["groups"]:  # slow groups (a 7-day median every 5m) evaluate every second too
                if "interval" in group:
                    group["interval"] = "1s"
                for rule in group["rules"]:
                    if rule.get("alert") == "GpumonExporterAbsent":
                        rule["for"] = ABSENT_FOR
            (work / name).write_text(yaml.safe_dump(doc, sort_keys=False))
            rules.append(str(work / name))
        targets = [n.url.removeprefix("http://") for n in nodes]
        (work / "prometheus.yml").write_text(
            yaml.safe_dump(prometheus_config(targets, f"127.0.0.1:{am_port}", rules))
        )
        prom = start_prometheus(work / "prometheus.yml", work)
        started.append(prom)
        p = Prometheus(prom)
        yield {"nodes": nodes, "prom": p, "hook": hook, "library": library, "t0": time.monotonic()}
        p.close()
    finally:
        for s in reversed(started):
            s.stop()
        hook.stop()


def _daemon(i: int, library: Path, work: Path) -> Daemon:
    return start_daemon(*node_args(i, library), log_file=work / f"node-{i}.log")


def _since_start(stack: dict[str, Any]) -> float:
    return time.monotonic() - stack["t0"]


def _record_baseline(stack: dict[str, Any]) -> None:
    """`gpumon baseline record` against node 0, as an operator would once the job runs well."""
    end = time.monotonic() + 90
    while True:
        out = run_gpumon(
            "baseline",
            "--baselines",
            str(stack["library"]),
            "record",
            "--job",
            JOB,
            "--window",
            "60s",
            "--warmup",
            "0s",
            "--url",
            stack["nodes"][0].url,
        )
        if out.returncode == 0:
            break
        assert "steady interval" in out.stderr or "no history" in out.stderr, out.stderr
        assert time.monotonic() < end, out.stderr
        time.sleep(3)
    # and, as an operator who once ran the workload on one node, its 8-GPU baseline: a baseline at the job's
    # own size is not a scaling reference, so without this scaling efficiency would (rightly) be absent
    with B.editing(str(stack["library"])) as box:
        (full,) = box[0].baselines
        per_gpu = (full.figures.tokens_per_second_per_gpu or 0.0) * 1.05
        node = dataclasses.replace(
            full,
            name=f"{JOB}-one-node",
            key=dataclasses.replace(full.key, gpus=8),
            figures=dataclasses.replace(full.figures, tokens_per_second_per_gpu=per_gpu),
            source="edited by hand",
        )
        box[0], _ = box[0].put(node)


def test_dashboards_rules_and_alerts_against_real_prometheus_and_alertmanager(stack) -> None:
    prom: Prometheus = stack["prom"]
    hook: Webhook = stack["hook"]
    _record_baseline(stack)
    assert _since_start(stack) < SLOW_START - 25, "the baseline came too late to see the regression start"

    # (1) every panel, variable and recording rule has data, once the baseline and the XID are in
    prom.wait(f'job_name:gpumon_training_throughput_baseline:ratio{{job_name="{JOB}"}}', 30, "the ratio")
    prom.wait("gpumon_gpu_xid_errors_total", 30, "the injected XID")
    time.sleep(20)  # a full $__rate_interval of samples after both
    assert prom.rule_health() == []
    everything = "$__all"
    variables = {v: everything for v in ("job", "node", "instance", "job_name", "gpu")}
    empty = []
    checks = [(f"{q.dashboard}: {q.panel} [{q.ref_id}]", q.expr) for q in dashboards.queries()]
    checks += [(f"{q.dashboard}: variable {q.panel}", q.expr) for q in dashboards.variable_queries()]
    checks += [(f"recording rule {name}", name) for name in alerting.recording_names()]
    for what, expr in checks:
        concrete = dashboards.expand(expr, variables, RATE_INTERVAL)
        if not prom.query(concrete):
            empty.append(f"{what}: {concrete}")
    assert empty == [], f"{len(empty)} of {len(checks)} queries returned no data:\n" + "\n".join(empty)
    assert prom.query(f'job_name:gpumon_training_gpus:count{{job_name="{JOB}"}} == {JOB_GPUS}')
    # against the one-node baseline, 5 % faster per GPU than the job recorded at full size
    (scaling,) = prom.query(f'job_name:gpumon_training_scaling_efficiency:ratio{{job_name="{JOB}"}}')
    assert 0.5 < float(scaling["value"][1]) < 0.975, scaling  # the 24-GPU baseline would give 1.0
    if _since_start(stack) < SLOW_START:  # no regression yet, so no regression alert
        assert not [
            a for a in hook.alerts() if a["labels"]["alertname"] == "GpumonTrainingThroughputBelowBaseline"
        ]

    # (3) the XID, from node 3's idle GPU, pages
    xid = hook.wait(lambda a: a["labels"]["alertname"] == "GpumonGpuXidCritical", 60, "XID alert")
    labels = xid["labels"]
    assert (labels["xid"], labels["gpu"], labels["severity"]) == (str(XID), str(XID_GPU), "critical")
    assert labels["instance"] == stack["nodes"][3].url.removeprefix("http://")
    assert xid["annotations"]["runbook_url"].endswith("#gpumongpuxidcritical")
    assert "NVLink" in xid["annotations"]["summary"]
    assert {a["receiver"] for a in hook.alerts() if a["labels"]["alertname"] == "GpumonGpuXidCritical"} >= {
        "pager"
    }

    # (2) the regression on node 2 reaches the webhook with the job's labels, then resolves
    remaining = SLOW_START + 60 - _since_start(stack)
    fired = hook.wait(
        lambda a: (
            a["labels"]["alertname"] == "GpumonTrainingThroughputBelowBaseline" and a["status"] == "firing"
        ),
        remaining,
        "throughput regression alert",
    )
    assert fired["labels"] == {
        "alertname": REGRESSION,
        "job_name": JOB,
        "severity": "warning",
    }
    assert fired["receiver"] == "chat"
    assert fired["annotations"]["runbook_url"].endswith("#gpumontrainingthroughputbelowbaseline")
    assert JOB in fired["annotations"]["description"]
    remaining = SLOW_START + SLOW_FOR + 60 - _since_start(stack)
    hook.wait(
        lambda a: (
            a["labels"]["alertname"] == "GpumonTrainingThroughputBelowBaseline" and a["status"] == "resolved"
        ),
        remaining,
        "the regression alert resolving",
    )

    # nothing about the idle GPUs of node 3 but the XID, nothing about the single-node job, no exporter alerts
    node3 = stack["nodes"][3].url.removeprefix("http://")
    fired_names = {a["labels"]["alertname"] for a in hook.alerts()}
    idle = [
        a
        for a in hook.alerts()
        if a["labels"].get("instance") == node3
        and a["labels"].get("gpu") in {"4", "5", "6", "7"}
        and a["labels"]["alertname"] != "GpumonGpuXidCritical"
    ]
    assert idle == [], idle
    assert not [a for a in hook.alerts() if a["labels"].get("job_name") == SINGLE]
    healthy = {"GpumonExporterDown", "GpumonExporterAbsent", "GpumonGpuDown", "GpumonTrainingRanksLost"}
    healthy |= {"GpumonTrainingJobStalled", "GpumonTrainingJobNotStarting"}
    assert not fired_names & healthy
