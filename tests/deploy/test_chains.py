"""Recorded series written out in place for vmalert (gpumon.alerting.chains): what is inlined and what is
kept, and that the shipped rules written out still pass every promtool unit test of alerts/tests, so the
rules vmalert runs answer as the ones Prometheus runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.helpers import ROOT, require_tool
from support.promtool import run_unit_tests

from gpumon import alerting
from gpumon.alerting import TranslationError, vmalert_groups
from gpumon.alerting.chains import inline_records


def _group(*rules: dict, interval: str | None = None) -> dict:
    g: dict = {"name": "g", "rules": list(rules)}
    if interval:
        g["interval"] = interval
    return g


def _exprs(groups: list[dict]) -> list[str]:
    return [r["expr"] for g in groups for r in g["rules"]]


def test_a_chain_is_written_out_to_scraped_series() -> None:
    groups = [
        _group(
            {"record": "a:x:sum", "expr": "sum by (job) (x)"},
            {"record": "a:y:count", "expr": "count by (job) (y)"},
            {"record": "a:x_per_y:ratio", "expr": "a:x:sum / a:y:count"},
            {"alert": "Low", "expr": "a:x_per_y:ratio < 0.7", "for": "5m"},
        )
    ]
    out = inline_records(groups)
    assert " ".join(_exprs(out)[2].split()) == "( sum by (job) (x) ) / ( count by (job) (y) )"
    assert " ".join(_exprs(out)[3].split()) == "( ( sum by (job) (x) ) / ( count by (job) (y) ) ) < 0.7"
    assert _exprs(groups)[3] == "a:x_per_y:ratio < 0.7", "the input was modified"


def test_history_slow_groups_and_self_reading_records_stay_references() -> None:
    groups = [
        _group(
            {"record": "a:x:sum", "expr": "sum(x)"},
            {"record": "a:name:info", "expr": "group(n) or (a:name:info and on () up)"},
            {"alert": "M", "expr": 'a:x:sum{job="j"} > 1 and a:x:sum offset 1h < 2 and a:name:info'},
            {"alert": "R", "expr": "max_over_time(a:x:sum[1h]) > 1 and a:x:sum @ 100 > 0"},
        ),
        _group({"record": "a:x:median7d", "expr": "quantile_over_time(0.5, a:x:sum[7d])"}, interval="5m"),
        _group({"alert": "W", "expr": "a:x:sum < 0.5 * a:x:median7d"}),
    ]
    out = inline_records(groups)
    assert _exprs(out)[1] == _exprs(groups)[1]  # reads itself: its value is its own history
    assert _exprs(out)[2] == _exprs(groups)[2]  # matchers, an offset, the self-reading one
    assert _exprs(out)[3] == _exprs(groups)[3]  # a range, an @ modifier
    assert _exprs(out)[4] == _exprs(groups)[4]  # a range in a slow group
    assert " ".join(_exprs(out)[5].split()) == "( sum(x) ) < 0.5 * a:x:median7d"


def test_strings_comments_and_twice_recorded_names_are_left_alone() -> None:
    groups = [
        _group(
            {"record": "a:x:sum", "expr": "sum(x)"},
            {"record": "a:u:sum", "expr": "sum(u)"},
            {"record": "a:u:sum", "expr": "sum(v)"},
            {"alert": "S", "expr": 'label_replace(up, "l", "a:x:sum", "", "") # a:x:sum\n and a:u:sum'},
        )
    ]
    assert _exprs(inline_records(groups))[3] == _exprs(groups)[3]


def test_records_with_labels_or_without_a_colon_stay_references() -> None:
    """Found by review: a record's labels: were lost when it was written out (an alert lost team="ml", a
    join on it never matched), and a colon-less record name was also replaced inside by (...) and 1e5."""
    groups = [
        _group(
            {"record": "job:x:sum", "expr": "sum by (job) (x)", "labels": {"team": "ml"}},
            {"record": "busy", "expr": "sum(x)"},
            {"alert": "A", "expr": "job:x:sum > 1"},
            {"alert": "B", "expr": "sum by (busy) (y) > 1e5 and busy > 0"},
        )
    ]
    assert _exprs(inline_records(groups))[2:] == ["job:x:sum > 1", "sum by (busy) (y) > 1e5 and busy > 0"]


def test_every_written_out_expression_fits_victoriametrics_query_limit() -> None:
    """vmalert sends each expression as a query; VictoriaMetrics refuses one over -search.maxQueryLen (16 KiB
    by default). The written-out chains grow with their depth: the largest is held under the limit."""
    longest = max(
        (len(str(r["expr"])), r.get("alert") or r.get("record"))
        for text in alerting.render_vmalert().values()
        for g in yaml.safe_load(text)["groups"]
        for r in g["rules"]
    )
    assert longest[0] < 16 * 1024, longest


def test_a_cycle_is_refused_with_its_path() -> None:
    groups = [_group({"record": "a:p", "expr": "a:q + 1"}, {"record": "a:q", "expr": "a:p + 1"})]
    with pytest.raises(TranslationError, match="cycle: a:p -> a:q -> a:p"):
        vmalert_groups(groups)


@pytest.mark.slow  # about a minute: the written-out expressions recompute every level at every step
def test_the_shipped_rules_written_out_pass_every_promtool_unit_test(tmp_path: Path) -> None:
    """The PromQL of the written-out rules (before the MetricsQL rewrite of rate and increase) against the
    unit tests the shipped rules pass: the same alerts at the same moments, the same recorded values."""
    promtool = require_tool("promtool", "apt-get install prometheus")
    every = alerting.load_rules()
    for name in ("recording.rules.yml", "alerting.rules.yml"):
        groups = inline_records(alerting.load_rules([ROOT / "alerts" / name]), every)
        (tmp_path / name).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, allow_unicode=True))
    tests = sorted((ROOT / "alerts" / "tests").glob("*.test.yml"))
    assert tests
    for path in tests:
        doc = yaml.safe_load(path.read_text())
        doc["rule_files"] = [str(tmp_path / Path(f).name) for f in doc["rule_files"]]
        (tmp_path / path.name).write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    results = run_unit_tests(promtool, [tmp_path / p.name for p in tests])
    failed = [(p.name, out[-3000:]) for p, rc, out in results if rc != 0]
    assert failed == [], failed
