"""The ingest side of the wire protocol (gpumon/client/protocol.py): JSON object → a validated ``Report``.

Every field is checked for type, range, finiteness and, for names that become label values, charset and
length. The first problem found is raised as ``InvalidReport`` with a message that names the field, so the
SDK (and a person with curl) can see what to fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpumon.client import protocol as P

_NAME = re.compile(P.NAME_PATTERN)
_PHASE = re.compile(P.PHASE_PATTERN)
_INCARNATION = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DEVICE = re.compile(r"^(?:\d{1,4}|(?:GPU|MIG)-[A-Za-z0-9/-]{1,96})$")
_MAX_COUNT = 2.0**63  # counters beyond this are corruption, not training
_MAX_SECONDS = 10.0 * 365 * 86400
_MAX_FLOPS = 1e24  # per token or per GPU-second: far above any model or GPU, below float trouble
_KNOWN = frozenset(
    [
        "v",
        "job",
        "rank",
        "world_size",
        "local_rank",
        "kind",
        "workload",
        "incarnation",
        "pid",
        "seq",
        "time",
        "started",
        "devices",
        "dtype",
        "flops_per_token",
        "flops_convention",
        "peak_flops",
        "totals",
        "updated",
        "anchor",
        "step_seconds",
        "request_seconds",
        "phases",
        "final",
    ]
)


class InvalidReport(ValueError):
    """The report breaks the protocol; the message says which field and why."""


@dataclass(frozen=True, slots=True)
class Totals:
    steps: float
    tokens: float
    samples: float
    requests: float


@dataclass(frozen=True, slots=True)
class Histogram:
    counts: tuple[float, ...]  # per bucket (BUCKETS, then +Inf), not cumulative
    sum: float

    @property
    def count(self) -> float:
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class Report:
    job: str
    rank: int
    world_size: int
    local_rank: int | None
    kind: str
    workload: str | None
    incarnation: str
    pid: int
    seq: int
    time: float
    started: float
    devices: tuple[str, ...]
    dtype: str | None
    flops_per_token: float | None
    flops_convention: str | None
    peak_flops: float | None
    totals: Totals
    updated: float | None
    anchor_time: float | None
    anchor: Totals | None
    step_seconds: Histogram
    request_seconds: Histogram | None
    phases: Mapping[str, float]
    final: bool


def parse(data: Any) -> Report:
    if not isinstance(data, dict):
        raise InvalidReport("the body must be a JSON object")
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise InvalidReport(f"unknown field {unknown[0]!r} (protocol version {P.VERSION})")
    if data.get("v") != P.VERSION:
        raise InvalidReport(f"v: this daemon speaks protocol version {P.VERSION}, got {_show(data.get('v'))}")
    world = _int(data, "world_size", 1, 1 << 20)
    local = data.get("local_rank")
    anchor = data.get("anchor")
    request_seconds = data.get("request_seconds")
    return Report(
        job=_name(data, "job"),
        rank=_int(data, "rank", 0, world - 1),
        world_size=world,
        local_rank=None if local is None else _int(data, "local_rank", 0, 1 << 16),
        kind=_choice(data, "kind", P.KINDS),
        workload=None if data.get("workload") is None else _name(data, "workload"),
        incarnation=_match(data, "incarnation", _INCARNATION, "1-64 letters, digits, _ or -"),
        pid=_int(data, "pid", 1, 1 << 31),
        seq=_int(data, "seq", 0, 1 << 62),
        time=_timestamp(data, "time"),
        started=_timestamp(data, "started"),
        devices=_devices(data.get("devices")),
        dtype=None if data.get("dtype") is None else _choice(data, "dtype", P.DTYPES),
        flops_per_token=_optional_number(data, "flops_per_token", _MAX_FLOPS, positive=True),
        flops_convention=(
            None if data.get("flops_convention") is None else _choice(data, "flops_convention", P.CONVENTIONS)
        ),
        peak_flops=_optional_number(data, "peak_flops", _MAX_FLOPS, positive=True),
        totals=_totals(data.get("totals"), "totals"),
        updated=None if data.get("updated") is None else _timestamp(data, "updated"),
        anchor_time=None if anchor is None else _timestamp(_object(anchor, "anchor"), "time", "anchor.time"),
        anchor=None if anchor is None else _totals(anchor, "anchor", extra=("time",)),
        step_seconds=_histogram(data.get("step_seconds"), "step_seconds"),
        request_seconds=None if request_seconds is None else _histogram(request_seconds, "request_seconds"),
        phases=_phases(data.get("phases")),
        final=_bool(data, "final"),
    )


def _int(data: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidReport(f"{key}: expected an integer, got {_show(value)}")
    if not lo <= value <= hi:
        raise InvalidReport(f"{key}: must be between {lo} and {hi}, got {value}")
    return value


def _number(value: object, what: str, hi: float, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidReport(f"{what}: expected a number, got {_show(value)}")
    try:
        x = float(value)
    except OverflowError:  # a JSON integer with hundreds of digits
        raise InvalidReport(f"{what}: number too large") from None
    if not math.isfinite(x):
        raise InvalidReport(f"{what}: must be finite, got {value}")
    if x < 0 or (positive and x == 0) or x > hi:
        raise InvalidReport(
            f"{what}: must be {'>' if positive else '>='} 0 and <= {hi:g}, got {_show(value)}"
        )
    return x


def _optional_number(data: Mapping[str, Any], key: str, hi: float, *, positive: bool = False) -> float | None:
    value = data.get(key)
    return None if value is None else _number(value, key, hi, positive=positive)


def _timestamp(data: Mapping[str, Any], key: str, what: str | None = None) -> float:
    x = _number(data.get(key), what or key, 1e11)
    if x < 1e9:  # before 2001: a perf_counter reading sent by mistake
        raise InvalidReport(f"{what or key}: expected unix seconds, got {x}")
    return x


def _name(data: Mapping[str, Any], key: str) -> str:
    return _match(data, key, _NAME, "1-128 chars of letters, digits and _.:/@+=-, starting alphanumeric")


def _match(data: Mapping[str, Any], key: str, pattern: re.Pattern[str], rule: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not pattern.match(value) or value.endswith("\n"):
        raise InvalidReport(f"{key}: expected {rule}, got {_show(value)}")
    return value


def _choice(data: Mapping[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = data.get(key)
    if not isinstance(value, str) or value not in choices:
        raise InvalidReport(f"{key}: expected one of {', '.join(choices)}, got {_show(value)}")
    return value


def _bool(data: Mapping[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise InvalidReport(f"{key}: expected true or false, got {_show(value)}")
    return value


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InvalidReport(f"{what}: expected an object, got {_show(value)}")
    return value


def _totals(value: object, what: str, extra: tuple[str, ...] = ()) -> Totals:
    obj = _object(value, what)
    unknown = sorted(set(obj) - set(P.TOTALS) - set(extra))
    if unknown:
        raise InvalidReport(f"{what}: unknown counter {unknown[0]!r} (known: {', '.join(P.TOTALS)})")
    steps, tokens, samples, requests = (_number(obj.get(k, 0), f"{what}.{k}", _MAX_COUNT) for k in P.TOTALS)
    return Totals(steps, tokens, samples, requests)


def _histogram(value: object, what: str) -> Histogram:
    obj = _object(value, what)
    counts = obj.get("counts")
    if not isinstance(counts, list) or len(counts) != len(P.BUCKETS) + 1:
        raise InvalidReport(f"{what}.counts: expected a list of {len(P.BUCKETS) + 1} bucket counts")
    return Histogram(
        tuple(_number(c, f"{what}.counts[{i}]", _MAX_COUNT) for i, c in enumerate(counts)),
        _number(obj.get("sum"), f"{what}.sum", _MAX_SECONDS * 1e3),
    )


def _phases(value: object) -> dict[str, float]:
    obj = _object({} if value is None else value, "phases")
    if len(obj) > P.MAX_PHASES:
        raise InvalidReport(f"phases: at most {P.MAX_PHASES} phases, got {len(obj)}")
    out = {}
    for name, seconds in obj.items():
        if not _PHASE.match(name) or name.endswith("\n"):
            raise InvalidReport(f"phases: name {_show(name)} must match {P.PHASE_PATTERN}")
        out[name] = _number(seconds, f"phases.{name}", _MAX_SECONDS)
    return out


def _devices(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > P.MAX_DEVICES:
        raise InvalidReport(f"devices: expected a list of at most {P.MAX_DEVICES} GPU UUIDs or indexes")
    for d in value:
        if not isinstance(d, str) or not _DEVICE.match(d) or d.endswith("\n"):
            raise InvalidReport(f"devices: {_show(d)} is neither a GPU-/MIG- UUID nor an NVML index")
    return tuple(dict.fromkeys(value))


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
