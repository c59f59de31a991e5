"""The vmalert variant of the rules (gpumon.alerting.victoria): what it changes, that vmalert 1.79 loads it
where it refuses the Prometheus files, and that its rate()/increase() answer exactly as Prometheus's on the
same samples, counters born inside the window included.

vmalert and VictoriaMetrics (Debian's victoria-metrics), promtool and Prometheus run for real: skipped
locally without them, failing under CI=true. The end-to-end comparison, every dashboard query and recording
rule on both engines scraping the same daemons, is in tests/e2e/test_stack.py.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.helpers import ROOT, require_tool
from support.stack import Prometheus, start_prometheus
from support.victoria import VictoriaMetrics, start_victoria_metrics, vmalert_dry_run

from gpumon import alerting
from gpumon.alerting import AlertingError, TranslationError, translate_expr, vmalert_groups


def _calls(expr: str, names: tuple[str, ...]) -> list[str]:
    """The calls of ``names`` in ``expr`` as functions (not parts of other names)."""
    return re.findall(r"(?<![A-Za-z0-9_:])(" + "|".join(names) + r")\s*\(", expr)


# ---- the generator ------------------------------------------------------------------------------------


def test_keep_firing_for_is_dropped_and_nothing_else_changes() -> None:
    rule = {
        "alert": "A",
        "expr": 'up{job="gpumon"} == 0',
        "for": "5m",
        "keep_firing_for": "5m",
        "labels": {"severity": "warning"},
        "annotations": {"summary": "{{ $labels.instance }}"},
    }
    groups = [{"name": "g", "interval": "1m", "rules": [rule, {"record": "r", "expr": "sum(up)"}]}]
    out = vmalert_groups(groups)
    assert out == [
        {
            "name": "g",
            "interval": "1m",
            "rules": [
                {k: v for k, v in rule.items() if k != "keep_firing_for"},
                {"record": "r", "expr": "sum(up)"},
            ],
        }
    ]
    assert "keep_firing_for" in groups[0]["rules"][0], "the input was modified"


def test_rate_and_increase_become_prometheus_s_computation() -> None:
    out = translate_expr(
        'sum by (job) (rate(x_total{a="b"}[5m])) > 0 and increase(y_total[10m] offset 1h) > 0'
    )
    assert out.startswith(alerting.victoria.PRELUDE)
    body = out.removeprefix(alerting.victoria.PRELUDE)
    assert body == (
        'sum by (job) (prom_rate(x_total{a="b"}[5m], 300, 0)) > 0'
        " and prom_increase(y_total[10m] offset 1h, 600, 3600) > 0"
    )
    assert translate_expr("rate(x[1h30m])").endswith("prom_rate(x[1h30m], 5400, 0)")


@pytest.mark.parametrize(
    "expr",
    [
        "irate(x[5m])",  # another function
        "job_name:x_rate:sum / job:increase_total:ratio",  # names containing the words
        'x{rate="increase(y[5m])"}',  # in a label value
        "sum by (rate) (x)",  # a label name
        "up # rate(x[5m]) in a comment",
        "max_over_time(x[5m])",
    ],
)
def test_expressions_without_rate_or_increase_are_unchanged(expr: str) -> None:
    assert translate_expr(expr) == expr


def test_a_bracket_inside_a_label_value_is_not_the_range() -> None:
    out = translate_expr('rate(x{path="/a[0]"}[5m])')
    assert out.endswith('prom_rate(x{path="/a[0]"}[5m], 300, 0)')


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("rate(x[5m:1m])", "only a plain range selector"),  # a subquery
        ("rate(sum(x)[5m:])", "only a plain range selector"),
        ("rate(x[5m] @ 100)", "cannot rewrite the modifier"),
        ("rate(x)", "expected a range selector"),
        ("delta(x[5m])", "differs in MetricsQL"),
        ("rate(x[5q])", "not a PromQL duration"),
    ],
)
def test_what_cannot_be_rewritten_is_refused(expr: str, why: str, tmp_path: Path) -> None:
    with pytest.raises(TranslationError, match=re.escape(why)):
        translate_expr(expr, "g/r")
    # and a file that holds one is not rendered: the error names the file and the rule
    path = tmp_path / "r.rules.yml"
    path.write_text(alerting.dump({"groups": [{"name": "g", "rules": [{"record": "r", "expr": expr}]}]}))
    with pytest.raises(AlertingError, match=re.escape(f"{path}: g/r: ")):
        alerting.render_vmalert([path])


def test_the_shipped_rules_keep_everything_but_the_three_differences() -> None:
    groups = alerting.load_rules()
    variant = vmalert_groups(groups)
    recorded = set(alerting.recording_names(groups))
    kept = _kept_references(groups)
    assert [g["name"] for g in variant] == [g["name"] for g in groups]
    for group, ours in zip(groups, variant, strict=True):
        assert {k: v for k, v in ours.items() if k != "rules"} == {
            k: v for k, v in group.items() if k != "rules"
        }
        assert len(ours["rules"]) == len(group["rules"])
        for rule, new in zip(group["rules"], ours["rules"], strict=True):
            assert "keep_firing_for" not in new
            assert {k: v for k, v in new.items() if k != "expr"} == {
                k: v for k, v in rule.items() if k not in ("expr", "keep_firing_for")
            }
            assert _calls(new["expr"], ("rate", "increase")) == []
            # a recorded series read as a plain instant vector is written out, but for the kinds kept
            assert _plain_references(new["expr"], recorded) <= kept, rule.get("record") or rule.get("alert")
            if _calls(rule["expr"], ("rate", "increase")) or _plain_references(rule["expr"], recorded - kept):
                assert new["expr"] != rule["expr"]
            else:
                assert new["expr"] == rule["expr"]
    assert any("keep_firing_for" in r for g in groups for r in g["rules"]), "nothing exercised the drop"


# a name, and what may follow it that makes it more than a plain instant vector
_REFERENCE = re.compile(
    r"(?<![A-Za-z0-9_:])([A-Za-z_:][A-Za-z0-9_:]*)(?![A-Za-z0-9_:])(\s*[{\[(@]|\s*offset)?"
)


def _plain_references(expr: str, names: set[str]) -> set[str]:
    found = _REFERENCE.finditer(expr)
    return {m.group(1) for m in found if m.group(1) in names and not m.group(2)}


def _kept_references(groups: list[dict[str, Any]]) -> set[str]:
    """What gpumon.alerting.chains keeps as references: the slow groups' records and the one that reads
    itself."""
    slow = {r["record"] for g in groups if g.get("interval") for r in g["rules"] if "record" in r}
    return slow | {"instance:gpumon_node:info"}


def test_command_writes_both_files(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpumon.alerting", "--vmalert", str(tmp_path / "vmalert")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in (tmp_path / "vmalert").iterdir())
    assert names == ["alerting.rules.yml", "recording.rules.yml"]
    for name in names:
        text = (tmp_path / "vmalert" / name).read_text()
        assert text.startswith("# Generated by `python -m gpumon.alerting --vmalert DIR`")
        every = alerting.load_rules()
        assert yaml.safe_load(text)["groups"] == vmalert_groups(
            alerting.load_rules([ROOT / "alerts" / name]), every
        )
    refused = subprocess.run(
        [sys.executable, "-m", "gpumon.alerting", "--vmalert", str(tmp_path), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "--check" in refused.stderr


# ---- vmalert 1.79 --------------------------------------------------------------------------------------


def test_vmalert_loads_the_variant_and_refuses_the_prometheus_files(tmp_path: Path) -> None:
    written = alerting.write_vmalert(tmp_path / "variant")
    loaded = vmalert_dry_run(written, tmp_path)
    assert loaded.returncode == 0, loaded.stdout[-3000:]
    # the check can fail: the shipped files are what vmalert 1.79 refuses, for keep_firing_for
    refused = vmalert_dry_run(list(alerting.RULE_FILES), tmp_path)
    assert refused.returncode != 0 and "keep_firing_for" in refused.stdout, refused.stdout[-3000:]


# ---- the rewritten rate() and increase() against Prometheus's, on the same samples ------------------------

STEP = 2  # seconds between samples, as a 2 s scrape interval leaves them
END = 600  # seconds of history


def _counters() -> dict[str, list[tuple[int, float]]]:
    """Counters as (seconds from the start, value), one sample every STEP seconds."""
    every = range(0, END, STEP)
    return {
        "mature_total": [(t, 1000 + 10 * t) for t in every],
        # born inside the windows below: a new rank's counter from 0, one moved from another node with its
        # totals, and an XID-like counter that appears at 1 and never moves
        "born_total": [(t, 10 * (t - 400)) for t in every if t >= 400],
        "born_high_total": [(t, 5000 + 10 * (t - 400)) for t in every if t >= 400],
        "born_one_total": [(t, 1) for t in every if t >= 400],
        "reset_total": [(t, 10 * t if t < 450 else 10 * (t - 450)) for t in every],
        "zero_start_total": [(t, 0 if t < 560 else 1) for t in every],
        "slow_total": [(t, 0.02 * t) for t in every],
    }


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, VictoriaMetrics, float]]:
    """Prometheus and VictoriaMetrics holding the same samples of _counters(), which start ``start``; three
    hours back, so that VictoriaMetrics searches them through its per-day index, where they are visible at
    once after a flush (the current hour's series cache catches up only every few seconds)."""
    promtool = require_tool("promtool")
    work = tmp_path_factory.mktemp("engines")
    start = float(int(time.time()) - 3 * 3600)
    lines, imports = [], []
    for name, samples in _counters().items():
        family = name.removesuffix("_total")
        lines.append(f"# TYPE {family} counter")
        lines += [f'{name}{{k="v"}} {v} {start + t}' for t, v in samples]
        imports.append(
            {
                "metric": {"__name__": name, "k": "v"},
                "values": [v for _, v in samples],
                "timestamps": [int((start + t) * 1000) for t, _ in samples],
            }
        )
    (work / "counters.om").write_text("\n".join([*lines, "# EOF"]) + "\n")
    made = subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(work / "counters.om"),
            str(work / "prom-data"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    (work / "prometheus.yml").write_text("global: {}\n")
    (work / "victoria.yml").write_text("scrape_configs: []\n")
    prom_process = start_prometheus(work / "prometheus.yml", work)
    vm_process = start_victoria_metrics(work / "victoria.yml", work)
    try:
        body = "\n".join(json.dumps(i) for i in imports)
        httpx.post(vm_process.url + "/api/v1/import", content=body, timeout=30).raise_for_status()
        httpx.get(vm_process.url + "/internal/force_flush", timeout=30).raise_for_status()
        prom, vm = Prometheus(prom_process), VictoriaMetrics(vm_process)
        yield prom, vm, start
        prom.close()
        vm.close()
    finally:
        vm_process.stop()
        prom_process.stop()


def _value(result: list[dict[str, Any]]) -> float | None:
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


@pytest.mark.parametrize("function", ["rate", "increase"])
@pytest.mark.parametrize("window", ["1m", "5m", "10m"])
def test_rewritten_rate_and_increase_answer_as_prometheus(
    engines: tuple[Prometheus, VictoriaMetrics, float], function: str, window: str
) -> None:
    prom, vm, start = engines
    compared = 0
    for name in _counters():
        # after the reset, and where the born counters are 101 s and 31 s old, younger than most windows.
        # Never where a window starts exactly on a sample: Prometheus's window holds it, MetricsQL's does not.
        for at, offset in (
            (start + END - 2.9, ""),
            (start + 501.3, ""),
            (start + 430.9, ""),
            (start + 561.7, " offset 1m"),
        ):
            expr = f'{function}({name}{{k="v"}}[{window}]{offset})'
            ours = _value(prom.query(expr, at))
            theirs = _value(vm.query(translate_expr(expr), at))
            assert (ours is None) == (theirs is None), (expr, at - start, ours, theirs)
            if ours is not None and theirs is not None:
                assert math.isclose(ours, theirs, rel_tol=1e-6, abs_tol=1e-9), (
                    expr,
                    at - start,
                    ours,
                    theirs,
                )
                compared += 1
    assert compared >= 20


def test_metricsql_s_own_rate_and_increase_differ_on_counters_born_in_the_window(
    engines: tuple[Prometheus, VictoriaMetrics, float],
) -> None:
    """Why the rewrite exists: what vmalert would compute from the shipped expressions."""
    prom, vm, start = engines
    at = start + 430.9  # the born counters are 31 s old
    ours = _value(prom.query('rate(born_total{k="v"}[5m])', at))
    native = _value(vm.query('rate(born_total{k="v"}[5m])', at))
    assert ours is not None and native is not None and native > 5 * ours  # the whole rate at once
    assert _value(prom.query('increase(born_one_total{k="v"}[10m])', at)) == 0
    assert _value(vm.query('increase(born_one_total{k="v"}[10m])', at)) == 1  # a first XID would count
