"""The Prometheus rules, their unit tests, the runbooks, the Alertmanager example and the PrometheusRule.

promtool, amtool and Alertmanager run for real (skipped locally without them, failing under CI=true).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.crds import undeclared_fields
from support.helpers import ROOT, require_tool
from support.promtool import run_unit_tests

from gpumon import alerting
from gpumon.metrics import BY_NAME

ALERTS = ROOT / "alerts"
TEST_FILES = sorted((ALERTS / "tests").glob("*.test.yml"))
AM_CONFIG = ALERTS / "alertmanager.yml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
CRD = Path(__file__).resolve().parents[1] / "fixtures" / "prometheus-operator"
CRD_FILE = CRD / "monitoring.coreos.com_prometheusrules.yaml"

# The recording rules the dashboards, the end-to-end test and other users rely on (issue 5's contract).
REQUIRED_RECORDINGS = [
    "job_name:gpumon_training_tokens_per_second:sum",
    "job_name:gpumon_training_gpus:count",
    "job_name:gpumon_training_tokens_per_second_per_gpu:ratio",
    "job_name:gpumon_training_mfu:ratio",
    "job_name:gpumon_training_tokens_per_joule:ratio",
    "job_name:gpumon_training_step_time_seconds:avg",
    "job_name:gpumon_training_step_time_seconds:max",
    "job_name:gpumon_training_phase:ratio",
    "job_name:gpumon_training_throughput_baseline:ratio",
    "job_name:gpumon_training_mfu_baseline:ratio",
    "job_name:gpumon_training_step_time_baseline:ratio",
    "job_name:gpumon_training_tokens_per_joule_baseline:ratio",
    "job_name:gpumon_training_scaling_efficiency:ratio",
    "instance_job_name:gpumon_training_tokens_per_second_per_gpu:ratio",
    "instance_job_name:gpumon_training_throughput_vs_job_median:ratio",
    "instance:gpumon_gpus:count",
    "instance:gpumon_gpus_up:sum",
    "instance:gpumon_gpu_utilization:avg",
    "instance:gpumon_gpu_power_watts:sum",
    "instance:gpumon_gpu_memory_used:ratio",
]
# Names the end-to-end test and the Alertmanager routing depend on.
REQUIRED_ALERTS = {
    "GpumonTrainingThroughputBelowBaseline": "job_name:gpumon_training_throughput_baseline:ratio",
    "GpumonGpuXidCritical": "gpumon_gpu_xid_errors_total",
}


@pytest.fixture(scope="module")
def groups() -> list[dict[str, Any]]:
    return alerting.load_rules()


def run(*cmd: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# ---- promtool -----------------------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    promtool = require_tool("promtool")
    r = run(promtool, "check", "rules", *map(str, alerting.RULE_FILES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(alerting.RULE_FILES), r.stdout


@pytest.mark.slow
def test_promtool_unit_tests_pass() -> None:
    promtool = require_tool("promtool")
    assert len(TEST_FILES) >= 4
    results = run_unit_tests(promtool, TEST_FILES)
    assert [(p.name, rc) for p, rc, _ in results if rc != 0] == [], "\n".join(
        out for _, rc, out in results if rc
    )
    assert all(out.count("SUCCESS") == 1 for _, _, out in results), [out for _, _, out in results]


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """The same unit tests against a rule file with one threshold changed must fail: they test something."""
    promtool = require_tool("promtool")
    (tmp_path / "tests").mkdir()
    text = (ALERTS / "alerting.rules.yml").read_text()
    ratio = "job_name:gpumon_training_throughput_baseline:ratio"
    broken = text.replace(f"{ratio} < 0.9", f"{ratio} < 0.7")
    assert broken != text
    (tmp_path / "alerting.rules.yml").write_text(broken)
    (tmp_path / "recording.rules.yml").write_text((ALERTS / "recording.rules.yml").read_text())
    test_file = ALERTS / "tests" / "training_baseline.test.yml"
    (tmp_path / "tests" / test_file.name).write_text(test_file.read_text())
    r = run(promtool, "test", "rules", str(tmp_path / "tests" / test_file.name))
    assert r.returncode != 0 and "GpumonTrainingThroughputBelowBaseline" in r.stderr, r.stdout + r.stderr


def _unit_tests() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, yaml.safe_load(p.read_text())) for p in TEST_FILES]


def test_unit_test_files_load_the_shipped_rules_in_a_fixed_order(groups: list[dict[str, Any]]) -> None:
    names = [g["name"] for g in groups]
    for path, doc in _unit_tests():
        files = [(path.parent / f).resolve() for f in doc["rule_files"]]
        assert set(files) <= {p.resolve() for p in alerting.RULE_FILES}, path
        loaded = [g["name"] for g in alerting.load_rules(files)]
        # without group_eval_order promtool evaluates groups in random order, and an alert may then read
        # the previous evaluation's recorded series (or none, past the lookback): flaky tests
        assert doc.get("group_eval_order") == [n for n in names if n in loaded], path


def test_every_alert_has_a_firing_and_a_silent_unit_test(groups: list[dict[str, Any]]) -> None:
    fires: dict[str, int] = {}
    silent: dict[str, int] = {}
    for path, doc in _unit_tests():
        for case in doc["tests"]:
            for t in case.get("alert_rule_test", []):
                name = t["alertname"]
                if not t.get("exp_alerts"):
                    silent[name] = silent.get(name, 0) + 1
                    continue
                for exp in t["exp_alerts"]:
                    assert exp.get("exp_labels", {}).get("severity"), (path, name, "exp_labels incomplete")
                    assert set(exp.get("exp_annotations", {})) == {"summary", "description", "runbook_url"}, (
                        path,
                        name,
                    )
                fires[name] = fires.get(name, 0) + 1
    names = {r["alert"] for r in alerting.alert_rules(groups)}
    assert names - set(fires) == set(), "alerts never tested firing"
    assert names - set(silent) == set(), "alerts never tested staying silent"
    assert set(fires) | set(silent) <= names, "tests of alerts that do not exist"


def test_recording_rules_have_unit_tests() -> None:
    tested = " ".join(
        str(t["expr"])
        for _, doc in _unit_tests()
        for case in doc["tests"]
        for t in case.get("promql_expr_test", [])
    )
    for name in (
        "job_name:gpumon_training_scaling_efficiency:ratio",
        "job_name:gpumon_training_tokens_per_second_per_gpu:ratio",
        "instance_job_name:gpumon_training_throughput_vs_job_median:ratio",
        "job_name:gpumon_training_tokens_per_joule:ratio",
        "job_name:gpumon_training_gpus:count",
        "job_name:gpumon_training_mfu:ratio",
        "job_name:gpumon_training_tokens_per_second_per_gpu:median7d",
        "job_name:gpumon_training_bottleneck:ratio",
        "instance_gpu_uuid:gpumon_gpu_nvlink_bytes:rate10m",
    ):
        assert name in tested, name


# ---- the rules themselves -----------------------------------------------------------------------------


def test_required_recording_rules_exist_once(groups: list[dict[str, Any]]) -> None:
    names = alerting.recording_names(groups)
    assert len(names) == len(set(names)), "a series recorded twice"
    assert [n for n in REQUIRED_RECORDINGS if n not in names] == []


def test_recording_rule_names_follow_level_metric_operations(groups: list[dict[str, Any]]) -> None:
    for name in alerting.recording_names(groups):
        level, metric, ops = name.split(":")
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", level) and re.fullmatch(r"[a-z0-9_]+", ops), name
        assert metric.startswith("gpumon_"), name


def _duration_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|[smhdwy])", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(int(n) * units[u] for n, u in parts)


def test_long_ranges_are_only_read_by_slow_groups(groups: list[dict[str, Any]]) -> None:
    """A range of days reads every sample of those days: only groups evaluated every 5 minutes or less often
    may select one; the alerts read what those record (GpumonTrainingThroughputBelowTrailingWeek)."""
    slow = False
    for group in groups:
        interval = _duration_seconds(group["interval"]) if "interval" in group else 0
        for rule in group["rules"]:
            for rng in re.findall(r"\[(\w+)(?::\w*)?\]", rule["expr"]):
                if _duration_seconds(rng) > 6 * 3600:
                    assert interval >= 300, (group["name"], rule.get("record") or rule.get("alert"), rng)
                    slow = True
    assert slow, "the 7-day median is computed somewhere"


def test_required_alerts_exist(groups: list[dict[str, Any]]) -> None:
    by_name = {r["alert"]: r for r in alerting.alert_rules(groups)}
    for name, series in REQUIRED_ALERTS.items():
        assert series in by_name[name]["expr"], name


# PromQL words that are not metric names
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
}
_AGGREGATORS = {
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "count",
    "quantile",
    "topk",
    "bottomk",
    "stddev",
    "stdvar",
}


def metric_names(expr: str) -> set[str]:
    """Series names an expression selects: strings, label matchers, label lists, ranges, function calls
    and numbers removed first."""
    e = re.sub(r'"(?:\\.|[^"\\])*"', "", expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    words = re.findall(r"(?<![\w.])[A-Za-z_:][\w:]*(?![\w:]|\s*\()", e)
    return {w for w in words if w not in _KEYWORDS and w not in _AGGREGATORS}


def test_metric_name_extraction() -> None:
    assert metric_names(
        'sum by (job_name) (rate(gpumon_a_total{x="y z"}[5m])) / on (job_name) group_left () b:c:d > 1e9 '
        "and topk by (i) (1, up offset 1d)"
    ) == {"gpumon_a_total", "b:c:d", "up"}


def test_rules_use_only_known_metrics(groups: list[dict[str, Any]]) -> None:
    # ALERTS: Prometheus's own series of the alerts pending and firing (one alert defers to another)
    known = set(BY_NAME) | {"up", "ALERTS"} | set(alerting.recording_names(groups))
    for m in BY_NAME.values():
        if m.type == "histogram":
            known |= {m.name + s for s in ("_bucket", "_sum", "_count")}
        if m.type == "summary":
            known |= {m.name + s for s in ("_sum", "_count")}
    used: set[str] = set()
    for rule in alerting.all_rules(groups):
        names = metric_names(rule["expr"])
        assert names, rule
        unknown = names - known
        assert not unknown, f"{rule.get('alert') or rule.get('record')} uses unknown series {unknown}"
        used |= names
    assert {"gpumon_gpu_up", "gpumon_training_rank_gpu_info", "up"} <= used


def _runbook_anchors() -> set[str]:
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", RUNBOOKS.read_text(), flags=re.M):
        # GitHub's anchors: lower case, punctuation other than - and _ dropped, spaces to hyphens
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def test_every_alert_is_documented_and_templated(groups: list[dict[str, Any]]) -> None:
    anchors = _runbook_anchors()
    alerts = alerting.alert_rules(groups)
    for rule in alerts:
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        ann = rule["annotations"]
        assert ann["summary"] and "{{" in ann["description"], name
        base, _, anchor = ann["runbook_url"].partition("#")
        assert base == alerting.RUNBOOK_BASE, name
        assert anchor == name.lower() and anchor in anchors, (
            f"{name}: no section #{anchor} in docs/runbooks.md"
        )
    # and no runbook for an alert that no longer exists
    documented = {a for a in anchors if a.startswith("gpumon")}
    assert documented == {r["alert"].lower() for r in alerts}


def test_alerts_use_for_or_fire_on_events_only(groups: list[dict[str, Any]]) -> None:
    """Conditions that can flap wait (`for:`) and linger (`keep_firing_for:`); only event alerts on a
    counter's increase fire at once, and those must linger, or they resolve while someone reads the page."""
    for rule in alerting.alert_rules(groups):
        if "for" not in rule:
            assert "increase(" in rule["expr"] and "keep_firing_for" in rule, rule["alert"]


# ---- with_short_for ----------------------------------------------------------------------------------


def _without_timers(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **g,
            "rules": [
                {k: v for k, v in r.items() if k not in ("for", "keep_firing_for")} for r in g["rules"]
            ],
        }
        for g in groups
    ]


def test_with_short_for_changes_only_the_timers(groups: list[dict[str, Any]]) -> None:
    text = (ALERTS / "alerting.rules.yml").read_text()
    original = yaml.safe_load(text)
    short = yaml.safe_load(alerting.with_short_for(text, 5))
    assert _without_timers(short["groups"]) == _without_timers(original["groups"])
    pairs = [
        (a, b)
        for ga, gb in zip(original["groups"], short["groups"], strict=True)
        for a, b in zip(ga["rules"], gb["rules"], strict=True)
    ]
    for a, b in pairs:
        for key in ("for", "keep_firing_for"):
            assert (key in a) == (key in b) and b.get(key, "5s") == "5s", (b["alert"], key)
    assert any("keep_firing_for" in b for _, b in pairs) and any("for" not in b for _, b in pairs)
    # the other input forms, and the input left alone
    assert alerting.with_short_for(groups, 0.25)[-1]["rules"][0].get("for") == "250ms"
    assert groups == alerting.load_rules()
    assert alerting.with_short_for(original, 5) == short
    with pytest.raises(ValueError):
        alerting.with_short_for(groups, -1)


def test_with_short_for_output_is_a_valid_rule_file(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    for path in alerting.RULE_FILES:
        out = tmp_path / path.name
        out.write_text(alerting.with_short_for(path.read_text(), 2))
    r = run(promtool, "check", "rules", *(str(tmp_path / p.name) for p in alerting.RULE_FILES))
    assert r.returncode == 0, r.stdout + r.stderr


# ---- PrometheusRule -----------------------------------------------------------------------------------


def test_prometheus_rule_is_generated_from_the_rule_files(groups: list[dict[str, Any]]) -> None:
    committed = alerting.PROMETHEUS_RULE.read_text()
    assert committed == alerting.render_prometheus_rule(), "run: python -m gpumon.alerting"
    assert yaml.safe_load(committed)["spec"]["groups"] == groups


def test_check_command_detects_drift(tmp_path: Path) -> None:
    out = tmp_path / "prometheusrule.yaml"
    cmd = [sys.executable, "-m", "gpumon.alerting", "--output", str(out)]
    assert run(*cmd, "--check").returncode == 1  # missing
    assert run(*cmd).returncode == 0
    assert run(*cmd, "--check").returncode == 0
    out.write_text(out.read_text().replace("for: 15m", "for: 20m", 1))
    r = run(*cmd, "--check")
    assert r.returncode == 1 and "out of date" in r.stderr
    assert run(sys.executable, "-m", "gpumon.alerting", "--check").returncode == 0  # the committed one


def _crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def test_prometheus_rule_matches_the_crd_schema() -> None:
    import jsonschema

    schema = _crd_schema()
    manifest = yaml.safe_load(alerting.PROMETHEUS_RULE.read_text())
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1" and manifest["kind"] == "PrometheusRule"
    jsonschema.Draft7Validator(schema).validate(manifest)
    assert list(undeclared_fields(schema, manifest)) == []
    # the checks can fail: a misspelt field and a malformed duration
    bad = json.loads(json.dumps(manifest))
    bad["spec"]["groups"][0]["rules"][0]["keep_firing_fro"] = "5m"
    assert list(undeclared_fields(schema, bad)) == ["$.spec.groups[0].rules[0].keep_firing_fro"]
    bad["spec"]["groups"][-1]["rules"][0]["for"] = "5 minutes"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(bad)


# ---- Alertmanager -------------------------------------------------------------------------------------


def test_alertmanager_config_is_valid() -> None:
    amtool = require_tool("amtool")
    r = run(amtool, "check-config", str(AM_CONFIG))
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["severity=critical", "alertname=GpumonGpuXidCritical", "instance=n1:9478"], "pager,chat"),
        (["severity=critical", "alertname=GpumonTrainingJobStalled", "job_name=llama"], "pager,chat"),
        (["severity=warning", "alertname=GpumonTrainingThroughputBelowBaseline", "job_name=llama"], "chat"),
        (["severity=info", "alertname=Anything"], "blackhole"),
        (["alertname=NoSeverity"], "chat"),
    ],
)
def test_alertmanager_routes(labels: list[str], receivers: str) -> None:
    amtool = require_tool("amtool")
    base = ["config", "routes", "test", f"--config.file={AM_CONFIG}"]
    r = run(amtool, *base, f"--verify.receivers={receivers}", *labels)
    assert r.returncode == 0, r.stdout + r.stderr
    wrong = "blackhole" if receivers != "blackhole" else "pager"
    assert run(amtool, *base, f"--verify.receivers={wrong}", *labels).returncode != 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def alertmanager(tmp_path: Path, config: Path = AM_CONFIG) -> Iterator[str]:
    # Debian names the binary prometheus-alertmanager, upstream alertmanager
    binary = shutil.which("alertmanager") or require_tool("prometheus-alertmanager")
    url = f"http://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={tmp_path}",
            f"--web.listen-address={url.removeprefix('http://')}",
            "--cluster.listen-address=",  # no gossip port: a single instance
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        end = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert proc.poll() is None and time.monotonic() < end, "Alertmanager did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_alertmanager_inhibitions(tmp_path: Path) -> None:
    """Post alerts to a real Alertmanager running the example config and read back which are inhibited."""
    gpumon = {"job": "gpumon"}
    posted = {
        # sources
        "exporter-down-n1": {
            "alertname": "GpumonExporterDown",
            "instance": "n1:9478",
            **gpumon,
            "severity": "warning",
        },
        "node-down-n4": {
            "alertname": "NodeDown",
            "instance": "n4:9478",
            "job": "node",
            "severity": "critical",
        },
        "gpu-down-n2": {
            "alertname": "GpumonGpuDown",
            "instance": "n2:9478",
            **gpumon,
            "gpu": "0",
            "uuid": "GPU-b0",
            "severity": "critical",
        },
        "below-llama": {
            "alertname": "GpumonTrainingThroughputBelowBaseline",
            "job_name": "llama",
            "severity": "warning",
        },
        "absent-eu": {"alertname": "GpumonExporterAbsent", "job": "gpumon-eu", "severity": "critical"},
        "lost-gpt": {"alertname": "GpumonTrainingRanksLost", "job_name": "gpt", "severity": "critical"},
        # targets
        "gpu-down-n1": {
            "alertname": "GpumonGpuDown",
            "instance": "n1:9478",
            **gpumon,
            "gpu": "0",
            "uuid": "GPU-a0",
            "severity": "critical",
        },
        "straggler-n1": {
            "alertname": "GpumonTrainingStragglerNode",
            "instance": "n1:9478",
            "job_name": "llama",
            "severity": "warning",
        },
        "xid-n4": {
            "alertname": "GpumonGpuXidCritical",
            "instance": "n4:9478",
            **gpumon,
            "gpu": "1",
            "uuid": "GPU-d1",
            "xid": "79",
            "severity": "critical",
        },
        "throttled-b0": {
            "alertname": "GpumonGpuThrottled",
            "instance": "n2:9478",
            **gpumon,
            "gpu": "0",
            "uuid": "GPU-b0",
            "reason": "hw_thermal",
            "severity": "warning",
        },
        "mfu-llama": {
            "alertname": "GpumonTrainingMfuBelowBaseline",
            "job_name": "llama",
            "severity": "warning",
        },
        "library-eu": {
            "alertname": "GpumonBaselineLibraryUnreadable",
            "instance": "n5:9478",
            "job": "gpumon-eu",
            "severity": "warning",
        },
        "stalled-gpt": {"alertname": "GpumonTrainingJobStalled", "job_name": "gpt", "severity": "critical"},
        "not-starting-gpt": {
            "alertname": "GpumonTrainingJobNotStarting",
            "job_name": "gpt",
            "severity": "critical",
        },
        # not inhibited
        "throttled-b1": {
            "alertname": "GpumonGpuThrottled",
            "instance": "n2:9478",
            **gpumon,
            "gpu": "1",
            "uuid": "GPU-b1",
            "reason": "hw_thermal",
            "severity": "warning",
        },
        "mfu-other": {
            "alertname": "GpumonTrainingMfuBelowBaseline",
            "job_name": "other",
            "severity": "warning",
        },
        "library-n3": {
            "alertname": "GpumonBaselineLibraryUnreadable",
            "instance": "n3:9478",
            **gpumon,
            "severity": "warning",
        },
        "stalled-llama": {
            "alertname": "GpumonTrainingJobStalled",
            "job_name": "llama",
            "severity": "critical",
        },
    }
    inhibited = {
        "gpu-down-n1",
        "straggler-n1",
        "xid-n4",
        "throttled-b0",
        "mfu-llama",
        "library-eu",
        "stalled-gpt",
        "not-starting-gpt",
    }
    with alertmanager(tmp_path) as url:
        body = json.dumps([{"labels": labels} for labels in posted.values()]).encode()
        req = urllib.request.Request(
            url + "/api/v2/alerts", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(url + "/api/v2/alerts", timeout=10) as resp:
            got = json.load(resp)
    by_labels = {json.dumps(a["labels"], sort_keys=True): a["status"] for a in got}
    assert len(by_labels) == len(posted)
    for key, labels in posted.items():
        status = by_labels[json.dumps(labels, sort_keys=True)]
        assert bool(status["inhibitedBy"]) == (key in inhibited), (key, status)


class _Receiver(ThreadingHTTPServer):
    """Records the JSON bodies POSTed to it, by path: the Slack and PagerDuty endpoints of the test config."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with received.lock:
                    received.posts.append((self.path, json.loads(body)))
                self.send_response(202 if self.path == "/pagerduty" else 200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def bodies(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for p, body in self.posts if p == path]


def _am_config_to(receiver: str, path: Path) -> Path:
    """The example config with its receivers' endpoints pointed at `receiver` and its group waits shortened;
    templates, routes and inhibitions unchanged."""
    config = yaml.safe_load(AM_CONFIG.read_text())
    for route in [config["route"], *config["route"]["routes"]]:
        if "group_wait" in route:
            route["group_wait"] = "1s"
    for r in config["receivers"]:
        for pd in r.get("pagerduty_configs", []):
            pd["url"] = receiver + "/pagerduty"
        for slack in r.get("slack_configs", []):
            slack["api_url"] = receiver + "/slack"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.slow
def test_alertmanager_notifications_always_have_a_title(tmp_path: Path) -> None:
    """PagerDuty refuses an event without a summary: a group of alerts with different summaries (two GPUs of a
    node) must still get a title, in PagerDuty's description and Slack's title alike."""
    receiver = _Receiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    node, job = {"instance": "n1:9478", "job": "gpumon"}, {"job_name": "llama"}
    alerts = [
        # two GPUs of one node: one group, two summaries
        {
            "labels": {
                "alertname": "GpumonGpuXidCritical",
                **node,
                "gpu": str(gpu),
                "uuid": f"GPU-a{gpu}",
                "xid": "79",
                "severity": "critical",
            },
            "annotations": {"summary": f"XID 79 on GPU {gpu} of n1:9478", "runbook_url": "https://r/#xid"},
        }
        for gpu in (0, 1)
    ] + [
        # a job-level alert alone in its group: its own summary
        {
            "labels": {"alertname": "GpumonTrainingRanksLost", **job, "severity": "critical"},
            "annotations": {"summary": "Training job llama lost ranks", "runbook_url": "https://r/#lost"},
        },
    ]
    try:
        with alertmanager(tmp_path, _am_config_to(receiver.url, tmp_path / "am.yml")) as url:
            req = urllib.request.Request(
                url + "/api/v2/alerts",
                data=json.dumps(alerts).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200
            end = time.monotonic() + 30
            while len(receiver.bodies("/pagerduty")) < 2 or len(receiver.bodies("/slack")) < 2:
                assert time.monotonic() < end, receiver.posts
                time.sleep(0.2)
    finally:
        receiver.shutdown()
        receiver.server_close()
    expected = {"GpumonGpuXidCritical on n1:9478: 2 alerts", "Training job llama lost ranks"}
    assert {b["payload"]["summary"] for b in receiver.bodies("/pagerduty")} == expected
    assert {b["attachments"][0]["title"] for b in receiver.bodies("/slack")} == expected


def test_the_deploy_guide_states_the_largest_rule_group_as_it_is(groups: list[dict[str, Any]]) -> None:
    """Mimir's ruler refuses a group above ruler_max_rules_per_rule_group: the number it must be raised to is
    the size of gpumon's largest group, which grows as rules are added."""
    largest = max(groups, key=lambda g: len(g["rules"]))
    text = (ROOT / "docs" / "deploy.md").read_text()
    n = len(largest["rules"])
    assert f"`ruler_max_rules_per_rule_group` to at least {n}" in text
    assert f"`{largest['name']}` has {n} rules" in text
