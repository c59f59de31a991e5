"""Fuzzing a real daemon over loopback HTTP (issue 7, "Bad input"): POST /v1/report with hypothesis bodies
built from the report model, every route of the OpenAPI schema with schemathesis, /metrics with any Accept
header. Every answer is a 2xx or a 4xx with a JSON reason, never a 5xx or a reset; the daemon lives on; the
exposition afterwards passes promtool, and accepted job names come back exactly, as labels and as URLs.

Limits, memory and huge bodies are tests/web/test_fuzz_limits.py; the report model in-process is
tests/jobs/test_fuzz_report.py.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from support.fuzzing import (
    BODY_KINDS,
    NAMES_A_FIELD,
    POOL,
    Body,
    fuzz_settings,
    names_the_field,
    report_bodies,
)
from support.helpers import Daemon, require_tool, start_daemon
from support.reports import now_report

from gpumon.client import protocol as P
from gpumon.web.server import accepts_gzip

pytestmark = pytest.mark.slow  # fuzzing a real daemon

NOW = time.time()
# what each kind of body may be answered with (a limit, a conflict or a stale report is a valid answer to
# a valid report; only the mutations and the bytes may also happen to be valid)
EXPECTED = {
    "valid": {204, 409, 422, 429},
    "mutated": {204, 400, 409, 422, 429},
    "bytes": {400, 422},
    "deep": {400, 422},
    "duplicate": {422},
    "bad_utf8": {400, 422},
    "truncated": {400},
    "oversize": {413},
}


@pytest.fixture(scope="module")
def node() -> Iterator[Daemon]:
    d = start_daemon(
        "--simulate", "2xH100-SXM", "--interval", "200ms", "--max-jobs", "48", "--max-ranks", "96",
        "--rank-ttl", "10m",
    )  # fmt: skip
    for job in POOL:  # names with every character that means something in a URL path or a label matcher
        r = post(d, json.dumps(now_report(20, job=job)).encode())
        assert r.status_code == 204, r.text
    yield d
    d.stop()


def post(d: Daemon, content: bytes) -> httpx.Response:
    return d.client.post(P.PATH, content=content, headers={"Content-Type": "application/json"})


def reason(r: httpx.Response) -> str:
    """The JSON reason every 4xx carries."""
    assert r.headers["content-type"] == "application/json", r.headers
    detail = r.json()["detail"]
    assert isinstance(detail, str) and detail.strip(), r.text
    assert len(detail) <= 1000, detail  # it quotes what it refuses briefly, never the whole body
    return detail


def check_answer(r: httpx.Response, body: Body) -> None:
    status = r.status_code
    assert 200 <= status < 300 or 400 <= status < 500, (status, r.text[:500])
    assert status in EXPECTED[body.kind], (body.kind, body.field, status, r.text[:500], body.content[:300])
    if status < 400:
        return
    detail = reason(r)
    if status == 400:
        assert detail.startswith(("the body is not JSON", "the body nests JSON deeper")), detail
    elif status == 413:
        assert f"larger than {P.MAX_BODY_BYTES} bytes" in detail
    elif status == 429:
        assert "--max-jobs" in detail or "--max-ranks" in detail, detail
    elif status == 409:
        assert "pid" in detail, detail
    elif body.kind == "duplicate":
        assert detail == f"'{body.field}' appears twice in one JSON object; give each field once", detail
    elif body.kind == "valid":
        # a rank's earlier report, of the same incarnation: counts cannot go back, nor seq leap ahead
        assert "went backwards within one incarnation" in detail or detail.startswith("seq: jumped"), detail
    else:
        assert NAMES_A_FIELD.match(detail), detail
        if body.kind == "mutated" and body.field and "went backwards" not in detail:
            assert names_the_field(detail, body.field), (body.field, detail)


def assert_alive_without_tracebacks(d: Daemon) -> None:
    assert d.proc.poll() is None, "\n".join(d.log[-50:])
    assert d.get("/readyz").status_code == 200
    assert not [line for line in d.log if "Traceback" in line or "Exception in ASGI" in line], d.log[-50:]


def assert_exposition_valid(d: Daemon, accepted: set[str]) -> set[str]:
    """promtool and both parsers accept /metrics; the jobs listed are exported under exactly their names and
    answer at their URL. Returns the jobs listed."""
    promtool = require_tool("promtool")
    text = d.get("/metrics").text
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr
    exported = {
        s.labels["job_name"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if "job_name" in s.labels
    }
    om = d.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    om_exported = {s.labels.get("job_name") for f in parse_openmetrics(om.text) for s in f.samples} - {None}
    listed = {j["job"] for j in d.get("/v1/jobs").json()["jobs"]}
    assert listed <= exported <= accepted and om_exported == exported, (listed, exported - accepted)
    for job in listed:
        one = d.get("/v1/jobs/" + urllib.parse.quote(job, safe=""))
        assert one.status_code == 200 and one.json()["job"] == job, one.text[:300]
        hist = d.get("/v1/history/" + urllib.parse.quote(job, safe=""))
        assert hist.status_code == 200 or (hist.status_code == 404 and reason(hist)), hist.text[:300]
    return listed


@pytest.fixture(scope="module")
def accepted() -> set[str]:
    """Job names the daemon answered 204 for: all that may ever appear in its exposition."""
    return set(POOL)


@pytest.mark.parametrize(("kind", "examples"), [(k, 120 if k == "mutated" else 25) for k in BODY_KINDS])
def test_fuzzed_reports_get_a_2xx_or_a_4xx_with_a_reason(node, accepted, kind, examples) -> None:
    answers: dict[int, int] = {}

    @fuzz_settings(examples)
    @given(body=report_bodies(NOW, kind))
    def one(body: Body) -> None:
        r = post(node, body.content)
        check_answer(r, body)
        answers[r.status_code] = answers.get(r.status_code, 0) + 1
        if r.status_code == 204:
            accepted.add(json.loads(body.content)["job"])

    one()
    print(f"{kind}: answers {dict(sorted(answers.items()))}")
    assert_alive_without_tracebacks(node)


def test_after_fuzzing_the_exposition_passes_promtool_and_job_names_round_trip(node, accepted) -> None:
    listed = assert_exposition_valid(node, accepted)
    assert set(POOL) <= listed  # the names with / . : @ + = and .. in them, at least


@pytest.mark.parametrize("field", ["job", "totals", "phases", "step_seconds"])
def test_a_report_nested_just_under_the_json_depth_limit_gets_a_4xx_not_a_500(node, field) -> None:
    # Regression: at ~975 levels json.loads still succeeded but quoting the value in the refusal overflowed
    # the stack: HTTP 500 (or a reset connection) and a traceback in the log.
    data = now_report(5, job="deep")
    data[field] = "\x00deep"
    base = json.dumps(data).encode()
    statuses = set()
    for depth in range(900, 1001):
        r = post(node, base.replace(b'"\\u0000deep"', b"[" * depth + b"]" * depth))
        statuses.add(r.status_code)
        assert r.status_code in (400, 422), (depth, r.status_code, r.text[:200])
        detail = reason(r)
        assert detail.startswith((f"{field}: expected", "the body nests JSON deeper")), detail
    assert statuses == {400, 422}  # both sides of json's limit were crossed
    assert_alive_without_tracebacks(node)


def test_a_report_naming_a_field_twice_is_refused_naming_the_field(node) -> None:
    # Regression: json.loads keeps the last of duplicate keys, so {"rank": 0, ..., "rank": 3} was stored as
    # rank 3 without a word (204), while a misspelt field is refused.
    body = json.dumps(now_report(5, job="twice")).encode()[:-1] + b', "rank": 0}'
    r = post(node, body)
    assert r.status_code == 422
    assert reason(r) == "'rank' appears twice in one JSON object; give each field once"
    nested = json.dumps(now_report(5, job="twice")).encode().replace(b'"steps": 5', b'"steps": 5, "steps": 6')
    r = post(node, nested)
    assert r.status_code == 422 and reason(r).startswith("'steps' appears twice")
    assert "twice" not in {j["job"] for j in node.get("/v1/jobs").json()["jobs"]}


# --- every route in the OpenAPI schema, with schemathesis ---------------------------------------------------


def test_every_route_of_the_openapi_schema_answers_as_documented_and_never_5xx(node) -> None:
    schema = schemathesis.openapi.from_dict(node.get("/openapi.json").json())
    ops = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in ops} >= {"/metrics", "/v1/jobs", "/v1/jobs/{job}", "/v1/history/{job}"}
    assert P.PATH not in {op.path for op in ops}  # ingest is ASGI middleware: fuzzed by the test above
    strategies = [op.as_strategy(generation_mode=m) for op in ops for m in GenerationMode]
    for op in ops:  # the known jobs too, so the 200 answers are checked against the schema as well
        if "{job}" in op.path:
            strategies += [op.as_strategy(path_parameters={"job": job}) for job in POOL]
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    seen: set[tuple[str, int]] = set()

    @fuzz_settings(200)
    @given(case=st.one_of(strategies))
    def one(case: Any) -> None:
        r = case.call(base_url=node.url, timeout=10)
        seen.add((case.path, r.status_code))
        case.validate_response(r, checks=checks)
        if 400 <= r.status_code < 500:
            detail = r.json()["detail"]
            assert detail and (isinstance(detail, str) or all("loc" in e for e in detail)), r.text

    one()
    print("answers by route:", sorted(seen))
    assert ("/v1/jobs/{job}", 200) in seen and ("/v1/jobs/{job}", 404) in seen
    assert ("/v1/history/{job}", 422) in seen  # a window that is not a positive number
    assert_alive_without_tracebacks(node)


@pytest.mark.parametrize(
    "accept",
    [
        "text/plain; version=1.0.0; escaping=dots",
        "text/plain; version=1.0.0; escaping=values",
        "application/openmetrics-text; version=1.0.0; escaping=dots",
        "application/openmetrics-text; version=1.0.0; escaping=values",
    ],
)
def test_every_name_escaping_scheme_gives_an_exposition_promtool_and_the_parsers_accept(node, accept) -> None:
    # Regression: these went to prometheus_client 0.26's encoders, which escape a histogram's _bucket, _sum
    # and _count suffixes out of their family (dots: x__seconds__bucket under TYPE x__seconds) and write
    # U__-prefixed samples under unprefixed HELP/TYPE lines (OpenMetrics, values); promtool: "no help text".
    r = node.get("/metrics", headers={"Accept": accept})
    assert r.status_code == 200 and accept.split(";")[0] in r.headers["content-type"]
    dots = "escaping=dots" in accept
    histogram = (
        "gpumon__training__job__step__duration__seconds"
        if dots
        else "gpumon_training_job_step_duration_seconds"
    )
    summary = histogram.replace("job__", "").replace("job_step", "step")
    if accept.startswith("text/plain"):
        promtool = require_tool("promtool")
        check = subprocess.run([promtool, "check", "metrics"], input=r.text, capture_output=True, text=True)
        assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr
        families = {f.name: f for f in text_string_to_metric_families(r.text)}
    else:
        families = {f.name: f for f in parse_openmetrics(r.text)}
    assert all(f.samples for f in families.values()), [n for n, f in families.items() if not f.samples]
    assert {s.name for s in families[histogram].samples} == {
        f"{histogram}_{x}" for x in ("bucket", "sum", "count")
    }
    assert {s.name for s in families[summary].samples} == {f"{summary}_{x}" for x in ("sum", "count")}
    assert ("job__name" if dots else "job_name") in families[histogram].samples[0].labels


# --- /metrics content negotiation --------------------------------------------------------------------------

ACCEPTS = [
    "",
    "*/*",
    "text/plain",
    "text/plain; version=0.0.4",
    "text/plain; version=1.0.0; escaping=underscores",
    "text/plain; version=1.0.0; escaping=allow-utf-8",
    "text/plain; version=1.0.0; escaping=dots",
    "text/plain; version=1.0.0; escaping=values",
    "text/plain; version=9.9.9",
    "text/plain; version=abc",
    "application/openmetrics-text",
    "application/openmetrics-text; version=1.0.0",
    "application/openmetrics-text; version=0.0.1",
    "application/openmetrics-text; version=1.0.0; escaping=values",
    "application/openmetrics-text; version=1.0.0; escaping=dots",
    "application/openmetrics-text; version=2.0.0",
    "application/openmetrics-text; version=x.y",
    "application/openmetrics-text;q=0,*/*;q=1",
    "application/json",
    ";;;,,,=",
    "application/openmetrics-text; version=",
]
# what an HTTP client can send at all: printable ASCII, no leading or trailing blanks
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80).map(str.strip)


@fuzz_settings(100)
@given(
    accept=st.sampled_from(ACCEPTS) | header_text,
    encoding=st.sampled_from(["", "gzip", "identity", "gzip;q=0", "br", "*"]) | header_text,
    names=st.lists(
        st.sampled_from(["gpumon_gpu_up", "gpumon_training_tokens_total", "x"]) | st.text(), max_size=3
    ),
)
def test_metrics_answers_any_accept_header_with_an_exposition_that_parses(
    node, accept, encoding, names
) -> None:
    r = node.get(
        "/metrics", headers={"Accept": accept, "Accept-Encoding": encoding}, params={"name[]": names}
    )
    assert r.status_code == 200, (accept, r.text[:300])
    content_type = r.headers["content-type"]
    assert r.headers.get("content-encoding") in (None, "gzip")
    # gzip exactly when the header admits it (gzip or * with a q above 0); httpx has decoded it (a bad gzip
    # would have raised)
    assert (r.headers.get("content-encoding") == "gzip") is accepts_gzip(encoding), encoding
    text = r.content.decode("utf-8")
    if content_type.startswith("application/openmetrics-text"):
        families = list(parse_openmetrics(text))
    else:
        assert content_type.startswith("text/plain"), content_type
        families = list(text_string_to_metric_families(text))
    if not names:  # names as they are, in every scheme but dots (which doubles their underscores)
        up = "gpumon__gpu__up" if "escaping=dots" in content_type else "gpumon_gpu_up"
        assert any(f.name == up for f in families), (accept, content_type)
        if content_type.startswith("application/openmetrics-text"):  # no sample outside its family
            assert all(s.name.startswith(f.name) for f in families for s in f.samples), (accept, content_type)
