"""The shipped rules and dashboards against the real thing: four gpumon daemons, Prometheus, Alertmanager.

On loopback: four `gpumon serve` processes with simulated 8-GPU nodes (a 24-rank job across three of them, a
4-rank job on the fourth, whose other four GPUs idle but for GPU 4, where one SDK rank of a third job starts
half a minute in), a real Prometheus scraping them every 2 s with the shipped recording and alerting rules,
and a real Alertmanager with the shipped routing and inhibition whose receivers point at a webhook this test
owns. Only timings are shortened: every `for:`/`keep_firing_for:` of the rules, the scrape and evaluation
intervals (slow rule groups' included) and Alertmanager's group waits. The expressions, labels, annotations,
routes and inhibitions are the shipped ones. Beside them, VictoriaMetrics scrapes the same daemons at the
same moments and vmalert evaluates the same (shortened) rules as `python -m gpumon.alerting --vmalert`
renders them.

The first test then (1) runs every PromQL expression of every dashboard panel and variable, and every
recording rule, and requires data from each; (2) sees a throughput regression injected through the simulator
on one node reach the webhook as GpumonTrainingThroughputBelowBaseline with the job's labels, then resolve;
(3) sees an injected XID arrive as GpumonGpuXidCritical; and checks nothing alerted about the idle GPUs. The
second runs every dashboard query and recording rule on both engines and compares the answers, and the
alerts' states.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.helpers import IN_CI, ROOT, Daemon, free_port, require_tool, run_gpumon, start_daemon
from support.inspector import Writer
from support.stack import Prometheus, Webhook, alertmanager_binary, shortened_rules, start, start_prometheus
from support.victoria import (
    VictoriaMetrics,
    Vmalert,
    scrape_phases,
    start_victoria_metrics,
    start_vmalert,
    victoria_metrics_binary,
    victoria_scrape_config,
    vmalert_binary,
)

from gpumon import alerting, dashboards
from gpumon.baselines import library as B
from gpumon.client import Reporter

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
SCRAPE_INTERVAL = 2  # seconds
RATE_INTERVAL = "20s"
# recorded only while a node or rank straggles, which no node here does before (1) is checked: the fleet test
# (tests/e2e/test_fleet.py) sees them appear and go
WHILE_STRAGGLING = {
    "instance_job_name:gpumon_training_straggler:ratio",
    "instance_job_name_rank:gpumon_training_straggler:ratio",
}
REGRESSION = "GpumonTrainingThroughputBelowBaseline"  # $__rate_interval: at least four scrapes
# VictoriaMetrics and vmalert beside Prometheus. A rank of another job starts on node 3 LATE_START seconds
# after Prometheus, when VictoriaMetrics runs too: at COMPARE_AT its counters are younger than every window of
# the rules (5 m and more), where MetricsQL's rate() and Prometheus's differ most. COMPARE_AT falls after the
# regression has ended (tokens/s steady again), about when the first test ends.
LATE_JOB, LATE_GPU, LATE_START, COMPARE_AT = "late-ft", 4, 30, 150


def node_args(i: int, library: Path, nccl: Path | None = None) -> list[str]:
    args = ["--simulate", "8xH100-SXM", "--seed", str(i), "--node-name", f"node-{i}"]
    # a 2 s sampling interval halves the four daemons' load on this machine's two cores
    args += ["--interval", "2s", "--rate-window", "10s", "--baselines", str(library)]
    if i < 3:
        args += ["--sim-job", f"{JOB}:0-7:{8 * i}/{JOB_GPUS}"]
        if nccl is not None:  # the job's ranks run in the daemon: a stand-in writes their NCCL dumps
            args += ["--nccl-inspector-dir", str(nccl)]
    else:
        args += ["--sim-job", f"{SINGLE}:0-3", "--sim-fault", f"xid:{XID_GPU}:{XID}@{XID_AT}"]
    if i == 2:
        args += ["--sim-fault", f"slowdown:*=2@{SLOW_START}+{SLOW_FOR}"]
    return args


def prometheus_config(targets: list[str], alertmanager: str, rules: list[str]) -> dict[str, Any]:
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL}s",
            "scrape_timeout": f"{SCRAPE_INTERVAL}s",
            "evaluation_interval": "1s",
        },
        "rule_files": rules,
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [{"job_name": "gpumon", "static_configs": [{"targets": targets}]}],
    }


class LateRank:
    """One rank of LATE_JOB, reporting through the SDK to node 3 from LATE_START on, on that node's idle GPU
    LATE_GPU: every counter of it is born while both engines run."""

    def __init__(self, url: str, start_at: float) -> None:
        self.url, self.start_at = url, start_at
        self.stopping = threading.Event()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        if self.stopping.wait(max(0.0, self.start_at - time.monotonic())):
            return
        reporter = Reporter(
            job=LATE_JOB, rank=0, world_size=1, local_rank=0, device=LATE_GPU, model="llama3-8b",
            dtype="bf16", url=self.url,
        )  # fmt: skip
        self.started.set()
        try:
            while not self.stopping.is_set():
                with reporter.data_wait():  # a little input wait: a badput cause, not an input-bound job
                    time.sleep(0.01)
                with reporter.forward_backward():
                    time.sleep(0.19)
                reporter.step(tokens=2048, samples=1)
        finally:
            reporter.close()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(10)


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
    # without them (outside CI) the Prometheus test still runs; the comparison skips
    victoria = IN_CI or all(shutil.which(b) for b in ("victoria-metrics", "vmalert"))
    if victoria:
        victoria_metrics_binary(), vmalert_binary()
    work = tmp_path_factory.mktemp("stack")
    library = work / "baselines.toml"
    hook = Webhook().start()
    vm_hook = Webhook().start()  # vmalert's notifier: what it sends, as Alertmanager's API receives it
    started: list[Any] = []
    late: LateRank | None = None
    try:
        started_at = time.time()  # every daemon's simulated clock starts after this
        nodes = [_daemon(i, library, work) for i in range(4)]
        started += nodes
        # the simulated ranks report from their daemon's process, under this host's name
        started.append(Writer(work / "nccl", [(socket.gethostname(), n.proc.pid) for n in nodes[:3]]).start())
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
        rules, vm_rules = [], []
        docs = shortened_rules(SHORT, {"GpumonExporterAbsent": ABSENT_FOR})
        every = [g for _, doc in docs for g in doc["groups"]]
        for name, doc in docs:
            (work / name).write_text(yaml.safe_dump(doc, sort_keys=False))
            rules.append(str(work / name))
            # the same shortened rules, as `python -m gpumon.alerting --vmalert` renders them for vmalert
            (work / f"vmalert-{name}").write_text(
                alerting.dump({"groups": alerting.vmalert_groups(doc["groups"], every)})
            )
            vm_rules.append(work / f"vmalert-{name}")
        targets = [n.url.removeprefix("http://") for n in nodes]
        config = prometheus_config(targets, f"127.0.0.1:{am_port}", rules)
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = start_prometheus(work / "prometheus.yml", work)
        started.append(prom)
        t0 = time.monotonic()
        p = Prometheus(prom)
        vm: VictoriaMetrics | None = None
        vmalert: Vmalert | None = None
        if victoria:
            # VictoriaMetrics starts once Prometheus has scraped every node (it needs the moments), so that
            # the two hold nearly the same stretch of history: a rate over a window longer than that history
            # is proportional to its length
            p.wait(f'count(up{{job="gpumon"}}) == {len(nodes)}', 30, "Prometheus's first scrapes")
            phases = scrape_phases(p, SCRAPE_INTERVAL)
            (work / "victoria.yml").write_text(yaml.safe_dump(victoria_scrape_config(config, phases)))
            vm_process = start_victoria_metrics(work / "victoria.yml", work)
            started.append(vm_process)
            vmalert_process = start_vmalert(vm_rules, vm_process.url, work, notifier=vm_hook.url)
            started.append(vmalert_process)
            vm, vmalert = VictoriaMetrics(vm_process), Vmalert(vmalert_process)
        late = LateRank(nodes[3].url, t0 + LATE_START)
        late.thread.start()
        yield {
            "nodes": nodes, "prom": p, "hook": hook, "library": library, "t0": t0, "vm": vm,
            "vmalert": vmalert, "vm_hook": vm_hook, "late": late, "started_at": started_at,
        }  # fmt: skip
        p.close()
        for client in (vm, vmalert):
            if client is not None:
                client.close()
    finally:
        if late is not None:
            late.stop()
        for s in reversed(started):
            s.stop()
        hook.stop()
        vm_hook.stop()


def _daemon(i: int, library: Path, work: Path) -> Daemon:
    (work / "nccl").mkdir(exist_ok=True)
    return start_daemon(*node_args(i, library, work / "nccl"), log_file=work / f"node-{i}.log")


def _starts(alert: dict[str, Any]) -> float:
    """Unix seconds of an Alertmanager alert's startsAt (RFC 3339, nanoseconds and a Z)."""
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", alert["startsAt"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def _since_start(stack: dict[str, Any]) -> float:
    return time.monotonic() - stack["t0"]


def _record_baseline(stack: dict[str, Any]) -> None:
    """`gpumon baseline record` against node 0, as an operator would once the job runs well (once per stack:
    the test that runs first records it)."""
    if stack.get("baseline_recorded"):
        return
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
    stack["baseline_recorded"] = True


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
    recorded = [name for name in alerting.recording_names() if name not in WHILE_STRAGGLING]
    checks += [(f"recording rule {name}", name) for name in recorded]
    for what, expr in checks:
        concrete = dashboards.expand(expr, variables, RATE_INTERVAL)
        if not prom.query(concrete):
            empty.append(f"{what}: {concrete}")
    assert empty == [], f"{len(empty)} of {len(checks)} queries returned no data:\n" + "\n".join(empty)
    assert prom.query(f'job_name:gpumon_training_gpus:count{{job_name="{JOB}"}} == {JOB_GPUS}')
    # against the one-node baseline, 5 % faster per GPU than the job recorded at full size
    (scaling,) = prom.query(f'job_name:gpumon_training_scaling_efficiency:ratio{{job_name="{JOB}"}}')
    assert 0.5 < float(scaling["value"][1]) < 0.975, scaling  # the 24-GPU baseline would give 1.0

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
    # no regression alert began before the regression did, however late this test got here
    slowed = stack["started_at"] + SLOW_START
    early = [a for a in hook.alerts() if a["labels"]["alertname"] == REGRESSION and _starts(a) < slowed]
    assert early == [], f"the regression alert started before the slowdown at {slowed:.0f}: {early}"
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


# ---- VictoriaMetrics and vmalert against Prometheus -------------------------------------------------------
# VictoriaMetrics scrapes each daemon at the moment Prometheus does, so both hold the same samples; what may
# differ is how they compute and what vmalert has recorded by then. Each check is of one kind, with its own
# tolerance (relative, or absolute for values near 0):
# - raw: a query of scraped series alone, at the same time T on both;
# - rate: a dashboard rate()/increase() over $__rate_interval. MetricsQL starts from the last sample before
#   the window, one scrape interval more than Prometheus reads, so Prometheus's side is evaluated over the
#   window widened by one scrape interval. Even so Prometheus extrapolates a counter that is 0 at the start
#   of that window only from its first sample: up to one scrape interval of the widened window less;
# - rule: a recording rule's expression on scraped series, the vmalert variant's on VictoriaMetrics, at T;
# - recorded: a recorded series, or a query reading one, at T on VictoriaMetrics and at one moment of the
#   LAG_PER_LEVEL seconds per level of rule chain before T on Prometheus: vmalert's results reach
#   VictoriaMetrics through remote write, and VictoriaMetrics 1.79 makes a new series searchable only up to
#   ~10 s after it arrives, at every level;
# - history: a recorded series averaged over its own recorded history ([1h], [7d]) while that history is
#   shorter than the window: each engine averages what it has recorded, and vmalert's record starts later.
TOLERANCE = {
    "raw": 0.05,
    "rate": SCRAPE_INTERVAL / (int(RATE_INTERVAL.removesuffix("s")) + SCRAPE_INTERVAL) + 0.01,
    "rule": 0.05,
    "recorded": 0.05,
    "history": 0.10,
}
ABS_TOLERANCE = 1e-4  # a straggler score of 5e-6 against 0
LAG_PER_LEVEL = 12


@dataclasses.dataclass(frozen=True)
class Check:
    what: str
    kind: str  # raw, rate, rule, recorded, history
    vm_expr: str
    prom_expr: str
    lags: tuple[int, ...] = (0,)
    absolute: float = ABS_TOLERANCE
    skip: tuple[tuple[str, str], ...] = ()  # (label, value): series not compared


def _identifiers(expr: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))


def _rule_levels(groups: list[dict[str, Any]]) -> tuple[dict[str, int], set[str]]:
    """Each recorded series' level (1: computed from scraped series alone; n: from one of level n - 1) and the
    recorded series computed from a recorded series' own history (a range over it), or from such a series."""
    rules = {r["record"]: str(r["expr"]) for r in alerting.all_rules(groups) if "record" in r}
    levels: dict[str, int] = {}
    history: set[str] = set()

    def level(name: str, seen: frozenset[str]) -> int:
        if name not in levels:
            reads = (_identifiers(rules[name]) & set(rules)) - seen - {name}  # a rule may read its own past
            levels[name] = 1 + max((level(r, seen | {name}) for r in reads), default=0)
            ranged = {
                m.group(1) for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\[", rules[name])
            }
            if ranged & set(rules) or reads & history:
                history.add(name)
        return levels[name]

    for name in rules:
        level(name, frozenset())
    return levels, history


def _checks(groups: list[dict[str, Any]]) -> list[Check]:
    levels, history = _rule_levels(groups)
    variables = {v: "$__all" for v in ("job", "node", "instance", "job_name", "gpu")}
    wider = f"{int(RATE_INTERVAL.removesuffix('s')) + SCRAPE_INTERVAL}s"
    queries = [(f"{q.dashboard}: {q.panel} [{q.ref_id}]", q.expr) for q in dashboards.queries()]
    queries += [(f"{q.dashboard}: variable {q.panel}", q.expr) for q in dashboards.variable_queries()]
    queries += [(f"recording rule {name}", name) for name in levels]
    checks = []
    for what, expr in queries:
        concrete = dashboards.expand(expr, variables, RATE_INTERVAL)
        recorded = _identifiers(expr) & set(levels)
        if recorded & history:
            kind = "history"
        elif recorded:
            kind = "recorded"
        elif "$__rate_interval" in expr:
            checks.append(Check(what, "rate", concrete, dashboards.expand(expr, variables, wider)))
            continue
        else:
            kind = "raw"
        lags = tuple(range(0, LAG_PER_LEVEL * max((levels[r] for r in recorded), default=0) + 1))
        # Two requests of one daemon milliseconds apart may straddle an SDK report (see _compare). An age
        # (time() - the last step's time) then moves by up to the report interval; the straggler score,
        # computed per request from the ranks' latest reports, by a few hundredths around 0.
        absolute = ABS_TOLERANCE
        if "time()" in expr:
            absolute = SCRAPE_INTERVAL
        elif "straggler_score" in expr:
            absolute = 0.05
        elif "badput" in expr or "goodput" in expr:
            # the late job's ledger series are born with its start-up seconds at their first report: whether
            # the first sample lies inside the 5-minute window (Prometheus's closed start) or not (MetricsQL's
            # open one) moves its start-up rate by its share of the window, a few thousandths of a second per
            # second (seen: 0.0007 against 0)
            absolute = 0.01
        # JOB's history holds the regression, so a median or mean over it lands anywhere between the two
        # levels depending on where the history starts, which differs by vmalert's start-up: compared on the
        # steady jobs only
        skip = (("job_name", JOB),) if kind == "history" else ()
        checks.append(Check(what, kind, concrete, concrete, lags, absolute, skip))
    # the rules' own expressions on scraped series: what the vmalert variant computes, free of its pipeline
    variant = {
        r["record"]: str(r["expr"])
        for r in alerting.all_rules(alerting.vmalert_groups(groups))
        if "record" in r
    }
    for rule in alerting.all_rules(groups):
        if "record" in rule and levels[rule["record"]] == 1:
            name = rule["record"]
            checks.append(Check(f"rule expression {name}", "rule", variant[name], str(rule["expr"])))
    return checks


def _series(
    result: list[dict[str, Any]], skip: tuple[tuple[str, str], ...] = ()
) -> dict[frozenset[tuple[str, str]], float]:
    return {
        frozenset(r["metric"].items()): float(r["value"][1])
        for r in result
        if not any(r["metric"].get(label) == value for label, value in skip)
    }


def _difference(ours: float | None, theirs: float, absolute: float) -> float:
    """How far apart two answers are, relative to the larger (0: within ``absolute`` of each other)."""
    if ours is None:
        return math.inf
    if math.isnan(ours) or math.isnan(theirs):
        return 0.0 if math.isnan(ours) and math.isnan(theirs) else math.inf
    if abs(ours - theirs) <= absolute:
        return 0.0
    return abs(ours - theirs) / max(abs(ours), abs(theirs))


def _compare(prom: Prometheus, vm: VictoriaMetrics, check: Check, at: float) -> tuple[float, int, str]:
    """VictoriaMetrics' answer at ``at`` against Prometheus's at ``at - lag`` for each allowed lag: the
    smallest worst relative difference, its lag and what differed most there.

    Each of Prometheus's answers is the band of its answers at its scrape before, then and after: the two
    engines request a daemon at the same moment, a few milliseconds apart, and a report or a sample landing
    between the two requests gives one of them the state the other sees at its next scrape."""
    theirs = _series(vm.query(check.vm_expr, at), check.skip)
    best: tuple[float, int, str] = (math.inf, 0, "")
    for lag in check.lags:
        answers = [
            _series(prom.query(check.prom_expr, at - lag + step * SCRAPE_INTERVAL), check.skip)
            for step in (0, -1, 1)
        ]
        if set(theirs) not in [set(a) for a in answers]:
            only = [dict(k) for k in set(answers[0]) ^ set(theirs)][:3]
            found = (math.inf, lag, f"label sets differ: {len(answers[0])} vs {len(theirs)}, e.g. {only}")
        else:
            found = (0.0, lag, "")
            for key, value in theirs.items():
                band = [a[key] for a in answers if key in a]
                inside = bool(band) and min(band) <= value <= max(band)
                d = 0.0 if inside else min(_difference(b, value, check.absolute) for b in band)
                if d > found[0] or not found[2]:
                    found = (d, lag, f"{dict(key)}: {answers[0].get(key)} (band {band}) vs {value}")
        if found[0] < best[0] or not best[2]:
            best = found
        if best[0] == 0.0:
            break
    return best


def _firing(alerts: list[dict[str, Any]]) -> set[frozenset[tuple[str, str]]]:
    return {frozenset(a["labels"].items()) for a in alerts if a["state"] == "firing"}


def test_victoriametrics_and_vmalert_answer_as_prometheus(stack) -> None:
    """Every dashboard query and recording rule on VictoriaMetrics with the vmalert variant of the rules, as
    on Prometheus, within the TOLERANCE of its kind, counters born mid-window included (LATE_JOB's); and the
    alerts in the same state."""
    prom: Prometheus = stack["prom"]
    vm: VictoriaMetrics | None = stack["vm"]
    vmalert: Vmalert | None = stack["vmalert"]
    if vm is None or vmalert is None:  # not installed: skips (the fixture ran without them outside CI)
        victoria_metrics_binary(), vmalert_binary()
        pytest.skip("victoria-metrics and vmalert are not installed")
    _record_baseline(stack)
    time.sleep(max(0.0, COMPARE_AT - _since_start(stack)))
    assert stack["late"].started.is_set(), "the late rank never started"
    assert vmalert.rule_health() == []
    # the same history: VictoriaMetrics started once Prometheus had scraped, at the same moments since
    first = {}
    for name, engine in (("prometheus", prom), ("victoria-metrics", vm)):
        first[name] = min(
            float(s["values"][0][0]) for s in engine.query(f'up{{job="gpumon"}}[{COMPARE_AT + 60}s]')
        )
    assert first["victoria-metrics"] - first["prometheus"] < 3 * SCRAPE_INTERVAL, first

    # every scrape up to one interval after T is in, and past VictoriaMetrics' -search.latencyOffset
    at = time.time() - 2 - SCRAPE_INTERVAL
    checks = _checks(alerting.load_rules())
    assert {c.kind for c in checks} == set(TOLERANCE)
    failures, worst = [], {}
    for check in checks:
        difference, lag, detail = _compare(prom, vm, check, at)
        if not difference <= TOLERANCE[check.kind]:
            failures.append(f"{check.kind} {check.what}: {detail} (lag {lag} s)\n  {check.vm_expr[-200:]}")
        if difference >= worst.get(check.kind, (-1.0,))[0]:
            worst[check.kind] = (difference, lag, check.what, detail)
    for kind, (difference, lag, what, detail) in sorted(worst.items()):
        print(f"worst {kind}: {difference:.4f} at lag {lag} s: {what}: {detail}")
    assert failures == [], f"{len(failures)} of {len(checks)} checks differ:\n" + "\n".join(failures)

    # the late rank's counters were born inside every rule window: MetricsQL's own rate() would have read them
    # many times faster than Prometheus (the whole rate at once, not the increase over 5 minutes)
    born = f'gpumon_training_goodput_seconds_total{{job_name="{LATE_JOB}"}}[5m]'
    (ours,) = prom.query(f"rate({born})", at)
    (native,) = vm.query(f"rate({born})", at)
    (variant,) = vm.query(alerting.translate_expr(f"rate({born})"), at)
    assert float(native["value"][1]) > 2 * float(ours["value"][1]), (native, ours)
    assert _difference(float(ours["value"][1]), float(variant["value"][1]), 0) <= TOLERANCE["rule"], (
        variant,
        ours,
    )

    # alerts: the same ones firing now (GpumonGpuXidCritical among them), the regression fired and resolved on
    # both, and vmalert notified its Alertmanager endpoint of the XID with the labels Prometheus gives it
    end = time.monotonic() + 20
    while True:
        ours_firing = _firing(prom.client.get("/api/v1/alerts").json()["data"]["alerts"])
        theirs_firing = _firing(vmalert.alerts())
        if ours_firing == theirs_firing or time.monotonic() > end:
            break
        time.sleep(1)
    assert ours_firing == theirs_firing, ours_firing ^ theirs_firing
    (xid,) = [dict(a) for a in ours_firing if dict(a)["alertname"] == "GpumonGpuXidCritical"]
    assert REGRESSION not in {dict(a)["alertname"] for a in ours_firing}, "the regression has not resolved"
    history = f'max_over_time(ALERTS{{alertname="{REGRESSION}", alertstate="firing"}}[{COMPARE_AT}s])'
    assert prom.query(history) and vm.query(history), "the throughput regression fired on one engine only"
    sent = [a for batch in stack["vm_hook"].notifications for a in batch]
    assert any(a["labels"] == xid for a in sent), sent[-3:]
    # and the new job, whose counters MetricsQL's own rate() and increase() would have read as a jump,
    # alerted on neither engine
    late = f'max_over_time(ALERTS{{job_name="{LATE_JOB}", alertstate="firing"}}[{COMPARE_AT}s])'
    assert prom.query(late) == [] and vm.query(late) == [], (prom.query(late), vm.query(late))
