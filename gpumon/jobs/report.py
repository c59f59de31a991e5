"""The ingest side of the wire protocol (gpumon/client/protocol.py): JSON object → a validated ``Report``.

Every field is checked for type, range, finiteness and, for names that become label values, charset and
length. The first problem found is raised as ``InvalidReport`` with a message that names the field, so the
SDK (and a person with curl) can see what to fix.
"""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpumon.client import protocol as P

_NAME = re.compile(P.NAME_PATTERN)
_PHASE = re.compile(P.PHASE_PATTERN)
_INCARNATION = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DEVICE = re.compile(P.DEVICE_PATTERN)
_HOSTNAME = re.compile(P.HOSTNAME_PATTERN)
_CONTAINER = reprlib.Repr()
_CONTAINER.maxlevel = 3
_CLOCK_SLACK = 5.0  # seconds a report's own times may disagree (rounding, a clock read a moment apart)
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
        *P.EXTENSIONS,
    ]
)
_SETUP_KEYS = frozenset(("model", "micro_batch", "zero_stage", "tp", *P.SETUP_FLAGS, *P.SETUP_CHOICES))
_MODEL_INTS = ("layers", "hidden", "heads", "vocab", "seq_len", "kv_heads", "head_dim", "ffn_hidden")
_MODEL_FLAGS = ("gated_mlp", "tied_embeddings", "biases", "learned_positions")
_MAX_DIM = P.MAX_DIMENSION


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
    # optional fields (protocol.EXTENSIONS): None or empty from older SDKs
    process_started: float | None = None
    resumed_step: int | None = None
    open_phases: Mapping[str, float] = field(default_factory=dict)
    memory: Memory | None = None
    setup: Mapping[str, Any] | None = None  # checked: "model" holds ModelSpec's fields
    predecessor: Predecessor | None = None
    hostname: str | None = None


@dataclass(frozen=True, slots=True)
class Predecessor:
    """The rank's previous process, from the SDK's state file: how far it got and when it last stepped."""

    incarnation: str
    step: int  # its high-water global step
    last_step: float  # unix seconds


@dataclass(frozen=True, slots=True)
class Memory:
    """The caching allocator of the rank's CUDA device; None where the SDK's torch did not say."""

    device: int
    allocated_bytes: int | None = None
    allocated_peak_bytes: int | None = None
    reserved_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    active_bytes: int | None = None
    active_peak_bytes: int | None = None
    inactive_split_bytes: int | None = None
    alloc_retries: int | None = None
    ooms: int | None = None


def parse(data: Any) -> Report:
    """Validate one report: every field on its own, then the fields against each other."""
    report = _fields(data)
    _consistent(report)
    return report


def _fields(data: Any) -> Report:
    if not isinstance(data, dict):
        raise InvalidReport("the body must be a JSON object")
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise InvalidReport(f"unknown field {show(unknown[0])} (protocol version {P.VERSION})")
    if data.get("v") != P.VERSION or isinstance(data.get("v"), bool | float):
        raise InvalidReport(f"v: this daemon speaks protocol version {P.VERSION}, got {show(data.get('v'))}")
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
        flops_per_token=_optional_number(data, "flops_per_token", P.MAX_FLOPS, positive=True),
        flops_convention=(
            None if data.get("flops_convention") is None else _choice(data, "flops_convention", P.CONVENTIONS)
        ),
        peak_flops=_peak(data),
        totals=_totals(data.get("totals"), "totals"),
        updated=None if data.get("updated") is None else _timestamp(data, "updated"),
        anchor_time=None if anchor is None else _timestamp(_object(anchor, "anchor"), "time", "anchor.time"),
        anchor=None if anchor is None else _totals(anchor, "anchor", extra=("time",)),
        step_seconds=_histogram(data.get("step_seconds"), "step_seconds"),
        request_seconds=None if request_seconds is None else _histogram(request_seconds, "request_seconds"),
        phases=_phases(data.get("phases")),
        final=_bool(data, "final"),
        process_started=None if data.get("process_started") is None else _timestamp(data, "process_started"),
        resumed_step=(
            None if data.get("resumed_step") is None else _int(data, "resumed_step", 0, int(P.MAX_COUNT))
        ),
        open_phases=_phases(data.get("open_phases"), "open_phases"),
        memory=_memory(data.get("memory")),
        setup=_setup(data.get("setup")),
        predecessor=_predecessor(data.get("predecessor")),
        hostname=(
            None
            if data.get("hostname") is None
            else _match(data, "hostname", _HOSTNAME, "a host name of letters, digits, . _ or -")
        ),
    )


def _predecessor(value: object) -> Predecessor | None:
    if value is None:
        return None
    data = _object(value, "predecessor")
    unknown = sorted(set(data) - {"incarnation", "step", "last_step"})
    if unknown:
        raise InvalidReport(f"predecessor: unknown field {show(unknown[0])}")
    named = {f"predecessor.{key}": item for key, item in data.items()}  # errors name the field in full
    return Predecessor(
        incarnation=_match(named, "predecessor.incarnation", _INCARNATION, "1-64 letters, digits, _ or -"),
        step=_int(named, "predecessor.step", 0, int(P.MAX_COUNT)),
        last_step=_timestamp(named, "predecessor.last_step"),
    )


def _consistent(r: Report) -> None:
    """What one honest SDK incarnation cannot send: a derived rate from such a report would be negative,
    infinite or forever "progressing"."""
    t = r.totals
    if r.anchor is not None:
        for name in P.TOTALS:
            if getattr(r.anchor, name) > getattr(t, name):
                raise InvalidReport(
                    f"anchor.{name}: larger than totals.{name}; the anchor is an earlier point"
                )
    if r.updated is not None:
        if r.updated > r.time + _CLOCK_SLACK:
            raise InvalidReport("updated: later than the report's own time")
        if r.anchor_time is not None and r.anchor_time > r.updated + _CLOCK_SLACK:
            raise InvalidReport("anchor.time: later than updated; the anchor is an earlier point")
    if r.started > r.time + _CLOCK_SLACK:
        raise InvalidReport("started: later than the report's own time")
    if r.process_started is not None:
        if r.process_started > r.started + _CLOCK_SLACK:
            raise InvalidReport("process_started: later than started; the process starts before its Reporter")
        if r.started - r.process_started > P.MAX_STARTUP:
            days = (r.started - r.process_started) / 86400
            raise InvalidReport(
                f"process_started: {days:.0f} days before started (at most {P.MAX_STARTUP / 86400:.0f}); "
                "a misread start time"
            )
    p = r.predecessor
    if p is not None and p.incarnation == r.incarnation:
        raise InvalidReport("predecessor.incarnation: this report's own, not an earlier process's")
    if r.step_seconds.count > t.steps:
        raise InvalidReport("step_seconds: more observations than totals.steps")
    if r.request_seconds is not None and r.request_seconds.count > t.requests:
        raise InvalidReport("request_seconds: more observations than totals.requests")


def _peak(data: Mapping[str, Any]) -> float | None:
    value = _optional_number(data, "peak_flops", P.MAX_FLOPS, positive=True)
    if value is not None and value < P.MIN_PEAK_FLOPS:
        raise InvalidReport(
            f"peak_flops: {value:g} FLOP/s per GPU is below 1 GFLOP/s; give FLOP/s, not TFLOP/s (989.5e12)"
        )
    return value


def _int(data: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidReport(f"{key}: expected an integer, got {show(value)}")
    if not lo <= value <= hi:
        raise InvalidReport(f"{key}: must be between {lo} and {hi}, got {show(value)}")
    return value


def _number(value: object, what: str, hi: float, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidReport(f"{what}: expected a number, got {show(value)}")
    try:
        x = float(value)
    except OverflowError:  # a JSON integer with hundreds of digits
        raise InvalidReport(f"{what}: number too large") from None
    if not math.isfinite(x):
        raise InvalidReport(f"{what}: must be finite, got {value}")
    if x < 0 or (positive and x == 0) or x > hi:
        raise InvalidReport(f"{what}: must be {'>' if positive else '>='} 0 and <= {hi:g}, got {show(value)}")
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
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidReport(f"{key}: expected {rule}, got {show(value)}")
    return value


def _choice(data: Mapping[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = data.get(key)
    if not isinstance(value, str) or value not in choices:
        raise InvalidReport(f"{key}: expected one of {', '.join(choices)}, got {show(value)}")
    return value


def _bool(data: Mapping[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise InvalidReport(f"{key}: expected true or false, got {show(value)}")
    return value


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InvalidReport(f"{what}: expected an object, got {show(value)}")
    return value


def _totals(value: object, what: str, extra: tuple[str, ...] = ()) -> Totals:
    obj = _object(value, what)
    unknown = sorted(set(obj) - set(P.TOTALS) - set(extra))
    if unknown:
        raise InvalidReport(f"{what}: unknown counter {show(unknown[0])} (known: {', '.join(P.TOTALS)})")
    steps, tokens, samples, requests = (_number(obj.get(k, 0), f"{what}.{k}", P.MAX_COUNT) for k in P.TOTALS)
    return Totals(steps, tokens, samples, requests)


def _histogram(value: object, what: str) -> Histogram:
    obj = _object(value, what)
    counts = obj.get("counts")
    if not isinstance(counts, list) or len(counts) != len(P.BUCKETS) + 1:
        raise InvalidReport(f"{what}.counts: expected a list of {len(P.BUCKETS) + 1} bucket counts")
    if all(c.__class__ is int and 0 <= c <= P.MAX_COUNT for c in counts):  # what the SDK sends
        checked = tuple(counts)
    else:  # the slow way, for the message that names the bad bucket
        checked = tuple(_number(c, f"{what}.counts[{i}]", P.MAX_COUNT) for i, c in enumerate(counts))
    return Histogram(
        checked,
        _number(obj.get("sum"), f"{what}.sum", P.MAX_SECONDS),
    )


def _phases(value: object, what: str = "phases") -> dict[str, float]:
    obj = _object({} if value is None else value, what)
    if len(obj) > P.MAX_PHASES:
        raise InvalidReport(f"{what}: at most {P.MAX_PHASES} phases, got {len(obj)}")
    out = {}
    for name, seconds in obj.items():
        if not _PHASE.fullmatch(name):
            raise InvalidReport(f"{what}: name {show(name)} must match {P.PHASE_PATTERN}")
        out[name] = _number(seconds, f"{what}.{name}", P.MAX_SECONDS)
    return out


def _memory(value: object) -> Memory | None:
    if value is None:
        return None
    obj = _object(value, "memory")
    unknown = sorted(set(obj) - set(P.MEMORY_FIELDS) - {"device"})
    if unknown:
        raise InvalidReport(f"memory: unknown field {show(unknown[0])} (known: {', '.join(P.MEMORY_FIELDS)})")
    with _within("memory."):
        device = _int(obj, "device", 0, 1 << 16) if "device" in obj else 0
        values = {}
        for key in P.MEMORY_FIELDS:
            if obj.get(key) is not None:
                values[key] = _int(obj, key, 0, P.MAX_BYTES)
    return Memory(device, **values)


def _setup(value: object) -> dict[str, Any] | None:
    """What the memory estimator needs; whether the shape makes a model is checked where it is estimated."""
    if value is None:
        return None
    obj = _object(value, "setup")
    unknown = sorted(set(obj) - _SETUP_KEYS)
    if unknown:
        raise InvalidReport(f"setup: unknown field {show(unknown[0])}")
    model = _object(obj.get("model"), "setup.model")
    extra = sorted(set(model) - set(P.MODEL_FIELDS))
    if extra:
        raise InvalidReport(f"setup.model: unknown field {show(extra[0])}")
    shape: dict[str, Any] = {}
    with _within("setup.model."):
        for key in _MODEL_INTS:
            if model.get(key) is not None:
                shape[key] = _int(model, key, 1, _MAX_DIM)
        for key in ("layers", "hidden", "heads", "vocab", "seq_len"):
            if key not in shape:
                raise InvalidReport(f"{key}: required")
        for key in _MODEL_FLAGS:
            if model.get(key) is not None:
                shape[key] = _bool(model, key)
        if model.get("name") is not None:
            shape["name"] = _name(model, "name")
    with _within("setup."):
        out: dict[str, Any] = {
            "model": shape,
            "micro_batch": _int(obj, "micro_batch", 1, _MAX_DIM),
            "zero_stage": _int(obj, "zero_stage", 0, 3) if obj.get("zero_stage") is not None else 0,
        }
        if obj.get("tp") is not None:
            out["tp"] = _int(obj, "tp", 1, P.MAX_TP)
        for key in P.SETUP_FLAGS:
            if obj.get(key) is not None:
                out[key] = _bool(obj, key)
        for key, choices in P.SETUP_CHOICES.items():
            if obj.get(key) is not None:
                out[key] = _choice(obj, key, choices)
    return out


@contextmanager
def _within(prefix: str) -> Iterator[None]:
    """Name a nested field by its whole path in the message: "setup.model.layers: ..."."""
    try:
        yield
    except InvalidReport as exc:
        message = str(exc)
        raise InvalidReport(message if message.startswith(prefix) else prefix + message) from None


def _devices(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > P.MAX_DEVICES:
        raise InvalidReport(f"devices: expected a list of at most {P.MAX_DEVICES} GPU UUIDs or indexes")
    for d in value:
        if not isinstance(d, str) or not _DEVICE.fullmatch(d):
            raise InvalidReport(f"devices: {show(d)} is neither a GPU-/MIG- UUID nor an NVML index")
    return tuple(dict.fromkeys(value))


def show(value: object) -> str:
    """A value from a request as error messages quote it: its repr, at most 60 characters."""
    # a container's repr recurses into it: a body nested just under json's own depth limit would overflow
    # the stack here (a 500), so containers are shown a few levels deep, as reprlib does
    text = _CONTAINER.repr(value) if isinstance(value, list | dict) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
