"""Fuzzing the report model and the exposition in-process (issue 7, "Bad input"): whatever JSON arrives,
validation answers a Report within bounds or an InvalidReport naming the field, never another exception;
label values with quotes, newlines and any Unicode come out of /metrics exactly as they went in.

The HTTP side (a real daemon) is tests/web/test_fuzz_http.py; limits and memory are
tests/web/test_fuzz_limits.py.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from support.fuzzing import (
    FIELDS,
    LABELISH,
    NAMES_A_FIELD,
    Mutation,
    fuzz_settings,
    json_scalars,
    json_values,
    mutated_reports,
    names_the_field,
    nasty,
    nest,
    valid_reports,
)
from support.helpers import require_tool
from support.reports import report

from gpumon.client import protocol as P
from gpumon.jobs.report import InvalidReport, Report, parse, show
from gpumon.web.exposition import Renderer

pytestmark = pytest.mark.slow  # fuzzing

NOW = time.time()
_NAME = re.compile(P.NAME_PATTERN)
_PHASE = re.compile(P.PHASE_PATTERN)
MAX_MESSAGE = 400  # a reason quotes what it refuses, shortened: never the whole 64 KiB body


def assert_within_bounds(r: Report) -> None:
    """What the store and the exporter may rely on for every accepted report."""
    assert 1 <= r.world_size <= 1 << 20 and 0 <= r.rank < r.world_size
    assert _NAME.fullmatch(r.job) and (r.workload is None or _NAME.fullmatch(r.workload))
    assert r.kind in P.KINDS and (r.dtype is None or r.dtype in P.DTYPES)
    numbers = [r.time, r.started, *(getattr(r.totals, n) for n in P.TOTALS), r.step_seconds.sum]
    numbers += [*r.step_seconds.counts, *r.phases.values()]
    numbers += [x for x in (r.updated, r.anchor_time, r.flops_per_token, r.peak_flops) if x is not None]
    assert all(isinstance(x, int | float) and math.isfinite(x) and x >= 0 for x in numbers), numbers
    assert all(getattr(r.totals, n) <= P.MAX_COUNT for n in P.TOTALS)
    assert all(_PHASE.fullmatch(name) for name in r.phases) and len(r.phases) <= P.MAX_PHASES


def refusal(data: Any) -> str | None:
    """parse's verdict: None when accepted (and within bounds), else the reason. Any other exception fails."""
    try:
        r = parse(data)
    except InvalidReport as exc:
        message = str(exc)
        assert NAMES_A_FIELD.match(message), message
        assert len(message) <= MAX_MESSAGE, message
        return message
    assert_within_bounds(r)
    return None


@fuzz_settings(100)
@given(data=valid_reports(NOW))
def test_reports_built_the_way_the_sdk_builds_them_are_accepted(data: dict[str, Any]) -> None:
    # the mutation tests start from these, so they must be valid, or "refused" would prove nothing
    assert refusal(data) is None


@pytest.mark.parametrize("field", [*FIELDS, "+key", "+phase"])
def test_a_report_with_one_field_broken_is_refused_naming_that_field_or_is_accepted_within_bounds(
    field: str,
) -> None:
    outcomes: set[str] = set()

    @fuzz_settings(30)
    @given(m=mutated_reports(NOW, field))
    def one(m: Mutation) -> None:
        message = refusal(m.data)
        outcomes.add("accepted" if message is None else "refused")
        if message is not None:
            assert names_the_field(message, m.field), (m.field, m.how, message)

    one()
    assert "refused" in outcomes  # every field has values that must be refused


@fuzz_settings(300)
@given(
    data=json_values
    | st.dictionaries(st.sampled_from(sorted(report())), nasty, max_size=8)
    | st.dictionaries(st.sampled_from(sorted(report())), json_scalars, min_size=20)
)
def test_any_json_value_is_either_a_report_or_a_refusal_naming_a_field(data: Any) -> None:
    refusal(data)


def _at_stack_depth(frames: int, fn: Callable[[], object]) -> object:
    return fn() if frames == 0 else _at_stack_depth(frames - 1, fn)


@pytest.mark.parametrize("field", ["job", "totals", "phases", "step_seconds", "devices"])
def test_a_value_nested_just_under_jsons_depth_limit_is_refused_with_a_reason(field: str) -> None:
    # Regression: the refusal quoted the value with repr(), which recurses once more than json.loads did:
    # a body nested ~975 deep (depending on the stack in use) raised RecursionError -> HTTP 500 and a
    # traceback in the daemon's log. Every stack depth and nesting depth json.loads accepts must be refused
    # cleanly.
    refused = 0
    for frames in range(0, 40, 3):
        for depth in range(900, 1001):
            text = f'{{"v": 1, "{field}": {"[" * depth}{"]" * depth}}}'

            def attempt(text: str = text) -> object:
                try:
                    data = json.loads(text)
                except RecursionError:
                    return None  # the daemon answers 400 "nests JSON deeper than any report"
                base = report(5)
                base[field] = data[field]
                return refusal(base)

            refused += _at_stack_depth(frames, attempt) is not None
    assert refused > 0


def test_a_refusal_quotes_a_deeply_nested_value_briefly() -> None:
    assert show(nest(100_000)) == "[[[[...]]]]"
    assert show({"a": nest(50)}) == "{'a': [[[...]]]}"
    assert show("x" * 10_000) == "'" + "x" * 56 + "..."
    assert len(show(10**400)) == 60


# --- exposition: label values the exporter may carry (GPU names, process owners, pod names, jobs) --------

label_values = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30) | st.sampled_from(
    [v for v in LABELISH if v != "\ud800"]
)


def _families(values: list[str]) -> list[Any]:
    g = GaugeMetricFamily("fuzz_level", 'help with "quotes", \\ and\nnewline', labels=["v", "i"])
    c = CounterMetricFamily("fuzz_events", "a counter", labels=["v", "i"])
    h = HistogramMetricFamily("fuzz_seconds", "a histogram", labels=["v", "i"])
    for i, v in enumerate(values):
        g.add_metric([v, str(i)], i + 0.5)
        c.add_metric([v, str(i)], i)
        h.add_metric([v, str(i)], buckets=[("0.1", 1.0), ("+Inf", 2.0)], sum_value=0.3)
    return [g, c, h]


class _Fixed:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


@fuzz_settings(200)
@given(values=st.lists(label_values, min_size=1, max_size=5))
def test_label_values_with_quotes_newlines_and_any_unicode_round_trip_exactly(values: list[str]) -> None:
    families = _families(values)
    renderer = Renderer()
    text = renderer.render(families, openmetrics_format=False)
    om = renderer.render(families, openmetrics_format=True)
    assert text == generate_latest(_Fixed(families))
    assert om == generate_openmetrics(_Fixed(families))
    for parsed in (text_string_to_metric_families(text.decode()), parse_openmetrics(om.decode())):
        back = {(s.name, s.labels["i"]): s.labels["v"] for f in parsed for s in f.samples}
        for i, v in enumerate(values):
            assert back[("fuzz_level", str(i))] == v
            assert back[("fuzz_events_total", str(i))] == v
            assert back[("fuzz_seconds_bucket", str(i))] == v


def test_promtool_accepts_label_values_with_quotes_newlines_and_unicode() -> None:
    promtool = require_tool("promtool")
    values = [v for v in LABELISH if v != "\ud800"]
    body = Renderer().render(_families(values), openmetrics_format=False)
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert check.returncode == 0 and check.stdout + check.stderr == b"", check.stdout + check.stderr
    parsed = text_string_to_metric_families(body.decode())
    assert [s.labels["v"] for f in parsed if f.name == "fuzz_level" for s in f.samples] == values


def test_the_renderers_cache_holds_about_the_live_series_not_every_series_it_has_seen() -> None:
    # Regression: jobs that come and go left their series' text cached up to 100,000 series (~60 MB)
    renderer = Renderer(min_series=100)
    for round_ in range(50):
        g = GaugeMetricFamily("churn", "series that come and go", labels=["job_name"])
        for i in range(40):
            g.add_metric([f"{round_}-{i}"], i)
        assert renderer.render([g], openmetrics_format=False) == generate_latest(_Fixed([g]))
        assert len(renderer._prefixes) <= max(100, 4 * 40) + 40


@fuzz_settings(100)
@given(values=st.lists(label_values, min_size=1, max_size=3))
def test_dots_escaping_doubles_name_underscores_and_keeps_every_sample_in_its_family(values) -> None:
    # Regression: prometheus_client 0.26 escaped x_seconds_bucket to x__seconds__bucket, out of x__seconds
    families = _families(values)
    for om in (False, True):
        body = Renderer().render(families, openmetrics_format=om, dots=True).decode()
        parsed = {
            f.name: f for f in (parse_openmetrics(body) if om else text_string_to_metric_families(body))
        }
        assert set(parsed) == {"fuzz__level", "fuzz__seconds", "fuzz__events"}
        assert {s.name for s in parsed["fuzz__events"].samples} == {"fuzz__events_total"}
        assert {s.name for s in parsed["fuzz__seconds"].samples} == {"fuzz__seconds_bucket"} | {
            "fuzz__seconds_sum",
            "fuzz__seconds_count",
        }
        assert [s.labels["v"] for s in parsed["fuzz__level"].samples] == values
