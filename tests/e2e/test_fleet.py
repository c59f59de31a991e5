"""A synchronous training job on three simulated nodes, watched by a real Prometheus and the shipped rules.

On loopback: three `gpumon serve --simulate 8xH100-SXM` daemons (node-0..2) and a Prometheus scraping them
every 2 s with the shipped recording and alerting rules, timers shortened as in test_stack.py. One job of 12
ranks, 4 per node on GPUs 0-3 (ranks 0-3 on node-0, 4-7 on node-1, 8-11 on node-2), each a real
`gpumon.client.Reporter` with device=<its GPU>; one process per node runs that node's ranks as threads
(tests/support/sync_ranks.py). Synchronous data parallelism: each step a rank computes, then waits in its
`communication` phase at a barrier the test serves until every rank has arrived, so a slow node makes every
other rank wait in communication. The test sets each node's compute speed over time:

1. steady: the job's baseline is recorded (and a smaller-scale one, the scaling reference);
2. straggler: node-1's ranks compute 1.4 times longer, the others wait for them;
3. recovery;
4. regression: every rank 1.3 times slower, 30 % behind the baseline;
5. recovery;
6. node-2's process is SIGKILLed; its ranks 8-11 restart 20 s later on node-0's free GPUs 4-7, resuming 60
   steps back from a checkpoint (each process loads for 3 s between its Reporters and its first step).

Beside Prometheus, VictoriaMetrics scrapes the same nodes at the same moments and vmalert evaluates the same
shortened rules as `python -m gpumon.alerting --vmalert` renders them (tests/support/victoria.py); what it
recorded and alerted is read afterwards and held to the same truths (the tests named on_victoria).

The scenario runs once (the module fixture), recording what Prometheus, its alerts and the daemons said and
what the ranks did (their step logs are the truth); each test below checks one part of it. Each phase lasts
as long as its signals take to show (polled, with timeouts), so the whole run takes about four minutes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.fleet import (
    SCRAPE,
    SHORT,
    Barrier,
    Control,
    Job,
    NodeRanks,
    PromApi,
    VictoriaApi,
    busy_by_rank,
    defined_rules,
    median,
    prometheus_config,
    start_nodes,
    write_rules,
)
from support.helpers import IN_CI, Daemon, require_tool, run_gpumon
from support.stack import Process, start_prometheus
from support.victoria import (
    scrape_phases,
    start_victoria_metrics,
    start_vmalert,
    victoria_metrics_binary,
    victoria_scrape_config,
    vmalert_binary,
)

from gpumon.baselines import library as B

pytestmark = pytest.mark.slow  # three daemons, a real Prometheus and 12 ranks for about four minutes

JOB = "fleet-job"
J = f'job_name="{JOB}"'
NODES, PER_NODE = 3, 4
WORLD = NODES * PER_NODE
COMPUTE, COMM = 0.3, 0.06  # seconds per step: compute, and the collective itself
FLOPS_PER_TOKEN = 4.8e10
STRAGGLER, REGRESSION = 1.4, 1.3  # compute time factors
RESUME_BACK, DEAD_FOR = 60, 20.0  # steps redone after the restart; seconds node-2's ranks stay dead
# seconds from a process's Reporters to its first step (loading the checkpoint; minutes on a real job): longer
# than a scrape and an evaluation, so Prometheus sees every start-up, a restart's included
LOAD = 3.0
TOLERANCE = 0.15  # of a ratio against the ranks' own figures
DETECT_WITHIN = 120.0  # seconds from a straggler's onset (or its end) to the rule naming (or dropping) it
# the straggler rules measure busy time over one minute: the phase lasts until that minute holds only the
# straggler (and the scrape and evaluation after it), so the values read at its end are the settled ones
STRAGGLER_MIN = 90.0  # and long enough for GpumonTrainingCommunicationBound to fire without its deferral
REGRESSION_MIN = 45.0  # seconds of the whole job slower (see _regression)
# the verdict on a node holds a change for 10 s and reads a 10 s window: the wording is judged after both
VERDICT_SETTLED = 25.0
KILL_DROP_WITHIN = 15.0 + SCRAPE + 1.0  # the daemon drops a dead rank within 15 s; one scrape, one evaluation
MFU_FLOOR = 0.8  # of the job's MFU before the kill, while the 8 live ranks run
ACCOUNTING = 0.10  # restart + lost_progress against the rank-seconds truly lost
BASELINE_ALERTS = (
    "GpumonTrainingThroughputBelowBaseline",
    "GpumonTrainingMfuBelowBaseline",
    "GpumonTrainingStepTimeRegression",
)
STRAGGLER_RULE = "instance_job_name:gpumon_training_straggler:ratio"
RANK_RULE = "instance_job_name_rank:gpumon_training_busy_step_time_vs_job_median:ratio"
STRAGGLER_ALERT = "GpumonTrainingStragglerNode"
COMMUNICATION_ALERT = "GpumonTrainingCommunicationBound"


@dataclass
class Seen:
    """What one engine held after the scenario: every ALERTS series and straggler record with its sample
    times, and the figures read off it afterwards."""

    alerts: list[tuple[dict[str, str], list[float]]]
    straggler_series: list[tuple[dict[str, str], list[float]]]
    figures: dict[str, Any] = field(default_factory=dict)

    def alerts_in(
        self, start: float, end: float, name: str | None = None, state: str | None = None
    ) -> list[str]:
        """ALERTS series with a sample between start and end, as "name{labels}" (optionally one alert, one
        state)."""
        out = []
        for labels, times in self.alerts:
            if name is not None and labels.get("alertname") != name:
                continue
            if state is not None and labels.get("alertstate") != state:
                continue
            if any(start <= t <= end for t in times):
                out.append(_show(labels))
        return sorted(set(out))


@dataclass
class Run:
    """What the scenario did and saw; times are wall-clock (Prometheus' timestamps)."""

    nodes: list[Daemon]
    prom: PromApi
    job: Job
    work: Path
    started: float  # Prometheus ready
    rules: set[str] = field(default_factory=set)
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    ranks: dict[str, NodeRanks] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)  # every measurement, printed at the end
    straggler_polls: list[tuple[float, list[tuple[dict[str, str], float]]]] = field(default_factory=list)
    straggler_alerts: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[tuple[float, str, str]] = field(default_factory=list)  # node-0's /v1/jobs for the job
    alerts: list[tuple[dict[str, str], list[float]]] = field(default_factory=list)  # every ALERTS series
    straggler_series: list[tuple[dict[str, str], list[float]]] = field(default_factory=list)
    badput_before_kill: dict[tuple[str, str, str], float] = field(default_factory=dict)
    ended: float = 0.0
    # VictoriaMetrics scraping the same nodes and vmalert evaluating the same rules, when they run
    vm: VictoriaApi | None = None
    vm_straggler_alerts: list[dict[str, Any]] = field(default_factory=list)  # vmalert's, with annotations
    victoria: Seen | None = None

    def instance(self, i: int) -> str:
        return self.nodes[i].url.removeprefix("http://")

    def check_alive(self) -> None:
        for p in self.ranks.values():
            if p.name != "node-2" or "kill" not in self.phases:
                p.check_alive()

    def steps(self) -> list[dict[str, Any]]:
        return [s for p in self.ranks.values() for s in p.steps()]

    def alerts_in(
        self, start: float, end: float, name: str | None = None, state: str | None = None
    ) -> list[str]:
        """Prometheus's ALERTS series with a sample between start and end (Seen.alerts_in)."""
        return Seen(self.alerts, []).alerts_in(start, end, name, state)


def _show(labels: dict[str, str]) -> str:
    rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k not in ("alertname", "__name__"))
    return f"{labels.get('alertname', labels.get('__name__', ''))}{{{rest}}}"


def _poll(
    what: str, timeout: float, done: Callable[[], bool], run: Run | None = None, every: float = 1.0
) -> float:
    """Call ``done`` every ``every`` seconds until it returns true; its time, or an AssertionError (what the
    rest of the scenario needs: the job running, the baseline recorded)."""
    found = _observe(timeout, done, run, every)
    if found is None:
        raise AssertionError(f"{what}: not within {timeout:.0f} s")
    return found


def _observe(
    timeout: float, done: Callable[[], bool], run: Run | None = None, every: float = 1.0
) -> float | None:
    """As _poll, but None after ``timeout``: for what a test checks, so the scenario goes on without it."""
    end = time.monotonic() + timeout
    while True:
        if run is not None:
            run.check_alive()
        if done():
            return time.time()
        if time.monotonic() > end:
            return None
        time.sleep(every)


def _hold(r: Run, seconds: float) -> None:
    """Let the scenario run ``seconds`` as it is (a phase's length, not a wait for a condition), checking
    that the ranks are alive."""
    until = time.time() + seconds
    _poll("holding", seconds + 10, lambda: time.time() >= until, r)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[Run]:
    require_tool("prometheus")  # before anything starts: in CI its absence fails the test
    # without them (outside CI) the Prometheus run still goes; the VictoriaMetrics tests skip
    victoria = IN_CI or all(shutil.which(b) for b in ("victoria-metrics", "vmalert"))
    if victoria:
        victoria_metrics_binary(), vmalert_binary()
    work = tmp_path_factory.mktemp("fleet")
    library = work / "baselines.toml"
    (work / "checkpoints").mkdir()
    nodes: list[Daemon] = []
    prom: Process | None = None
    job = Job(
        JOB, WORLD, COMPUTE, COMM, FLOPS_PER_TOKEN, Barrier(), Control(work / "control.json"), work,
        work / "checkpoints", LOAD,
    )  # fmt: skip
    api: PromApi | None = None
    vm: VictoriaApi | None = None
    engines: list[Process] = []  # VictoriaMetrics and vmalert
    began = time.monotonic()
    try:
        nodes = start_nodes(NODES, library, work)
        rules, vmalert_rules = write_rules(work)
        targets = [n.url.removeprefix("http://") for n in nodes]
        config = prometheus_config(targets, rules)
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = start_prometheus(work / "prometheus.yml", work)
        api = PromApi(prom)
        if victoria:
            # scraping each node at the moment Prometheus does (support/victoria.py), so that both engines
            # hold the same samples
            api.wait(f'count(up{{job="gpumon"}}) == {NODES}', 30, "Prometheus's first scrapes")
            phases = scrape_phases(api, SCRAPE)
            (work / "victoria.yml").write_text(yaml.safe_dump(victoria_scrape_config(config, phases)))
            engines.append(start_victoria_metrics(work / "victoria.yml", work))
            engines.append(start_vmalert(vmalert_rules, engines[0].url, work))
            vm = VictoriaApi(engines[0], engines[1])
        r = Run(nodes, api, job, work, time.time(), rules=defined_rules(), vm=vm)
        _scenario(r, library)
        r.figures["runtime_s"] = round(time.monotonic() - began, 1)
        # for a run under -q, whose output is captured: every figure, beside the logs of the run
        (work / "figures.json").write_text(json.dumps(r.figures, default=str, indent=1))
        _print(r)
        yield r
    finally:
        job.stop()
        for client in (api, vm):
            if client is not None:
                client.close()
        for e in reversed(engines):
            e.stop()
        if prom is not None:
            prom.stop()
        for n in reversed(nodes):
            n.stop()


def _print(r: Run) -> None:
    print("\nfleet figures:")
    for k, v in r.figures.items():
        print(f"  {k}: {v}")
    print("  phases (s after Prometheus was ready):")
    for name, (a, b) in r.phases.items():
        print(f"    {name}: {a - r.started:.1f} .. {b - r.started:.1f}")
    for engine, alerts in (("Prometheus", r.alerts), ("vmalert", r.victoria.alerts if r.victoria else [])):
        print(f"  alerts seen on {engine}:")
        for labels, times in alerts:
            print(f"    {_show(labels)} {min(times) - r.started:.1f} .. {max(times) - r.started:.1f}")


def _scenario(r: Run, library: Path) -> None:
    for i in range(NODES):
        ranks = {PER_NODE * i + k: k for k in range(PER_NODE)}
        r.ranks[f"node-{i}"] = r.job.start(f"node-{i}", f"node-{i}", r.nodes[i].url, ranks)
    _steady(r, library)
    _straggler(r)
    _recovery_from_straggler(r)
    _regression(r)
    _recovery_from_regression(r)
    _kill_and_restart(r)
    r.ended = time.time()
    r.alerts = r.prom.samples("ALERTS", r.started, r.ended)
    r.straggler_series = r.prom.samples(f"{STRAGGLER_RULE}{{{J}}}", r.started, r.ended)
    onset, _ = r.phases["straggler"]
    r.figures["communication_bound_s"] = {
        labels["alertstate"]: [round(min(times) - onset, 1), round(max(times) - onset, 1)]
        for labels, times in r.alerts
        if labels.get("alertname") == COMMUNICATION_ALERT
    }
    if r.vm is not None:
        r.victoria = _afterwards(r, r.vm)
        r.figures["victoria"] = r.victoria.figures


# ---- 1. steady ---------------------------------------------------------------------------------------------


def _steady(r: Run, library: Path) -> None:
    start = time.time()
    r.figures["gpus_12_at_s"] = round(
        _poll("12 GPUs", 60, lambda: r.prom.scalar(f"job_name:gpumon_training_gpus:count{{{J}}}") == WORLD, r)
        - start,
        1,
    )
    _record_baseline(r, library)
    _poll(
        "the baseline ratio",
        30,
        lambda: bool(r.prom.query(f"job_name:gpumon_training_throughput_baseline:ratio{{{J}}}")),
        r,
    )
    # three for: periods with the baseline in place: a steady job raises nothing against it
    _hold(r, 3 * SHORT)
    r.figures["throughput_baseline_ratio_steady"] = r.prom.scalar(
        f"job_name:gpumon_training_throughput_baseline:ratio{{{J}}}"
    )
    r.figures["scaling_efficiency_steady"] = r.prom.scalar(
        f"job_name:gpumon_training_scaling_efficiency:ratio{{{J}}}"
    )
    r.figures["rule_errors"] = r.prom.rule_health()
    node1 = r.instance(1)
    r.figures["node1_scrape_samples"] = r.prom.scalar(f'scrape_samples_scraped{{instance="{node1}"}}')
    text = r.nodes[1].get("/metrics").text
    r.figures["node1_metrics_series"] = sum(
        1 for line in text.splitlines() if line and not line.startswith("#")
    )
    r.phases["steady"] = (start, time.time())


def _record_baseline(r: Run, library: Path) -> None:
    """`gpumon baseline record` against node-0, as test_stack.py does; then, as an operator who once ran the
    workload on one node, its 4-GPU baseline 5 % faster per GPU: the scaling reference."""
    end = time.monotonic() + 90
    while True:
        r.check_alive()
        out = run_gpumon(
            "baseline", "--baselines", str(library), "record", "--job", JOB, "--window", "60s", "--warmup",
            "0s", "--url", r.nodes[0].url,
        )  # fmt: skip
        if out.returncode == 0:
            break
        assert "steady interval" in out.stderr or "no history" in out.stderr, out.stderr
        assert time.monotonic() < end, out.stderr
        time.sleep(2)
    with B.editing(str(library)) as box:
        (full,) = box[0].baselines
        assert full.key.gpus == WORLD, full.key
        per_gpu = (full.figures.tokens_per_second_per_gpu or 0.0) * 1.05
        node = dataclasses.replace(
            full,
            name=f"{JOB}-one-node",
            key=dataclasses.replace(full.key, gpus=PER_NODE),
            figures=dataclasses.replace(full.figures, tokens_per_second_per_gpu=per_gpu),
            source="edited by hand",
        )
        box[0], _ = box[0].put(node)
    r.figures["baseline"] = dataclasses.asdict(full.figures)


# ---- 2. straggler ------------------------------------------------------------------------------------------


def _straggler(r: Run) -> None:
    onset = time.time()
    r.job.control.set(node_1=STRAGGLER)
    rule_defined = STRAGGLER_RULE in r.rules
    first_seen: float | None = None
    fired: float | None = None
    last_verdict = 0.0
    while True:
        r.check_alive()
        now = time.time()
        found = [(s["metric"], float(s["value"][1])) for s in r.prom.query(f"{STRAGGLER_RULE}{{{J}}}")]
        r.straggler_polls.append((now, found))
        if first_seen is None and any(m.get("instance") == r.instance(1) for m, _ in found):
            first_seen = now
        for a in r.prom.alerts():
            if a["labels"].get("alertname") == STRAGGLER_ALERT:
                r.straggler_alerts.append({**a, "seen": now})
                if a["state"] == "firing" and fired is None:
                    fired = now
        if r.vm is not None:
            alerts = r.vm.alerts()
            r.vm_straggler_alerts += [
                {**a, "seen": now} for a in alerts if a["labels"].get("alertname") == STRAGGLER_ALERT
            ]
        if now - last_verdict >= 2:
            last_verdict = now
            for j in r.nodes[0].get("/v1/jobs").json()["jobs"]:
                if j["job"] == JOB:
                    r.verdicts.append((now, j["bottleneck"], j["summary"]))
        settled = now - onset >= STRAGGLER_MIN and fired is not None and (first_seen or not rule_defined)
        if settled or now - onset > DETECT_WITHIN + 10:
            break
        time.sleep(1.0)
    end = time.time()
    r.figures["straggler_rule_delay_s"] = None if first_seen is None else round(first_seen - onset, 1)
    r.figures["straggler_alert_firing_delay_s"] = None if fired is None else round(fired - onset, 1)
    # the settled values, against what the ranks did over the rules' one-minute window
    r.figures["straggler_final"] = [
        (s["metric"], float(s["value"][1])) for s in r.prom.query(f"{STRAGGLER_RULE}{{{J}}}")
    ]
    r.figures["rank_ratio_final"] = {
        int(s["metric"]["rank"]): float(s["value"][1]) for s in r.prom.query(f"{RANK_RULE}{{{J}}}")
    }
    busy = busy_by_rank(r.steps(), end - 60, end)
    mid = median(list(busy.values()))
    r.figures["rank_ratio_truth"] = {rank: round(b / mid, 3) for rank, b in sorted(busy.items())}
    by_node = [sum(busy[PER_NODE * i + k] for k in range(PER_NODE)) / PER_NODE for i in range(NODES)]
    r.figures["node_ratio_truth"] = round(by_node[1] / median(by_node), 3)
    r.figures["node0_communication_share"] = r.prom.scalar(
        "avg(rate(gpumon_training_phase_seconds_total"
        f'{{{J},instance="{r.instance(0)}",phase="communication"}}[1m]))'
    )
    r.phases["straggler"] = (onset, end)


def _recovery_from_straggler(r: Run) -> None:
    start = time.time()
    r.job.control.set()
    gone: list[float] = []
    resolved: list[float] = []

    def clear() -> bool:
        now = time.time()
        if not gone and not r.prom.query(f"{STRAGGLER_RULE}{{{J}}}"):
            gone.append(now)
        active = [a for a in r.prom.alerts() if a["labels"].get("job_name") == JOB]
        if not resolved and not [a for a in active if a["labels"]["alertname"] == STRAGGLER_ALERT]:
            resolved.append(now)
        return bool(gone and resolved and not [a for a in active if a["state"] == "firing"])

    _observe(DETECT_WITHIN + 30, clear, r)
    r.figures["straggler_rule_gone_after_recovery_s"] = round(gone[0] - start, 1) if gone else None
    r.figures["straggler_alert_resolved_after_recovery_s"] = (
        round(resolved[0] - start, 1) if resolved else None
    )
    r.phases["recovery-1"] = (start, time.time())


# ---- 4. regression -----------------------------------------------------------------------------------------


def _firing(r: Run, name: str) -> list[dict[str, Any]]:
    return [
        a
        for a in r.prom.alerts()
        if a["labels"].get("alertname") == name
        and a["labels"].get("job_name") == JOB
        and a["state"] == "firing"
    ]


def _regression(r: Run) -> None:
    start = time.time()
    r.job.control.set(**{f"node_{i}": REGRESSION for i in range(NODES)})
    fired = _observe(90, lambda: bool(_firing(r, BASELINE_ALERTS[0])), r)
    r.figures["regression_alert_delay_s"] = None if fired is None else round(fired - start, 1)
    r.figures["regression_throughput_ratio"] = r.prom.scalar(
        f"job_name:gpumon_training_throughput_baseline:ratio{{{J}}}"
    )
    # long enough that the busy-time rules' minute is mostly the slowdown: a rule that took a whole job's
    # slowdown for a straggler would have named one by the time the job recovers
    _hold(r, start + REGRESSION_MIN - time.time())
    r.phases["regression"] = (start, time.time())


def _recovery_from_regression(r: Run) -> None:
    start = time.time()
    r.job.control.set()

    def quiet() -> bool:
        return not [
            a
            for a in r.prom.alerts()
            if a["labels"].get("job_name") == JOB and a["labels"]["alertname"] in BASELINE_ALERTS
        ]

    resolved = _observe(90, quiet, r)
    r.figures["regression_resolved_after_recovery_s"] = (
        None if resolved is None else round(resolved - start, 1)
    )
    # a daemon window (10 s) wholly at full speed since, so the MFU before the kill is the steady one
    full = time.time() + 12
    _observe(30, lambda: time.time() >= full and quiet(), r)
    r.phases["recovery-2"] = (start, time.time())


# ---- 6. kill and restart -----------------------------------------------------------------------------------


def _kill_and_restart(r: Run) -> None:
    mfu = f"job_name:gpumon_training_mfu:ratio{{{J}}}"
    gpus = f"job_name:gpumon_training_gpus:count{{{J}}}"
    before = time.time()
    pre = [v for _, points in r.prom.values(mfu, before - 8, before) for _, v in points]
    assert pre, "no job MFU before the kill"
    r.figures["mfu_before_kill"] = round(sum(pre) / len(pre), 4)
    r.badput_before_kill = _badput(r, before)
    killed = time.time()
    r.phases["kill"] = (killed, killed)
    r.ranks["node-2"].kill()
    dropped = _observe(60, lambda: r.prom.scalar(gpus) == WORLD - PER_NODE, r, every=0.5)
    r.figures["kill_to_gpu_drop_live_s"] = None if dropped is None else round(dropped - killed, 1)
    # the dead ranks stay dead a while; then the scheduler restarts them on node-0's free GPUs 4-7, from the
    # checkpoint RESUME_BACK steps before the furthest step they reached
    _hold(r, killed + DEAD_FOR - time.time())
    high: dict[int, int] = {}
    for s in r.ranks["node-2"].steps():
        high[s["rank"]] = max(high.get(s["rank"], 0), s["step"])
    resumed = max(high.values()) - RESUME_BACK
    restarted = time.time()
    r.ranks["node-0-restarted"] = r.job.start(
        "node-0-restarted",
        "node-0",
        r.nodes[0].url,
        {8 + k: 4 + k for k in range(PER_NODE)},
        resumed_step=resumed,
    )
    back = _observe(60, lambda: r.prom.scalar(gpus) == WORLD, r, every=0.5)
    r.figures["restart_to_gpus_12_s"] = None if back is None else round(back - restarted, 1)
    r.phases["dead"] = (killed, restarted)

    def redone() -> bool:
        done: dict[int, int] = {}
        for s in r.ranks["node-0-restarted"].steps():
            done[s["rank"]] = max(done.get(s["rank"], 0), s["step"])
        return all(done.get(rank, 0) >= h for rank, h in high.items())

    _poll("the redone steps", RESUME_BACK * COMPUTE * 3 + 30, redone, r)
    # the truth: per rank, from its furthest step before the kill to the same step again
    old = {(s["rank"], s["step"]): s["t"] for s in r.ranks["node-2"].steps()}
    new = {(s["rank"], s["step"]): s["t"] for s in r.ranks["node-0-restarted"].steps()}
    truth = sum(new[(rank, h)] - old[(rank, h)] for rank, h in high.items())
    r.figures["restart_truth_rank_s"] = round(truth, 1)
    r.figures["restart_high_steps"] = high
    r.figures["restart_resumed_step"] = resumed

    # the ledger books the redone steps as they are reported, and a carried gap a couple of scrapes after the
    # rank's series first show: poll until the figure reaches the truth, or for eight scrapes
    redone_at = time.time()

    def accounted() -> bool:
        now = time.time()
        delta = _delta(r.badput_before_kill, _badput(r, now))
        lost = delta.get("restart", 0.0) + delta.get("lost_progress", 0.0)
        r.figures["badput_delta"] = {k: round(v, 1) for k, v in delta.items()}
        r.figures["restart_accounted_rank_s"] = round(lost, 1)
        return abs(lost - truth) <= ACCOUNTING * truth or now - redone_at > 8 * SCRAPE

    _observe(8 * SCRAPE + 10, accounted, r)
    end = time.time()
    window = math.ceil(end - before) + 5
    r.figures["badput_increase"] = {
        s["metric"].get("cause", ""): round(float(s["value"][1]), 1)
        for s in r.prom.query(
            f"sum by (cause) (increase(gpumon_training_badput_seconds_total{{{J}}}[{window}s]))", at=end
        )
    }
    drop = [t for _, series in r.prom.values(gpus, killed, end) for t, v in series if v <= WORLD - PER_NODE]
    r.figures["kill_to_gpu_drop_s"] = round(min(drop) - killed, 1) if drop else None
    live = [v for _, series in r.prom.values(mfu, killed, restarted) for _, v in series]
    r.figures["mfu_min_while_8_ranks"] = round(min(live), 4) if live else None
    # how close the baseline alerts came to pending while the ranks moved: each ratio's worst value, when
    # (seconds after the restart) and the job's GPUs and tokens/s then
    for name, pick in (("throughput", min), ("mfu", min), ("step_time", max)):
        points = [
            p
            for _, series in r.prom.values(
                f"job_name:gpumon_training_{name}_baseline:ratio{{{J}}}", killed, end
            )
            for p in series
        ]
        if not points:
            r.figures[f"{name}_baseline_ratio_{pick.__name__}_after_kill"] = None
            continue
        t, v = pick(points, key=lambda p: p[1])
        at = {
            what: r.prom.scalar(f"job_name:gpumon_training_{what}{{{J}}}", at=t)
            for what in ("gpus:count", "tokens_per_second:sum")
        }
        r.figures[f"{name}_baseline_ratio_{pick.__name__}_after_kill"] = (
            round(v, 3),
            f"{t - restarted:+.1f} s from the restart",
            at,
        )
    r.phases["restarted"] = (restarted, end)


def _badput(r: Run, at: float, api: PromApi | None = None) -> dict[tuple[str, str, str], float]:
    """Every badput counter of the job at ``at`` (on Prometheus, or ``api``): (instance, rank, cause) ->
    seconds."""
    result = (api or r.prom).query(
        f"max by (instance, rank, cause) (gpumon_training_badput_seconds_total{{{J}}})", at=at
    )
    return {
        (s["metric"]["instance"], s["metric"]["rank"], s["metric"]["cause"]): float(s["value"][1])
        for s in result
    }


def _delta(
    before: dict[tuple[str, str, str], float], after: dict[tuple[str, str, str], float]
) -> dict[str, float]:
    """Growth per cause over every node and rank; a series born in between (a rank restarted on another node)
    counts from 0, which increase() cannot do for it."""
    out: dict[str, float] = {}
    for key, value in after.items():
        out[key[2]] = out.get(key[2], 0.0) + value - before.get(key, 0.0)
    return out


# ---- afterwards: the second engine ------------------------------------------------------------------------


def _afterwards(r: Run, api: PromApi) -> Seen:
    """What an engine recorded over the scenario, read once it ended: the alert and straggler timelines and
    the figures the live polls took on Prometheus, at the same moments."""
    seen = Seen(
        api.samples("ALERTS", r.started, r.ended),
        api.samples(f"{STRAGGLER_RULE}{{{J}}}", r.started, r.ended),
    )
    f = seen.figures
    f["rule_errors"] = api.rule_health()
    onset, end = r.phases["straggler"]
    named = [min(t for t in times if t >= onset) for m, times in seen.straggler_series if max(times) >= onset]
    f["straggler_rule_delay_s"] = round(min(named) - onset, 1) if named else None
    f["straggler_final"] = [
        (x["metric"], float(x["value"][1])) for x in api.query(f"{STRAGGLER_RULE}{{{J}}}", end)
    ]
    firing = [
        (labels, t)
        for labels, times in seen.alerts
        if labels.get("alertname") == STRAGGLER_ALERT and labels.get("alertstate") == "firing"
        for t in times
        if t >= onset
    ]
    f["straggler_alert_firing_delay_s"] = round(min(t for _, t in firing) - onset, 1) if firing else None
    f["straggler_alert_labels"] = sorted({(m.get("instance", ""), m.get("node", "")) for m, _ in firing})
    recovered, _ = r.phases["recovery-1"]
    regressed, _ = r.phases["regression"]  # what comes later is a new question (the kill's)
    last = [t for _, times in seen.straggler_series for t in times if recovered <= t < regressed]
    f["straggler_rule_gone_after_recovery_s"] = round(max(last) - recovered, 1) if last else 0.0
    last_alert = [  # pending or firing
        t
        for labels, times in seen.alerts
        if labels.get("alertname") == STRAGGLER_ALERT
        for t in times
        if recovered <= t < regressed
    ]
    f["straggler_alert_resolved_after_recovery_s"] = (
        round(max(last_alert) - recovered, 1) if last_alert else 0.0
    )
    gpus = f"job_name:gpumon_training_gpus:count{{{J}}}"
    killed, _ = r.phases["kill"]
    restarted, done = r.phases["restarted"]
    drop = [t for _, series in api.values(gpus, killed, done) for t, v in series if v <= WORLD - PER_NODE]
    f["kill_to_gpu_drop_s"] = round(min(drop) - killed, 1) if drop else None
    mfu = f"job_name:gpumon_training_mfu:ratio{{{J}}}"
    pre = [v for _, points in api.values(mfu, killed - 8, killed) for _, v in points]
    live = [v for _, series in api.values(mfu, killed, restarted) for _, v in series]
    f["mfu_before_kill"] = round(sum(pre) / len(pre), 4) if pre else None
    f["mfu_min_while_8_ranks"] = round(min(live), 4) if live else None
    delta = _delta(_badput(r, killed, api), _badput(r, done, api))
    f["badput_delta"] = {k: round(v, 1) for k, v in delta.items()}
    f["restart_accounted_rank_s"] = round(delta.get("restart", 0.0) + delta.get("lost_progress", 0.0), 1)
    return seen


# ---- the tests ---------------------------------------------------------------------------------------------


def test_a_steady_job_counts_its_gpus_and_raises_nothing(run: Run) -> None:
    start, end = run.phases["steady"]
    assert run.figures["rule_errors"] == []
    counts = [
        v
        for _, pts in run.prom.values(f"job_name:gpumon_training_gpus:count{{{J}}}", start, end)
        for _, v in pts
    ]
    reached = counts.index(WORLD)
    assert set(counts[reached:]) == {WORLD}, counts
    assert run.alerts_in(run.started, end, state="firing") == []
    # the baseline is this run's, and the one-node baseline a smaller-scale reference 5 % faster per GPU
    assert 0.9 < run.figures["throughput_baseline_ratio_steady"] < 1.1, run.figures
    assert 0.85 < run.figures["scaling_efficiency_steady"] < 0.99, run.figures
    assert not [m for m, times in run.straggler_series if any(start <= t <= end for t in times)]


def test_the_straggler_node_is_named_with_its_node_and_ratio(run: Run) -> None:
    assert STRAGGLER_RULE in run.rules, f"{STRAGGLER_RULE} is not a recording rule in alerts/"
    delay = run.figures["straggler_rule_delay_s"]
    assert delay is not None and delay <= DETECT_WITHIN, run.figures
    others = {m.get("instance") for _, found in run.straggler_polls for m, _ in found} - {run.instance(1)}
    assert others == set(), f"the straggler rule named other nodes: {others}"
    (final,) = run.figures["straggler_final"]
    labels, value = final
    assert labels.get("node") == "node-1", labels
    truth = run.figures["node_ratio_truth"]
    assert abs(value - truth) <= TOLERANCE * truth, (value, truth)


def test_each_rank_of_the_straggler_node_is_measured_against_the_job_median(run: Run) -> None:
    assert RANK_RULE in run.rules, f"{RANK_RULE} is not a recording rule in alerts/"
    got, truth = run.figures["rank_ratio_final"], run.figures["rank_ratio_truth"]
    assert sorted(got) == list(range(WORLD)), got
    wrong = {
        rank: (got[rank], truth[rank])
        for rank in got
        if abs(got[rank] - truth[rank]) > TOLERANCE * truth[rank]
    }
    assert wrong == {}, f"rank: (rule, truth) off by more than {TOLERANCE:.0%}"
    assert all(truth[rank] > 1.25 for rank in range(4, 8)) and all(
        truth[r] < 1.1 for r in (0, 1, 2, 3, 8, 9, 10, 11)
    )


def test_the_straggler_alert_names_node_ranks_and_ratio(run: Run) -> None:
    firing = [a for a in run.straggler_alerts if a["state"] == "firing"]
    assert firing, f"{STRAGGLER_ALERT} never fired; seen: {run.straggler_alerts}"
    assert {a["labels"].get("instance") for a in firing} == {run.instance(1)}, firing
    assert {a["labels"].get("node") for a in firing} == {"node-1"}, firing
    description = firing[-1]["annotations"].get("description", "")
    assert "node-1" in description and "ranks 4–7" in description, description  # noqa: RUF001 (the alert's en dash)
    # the ratio as the description prints it (1.4, 1.38, 1.41...), near what the ranks did
    truth = run.figures["node_ratio_truth"]
    figures = [float(x) for x in re.findall(r"\d+\.\d+", description)]
    assert [f for f in figures if abs(f - truth) <= TOLERANCE * truth], (description, truth)


def test_the_straggler_clears_after_recovery(run: Run) -> None:
    assert STRAGGLER_RULE in run.rules, f"{STRAGGLER_RULE} is not a recording rule in alerts/"
    # None: not within DETECT_WITHIN and a half minute more
    gone = run.figures["straggler_rule_gone_after_recovery_s"]
    resolved = run.figures["straggler_alert_resolved_after_recovery_s"]
    assert gone is not None and gone <= DETECT_WITHIN, run.figures
    assert resolved is not None and resolved <= DETECT_WITHIN, run.figures


def test_a_whole_job_regression_alerts_against_the_baseline_and_names_no_straggler(run: Run) -> None:
    start, end = run.phases["regression"]
    assert run.figures["regression_throughput_ratio"] < 0.9, run.figures
    assert run.alerts_in(start, end, name=BASELINE_ALERTS[0], state="firing")
    # until the kill: the busy-time rules' minute holds the slowdown well after the job recovered
    killed, _ = run.phases["kill"]
    assert run.alerts_in(start, killed, name=STRAGGLER_ALERT) == []
    assert not [m for m, times in run.straggler_series if any(start <= t <= killed for t in times)]
    resolved = run.figures["regression_resolved_after_recovery_s"]
    assert resolved is not None and resolved <= 60, run.figures


def test_killed_ranks_stop_counting_and_the_job_mfu_holds(run: Run) -> None:
    drop = run.figures["kill_to_gpu_drop_s"]
    assert drop is not None and drop <= KILL_DROP_WITHIN, run.figures
    assert run.figures["mfu_min_while_8_ranks"] >= MFU_FLOOR * run.figures["mfu_before_kill"], run.figures
    back = run.figures["restart_to_gpus_12_s"]
    assert back is not None and back <= 30, run.figures


def test_ranks_moving_to_another_node_raise_no_baseline_alert(run: Run) -> None:
    killed, _ = run.phases["kill"]
    seen = [a for name in BASELINE_ALERTS for a in run.alerts_in(killed, run.ended, name=name)]
    worst = {k: v for k, v in run.figures.items() if k.endswith("_after_kill") and "baseline_ratio" in k}
    assert seen == [], f"{seen}; worst ratios: {worst}"


def test_ranks_moving_to_another_node_name_no_straggler(run: Run) -> None:
    # a node that gained ranks still loading is no slower: it must not look like a straggler meanwhile
    killed, _ = run.phases["kill"]
    seen = [
        a
        for name in (STRAGGLER_ALERT, "GpumonTrainingStragglerRank")
        for a in run.alerts_in(killed, run.ended, name=name)
    ]
    assert seen == [], seen
    assert not [m for m, times in run.straggler_series if any(killed <= t <= run.ended for t in times)]


def test_a_restart_across_nodes_is_accounted_as_restart_and_lost_progress(run: Run) -> None:
    truth = run.figures["restart_truth_rank_s"]
    lost = run.figures["restart_accounted_rank_s"]
    assert abs(lost - truth) <= ACCOUNTING * truth, (lost, truth, run.figures["badput_delta"])


def test_every_alert_with_an_instance_names_its_node(run: Run) -> None:
    unnamed = sorted(
        {_show(labels) for labels, _ in run.alerts if "instance" in labels and "node" not in labels}
    )
    assert unnamed == [], unnamed


def test_the_series_count_of_a_training_node(run: Run) -> None:
    scraped, served = run.figures["node1_scrape_samples"], run.figures["node1_metrics_series"]
    print(f"\nseries of node-1 (4 ranks of one job): {scraped} scraped, {served} on its /metrics")
    assert scraped is not None and scraped > 0
    assert abs(scraped - served) <= 0.05 * served, (scraped, served)


def test_waiting_for_a_straggler_is_not_called_communication_bound(run: Run) -> None:
    # the premise: node-0's ranks spend more than the daemon's communication threshold waiting
    assert run.figures["node0_communication_share"] > 0.30, run.figures
    # it may go pending in the minute before the straggler alert fires (the daemons' verdict settles in
    # seconds, the rules' busy time over a minute); it must never fire (support/fleet.py COMMUNICATION_FOR)
    seen = run.alerts_in(run.started, run.ended, name=COMMUNICATION_ALERT, state="firing")
    timeline = {k: run.figures[k] for k in ("communication_bound_s", "straggler_rule_delay_s")}
    assert seen == [], f"{seen}; seconds after the straggler's onset: {timeline}"
    onset, _ = run.phases["straggler"]
    settled = [
        (bottleneck, summary) for t, bottleneck, summary in run.verdicts if t - onset >= VERDICT_SETTLED
    ]
    assert settled, run.verdicts
    assert not [s for s in settled if "communication-bound" in s[1]], settled
    # the simulated NICs idle while node-0's ranks wait (their collectives move data only for the time
    # they took while the job kept pace): the verdict says so from this node, with the NICs' figures
    assert settled[-1][1].startswith("waiting on peers"), settled[-1]
    assert "of their line rate in them" in settled[-1][1], settled[-1]


# ---- the same on VictoriaMetrics and vmalert ---------------------------------------------------------------


@pytest.fixture
def victoria(run: Run) -> Seen:
    if run.victoria is None:
        pytest.skip("victoria-metrics and vmalert are not installed (apt-get install victoria-metrics)")
    return run.victoria


def test_on_victoria_the_rules_evaluate_and_a_steady_job_raises_nothing(run: Run, victoria: Seen) -> None:
    assert victoria.figures["rule_errors"] == []
    _, end = run.phases["steady"]
    assert victoria.alerts_in(run.started, end, state="firing") == []


def test_on_victoria_the_straggler_node_is_named_and_paged_with_its_node(run: Run, victoria: Seen) -> None:
    f = victoria.figures
    delay = f["straggler_rule_delay_s"]
    assert delay is not None and delay <= DETECT_WITHIN, f
    named = {m.get("instance") for m, _ in victoria.straggler_series}
    assert named == {run.instance(1)}, f"the straggler rule named {named}"
    (final,) = f["straggler_final"]
    labels, value = final
    truth = run.figures["node_ratio_truth"]
    assert labels.get("node") == "node-1" and abs(value - truth) <= TOLERANCE * truth, (final, truth)
    assert f["straggler_alert_firing_delay_s"] is not None, f
    assert f["straggler_alert_labels"] == [(run.instance(1), "node-1")], f
    firing = [a for a in run.vm_straggler_alerts if a["state"] == "firing"]
    assert firing, f"vmalert's {STRAGGLER_ALERT} never fired: {run.vm_straggler_alerts}"
    description = firing[-1]["annotations"].get("description", "")
    assert "node-1" in description and "ranks 4–7" in description, description  # noqa: RUF001 (the alert's en dash)


def test_on_victoria_the_network_is_not_blamed_and_the_straggler_clears(run: Run, victoria: Seen) -> None:
    assert victoria.alerts_in(run.started, run.ended, name=COMMUNICATION_ALERT, state="firing") == []
    f = victoria.figures
    # vmalert has no keep_firing_for (alerting.vmalert_groups drops it): its alert resolves as the rule clears
    assert f["straggler_rule_gone_after_recovery_s"] <= DETECT_WITHIN, f
    assert f["straggler_alert_resolved_after_recovery_s"] <= DETECT_WITHIN, f


def test_on_victoria_a_regression_alerts_and_names_no_straggler(run: Run, victoria: Seen) -> None:
    start, end = run.phases["regression"]
    killed, _ = run.phases["kill"]
    assert victoria.alerts_in(start, end, name=BASELINE_ALERTS[0], state="firing")
    assert victoria.alerts_in(start, killed, name=STRAGGLER_ALERT) == []


def test_on_victoria_killed_ranks_stop_counting_and_moving_raises_nothing(run: Run, victoria: Seen) -> None:
    f = victoria.figures
    assert f["kill_to_gpu_drop_s"] is not None and f["kill_to_gpu_drop_s"] <= KILL_DROP_WITHIN, f
    assert f["mfu_min_while_8_ranks"] >= MFU_FLOOR * f["mfu_before_kill"], f
    killed, _ = run.phases["kill"]
    names = (*BASELINE_ALERTS, STRAGGLER_ALERT, "GpumonTrainingStragglerRank")
    moved = [a for name in names for a in victoria.alerts_in(killed, run.ended, name=name, state="firing")]
    assert moved == [], moved
    # VictoriaMetrics 1.79 makes a new series (a moved rank's) searchable a few seconds after its first
    # samples, so a ratio of an old series to a new one can read wrong for a few evaluations: pending, for
    # up to SHORT seconds in two full-suite runs of three on this 2-core machine (2026-11-28; alone, less),
    # which the shortened for: of this test then reaches, and the shipped for: (minutes) never does
    # (docs/deploy.md, "VictoriaMetrics"). Nothing may fire (above); a pending longer than twice the lag
    # seen is a defect
    pending = {
        _show(labels): round(max(ts) - min(ts), 1)
        for labels, times in victoria.alerts
        if labels.get("alertname") in names
        and labels.get("alertstate") == "pending"
        and (ts := [t for t in times if t >= killed])
    }
    assert all(span <= 2 * SHORT for span in pending.values()), pending


def test_on_victoria_a_restart_across_nodes_is_accounted(run: Run, victoria: Seen) -> None:
    truth = run.figures["restart_truth_rank_s"]
    lost = victoria.figures["restart_accounted_rank_s"]
    assert abs(lost - truth) <= ACCOUNTING * truth, (lost, truth, victoria.figures["badput_delta"])


def test_on_victoria_every_alert_with_an_instance_names_its_node(victoria: Seen) -> None:
    unnamed = sorted(
        {_show(labels) for labels, _ in victoria.alerts if "instance" in labels and "node" not in labels}
    )
    assert unnamed == [], unnamed
