"""Hypothesis strategies and settings shared by the fuzz tests (test_fuzz_*.py).

Reports start valid (built like the SDK builds them, tests/support/reports.py) and are then broken one field
at a time, so a refusal can be held to naming the field that was broken. Bodies that are not reports at all
(bytes, deep nesting, duplicate keys, invalid UTF-8, oversize) come from their own strategies.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import psutil
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpumon.client import protocol as P
from support.helpers import IN_CI
from support.reports import report

# A report's fields; an error message starts with one of them (a nested one as "totals.steps",
# "step_seconds.counts[3]"), is a store's "X went backwards", or quotes a key given twice.
FIELDS = [
    *("v", "job", "rank", "world_size", "local_rank", "kind", "workload", "incarnation", "pid", "seq"),
    *("time", "started", "devices", "dtype", "flops_per_token", "flops_convention", "peak_flops"),
    *("totals", "updated", "anchor", "step_seconds", "request_seconds", "phases", "final"),
]
NAMES_A_FIELD = re.compile(
    rf"^(?:(?:{'|'.join(FIELDS)})(?:\.\w+|\[\d+\])*(?::| went backwards)|unknown field |'.*' appears twice "
    r"|the body must be a JSON object)"
)
# fields checked against each other: breaking one may be reported as the other (rank against world_size)
PEERS = {
    # time and started bound how much a report can have grown since its process started (physics.py)
    "time": {"started", "updated", "anchor", "totals", "phases", "step_seconds", "request_seconds"},
    "started": {"time", "totals", "phases", "step_seconds", "request_seconds"},
    "updated": {"time", "anchor"},
    "anchor": {"totals", "updated"},
    "totals": {"anchor", "step_seconds", "request_seconds"},
    "step_seconds": {"totals"},
    "request_seconds": {"totals"},
    "world_size": {"rank"},
}
NAME = st.from_regex(P.NAME_PATTERN.strip("^$"), fullmatch=True)
# valid job names with every character the protocol allows that means something elsewhere: a URL path
# (/ . : @ + =), a label matcher (=), a relative path segment (..)
POOL = ("llm", "a/../b", "x@y:z+w=1", "Job.v2-final_3", "9", "a" * 128, "team/proj:run@2026+x=y")
LABELISH = (
    '"',
    "\\",
    "\n",
    'a"b',
    "a\\b",
    "a\nb",
    "\r\n",
    "\u202e",  # right-to-left override
    "\u200f",
    "\x00",
    "\u2028",
    "é",
    "日本語",
    "🚀",
    "",
    " ",
    "a b",
    "\ud800",  # a lone surrogate: valid in JSON's \u escapes, not in UTF-8
    "a/../b",
    "-a",
    'a{b="c"}',
    "a" * 129,
)
NUMBERS = (
    float("nan"),
    float("inf"),
    float("-inf"),
    -0.0,
    0.0,
    -1,
    -1.5,
    10**400,
    -(10**400),
    2**53,
    2**53 + 1,
    2**63,
    1e308,
    5e-324,
    1.0,
    True,
    False,
)
INCARNATION = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)


def fuzz_settings(max_examples: int) -> settings:
    """Bounded examples, no deadline (a noisy machine), and in CI a fixed order so a failure reproduces."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=IN_CI,
        database=None,  # no .hypothesis/ in the work tree; a failure prints its seed and blob
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def nest(depth: int) -> Any:
    """[[[...]]] ``depth`` lists deep, as json.loads would build it (without recursing here)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(NUMBERS + LABELISH),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
# what a broken field gets instead of its value
nasty = st.one_of(
    st.sampled_from(NUMBERS + LABELISH),
    json_scalars,
    st.integers(1, 900).map(nest),
    st.integers(129, 3000).map(lambda n: "a" * n),
    st.dictionaries(st.sampled_from((*P.TOTALS, "time", "x")), json_scalars, max_size=5),
    json_values,
)


@st.composite
def valid_reports(draw: st.DrawFn, now: float) -> dict[str, Any]:
    """A report the daemon must accept (unless a limit or an earlier report of the rank is in the way)."""
    world = draw(st.integers(1, 64))
    steps = draw(st.integers(0, 10_000))
    step_seconds = draw(st.sampled_from((0.001, 0.05, 0.1, 1.0, 30.0)))
    # a local report's process started after this node booted (physics.check_start): a CI machine may
    # have booted minutes ago
    steps = min(steps, int(max(0.0, now - psutil.boot_time() - 200) / step_seconds))
    kind = draw(st.sampled_from(P.KINDS))
    data = report(
        steps,
        job=draw(st.sampled_from(POOL) | NAME),
        rank=draw(st.integers(0, world - 1)),
        world_size=world,
        local_rank=draw(st.none() | st.integers(0, 7)),
        kind=kind,
        workload=draw(st.none() | NAME),
        incarnation=draw(INCARNATION),
        pid=draw(st.integers(1, 1 << 31)),
        tokens_per_step=draw(st.integers(0, 100_000)),
        step_seconds=step_seconds,
        # a minute at least before its last step: the phases below (up to 1e4 s) fit in its wall time
        # (the daemon allows 256 s of a phase per second: physics.MAX_THREADS)
        started=now - steps * step_seconds - 60 - draw(st.floats(0, 100)),
        t=now,
        dtype=draw(st.sampled_from((None, *P.DTYPES))),
        flops_per_token=draw(st.none() | st.floats(1, 1e15)),
        flops_convention=draw(st.sampled_from((None, *P.CONVENTIONS))),
        peak_flops=draw(st.none() | st.floats(P.MIN_PEAK_FLOPS, 1e16)),
        devices=draw(st.lists(st.sampled_from(("0", "1", "7", "GPU-0000", "MIG-GPU-1/2/0")), max_size=3)),
        phases=draw(
            st.dictionaries(
                st.sampled_from(P.PHASES) | st.from_regex(P.PHASE_PATTERN.strip("^$"), fullmatch=True),
                st.floats(0, 1e4),
                max_size=4,
            )
        ),
        final=draw(st.booleans()),
    )
    if kind == "inference" and draw(st.booleans()):
        steps = data["step_seconds"]
        data["request_seconds"] = {"counts": list(steps["counts"]), "sum": steps["sum"]}
        data["totals"]["requests"] = data["totals"]["steps"]
    return data


@dataclass(frozen=True)
class Mutation:
    data: dict[str, Any]
    field: str  # the top-level field that was broken (or the key added)
    how: str  # replace, delete or add


@st.composite
def mutated_reports(draw: st.DrawFn, now: float, field: str | None = None) -> Mutation:
    """A valid report with one field (``field``, or any) replaced or removed, or an unknown key added
    ("+key"), or a phase with a bad name or value ("+phase")."""
    data = draw(valid_reports(now))
    if field is None:
        field = draw(st.sampled_from(("+key", "+phase", *FIELDS)))
    if field == "+key":
        key = draw(st.text(max_size=30) | st.sampled_from(LABELISH))
        if key not in data:
            data[key] = draw(json_values)
            return Mutation(data, key, "add")
        field = key
    if field == "+phase":
        data["phases"][draw(st.text(max_size=40) | st.sampled_from(LABELISH))] = draw(nasty)
        return Mutation(data, "phases", "add")
    paths: list[list[str | int]] = [[field]]
    if isinstance(data.get(field), dict):
        paths += [[field, k] for k in data[field]]
    if field == "step_seconds":
        paths += [["step_seconds", "counts", i] for i in range(len(P.BUCKETS) + 1)]
    if field == "devices":
        paths += [["devices", i] for i in range(len(data["devices"]))]
    path = paths[draw(st.integers(0, len(paths) - 1))]
    target: Any = data
    for step in path[:-1]:
        target = target[step]
    if draw(st.integers(0, 4)) == 0:
        del target[path[-1]]
        return Mutation(data, field, "delete")
    target[path[-1]] = draw(nasty)
    return Mutation(data, field, "replace")


def names_the_field(message: str, field: str) -> bool:
    """Whether a refusal names the broken field (or a field it is checked against)."""
    if message.startswith("unknown field "):
        return True  # an added key (the only mutation that adds one)
    head = re.split(r"[.:\[ ]", message, maxsplit=1)[0]
    return head == field or head in PEERS.get(field, ()) or message.startswith(f"{field}.")


@dataclass(frozen=True)
class Body:
    content: bytes
    kind: str  # one of BODY_KINDS
    field: str | None = None  # for a mutated report: the field that was broken


def _encode(data: Any, ascii_only: bool) -> bytes:
    # allow_nan: NaN and Infinity literals are what a careless client sends; surrogatepass: a lone
    # surrogate written raw is invalid UTF-8, which the daemon must refuse as such
    return json.dumps(data, allow_nan=True, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


BODY_KINDS = ("mutated", "valid", "bytes", "deep", "duplicate", "bad_utf8", "truncated", "oversize")


@st.composite
def report_bodies(draw: st.DrawFn, now: float, kind: str) -> Body:
    """One POST /v1/report body of the given kind (BODY_KINDS)."""
    if kind == "valid":
        return Body(_encode(draw(valid_reports(now)), True), kind)
    if kind == "mutated":
        m = draw(mutated_reports(now))
        return Body(_encode(m.data, draw(st.booleans())), kind, m.field)
    if kind == "bytes":
        return Body(draw(st.binary(max_size=300)), kind)
    if kind == "deep":  # json.dumps cannot write what json.loads cannot read: splice it in as text
        data = draw(valid_reports(now))
        field = draw(st.sampled_from(("job", "totals", "phases", "devices", "v", "x")))
        data[field] = "\x00deep"  # no valid value holds a NUL
        # from 2: one level, [], is a valid (empty) devices list, and the report is then rightly accepted
        depth = draw(st.integers(2, 20_000))
        deep = b"[" * depth + b"]" * depth
        return Body(_encode(data, True).replace(b'"\\u0000deep"', deep), kind, field)
    base = _encode(draw(valid_reports(now)), True)
    if kind == "duplicate":
        key = draw(st.sampled_from(FIELDS))
        return Body(base[:-1] + b', "' + key.encode() + b'": 0}', kind, key)
    if kind == "bad_utf8":
        at = draw(st.integers(0, len(base)))
        junk = draw(
            st.sampled_from((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xef\xbb\xbf"))
        )
        return Body(base[:at] + junk + base[at:], kind)
    if kind == "truncated":
        return Body(base[: draw(st.integers(0, len(base) - 1))], kind)
    size = draw(st.integers(P.MAX_BODY_BYTES + 1, 4 * P.MAX_BODY_BYTES))
    return Body(base[:-1] + b', "job": "' + b"a" * size + b'"}', kind)
