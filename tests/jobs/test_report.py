"""Ingest validation: every field of the wire protocol, with a message that names what to fix."""

from __future__ import annotations

import dataclasses
import re

import pytest
from support.reports import T0, report

from gpumon.client import protocol as P
from gpumon.client.model import ModelSpec
from gpumon.jobs.report import InvalidReport, parse


def test_a_report_as_the_sdk_sends_it_parses() -> None:
    r = parse(report(10, phases={"data_wait": 1.5}))
    assert (r.job, r.rank, r.world_size, r.kind, r.dtype) == ("llm", 0, 1, "train", "bf16")
    assert r.totals.tokens == 10_000 and r.anchor is not None and r.anchor.tokens == 1000
    assert r.step_seconds.count == 9 and r.phases == {"data_wait": 1.5}


def test_a_report_before_the_first_step_has_no_anchor() -> None:
    r = parse(report(0))
    assert r.anchor is None and r.updated is None and r.totals.steps == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("v", 2, "protocol version 1"),
        ("job", "", "job: expected"),
        ("job", "a b", "job: expected"),
        ("job", 'x"}\n', "job: expected"),
        ("job", "x" * 129, "job: expected"),
        ("job", "ok\n", "job: expected"),
        ("job", 5, "job: expected"),
        ("rank", -1, "rank: must be between 0 and 0"),
        ("rank", 1, "rank: must be between 0 and 0"),
        ("rank", 1.0, "rank: expected an integer"),
        ("rank", True, "rank: expected an integer"),
        ("world_size", 0, "world_size: must be between"),
        ("kind", "serve", "kind: expected one of train, inference"),
        ("dtype", "bfloat16", "dtype: expected one of"),
        ("flops_per_token", 0, "flops_per_token: must be > 0"),
        ("flops_per_token", -1.0, "flops_per_token: must be > 0"),
        ("flops_per_token", "6e9", "flops_per_token: expected a number"),
        ("flops_per_token", 1e300, "flops_per_token: must be > 0 and <= "),
        ("peak_flops", float("nan"), "peak_flops: must be finite"),
        ("time", 12.5, "time: expected unix seconds"),
        ("time", float("inf"), "time: must be finite"),
        ("seq", -1, "seq: must be between"),
        ("pid", 0, "pid: must be between"),
        ("incarnation", "", "incarnation: expected"),
        ("incarnation", "a" * 65, "incarnation: expected"),
        ("devices", "0", "devices: expected a list"),
        ("devices", ["cuda:0"], "neither a GPU-/MIG- UUID nor an NVML index"),
        ("devices", ["\u0662"], "neither a GPU-/MIG- UUID nor an NVML index"),  # a digit, but not ASCII
        ("devices", ["0"] * 17, "devices: expected a list of at most 16"),
        ("totals", [], "totals: expected an object"),
        ("totals", {"steps": -1}, "totals.steps: must be >= 0"),
        ("totals", {"loss": 1}, "totals: unknown counter 'loss'"),
        ("totals", {"tokens": 10**400}, "totals.tokens: number too large"),
        ("step_seconds", {"counts": [0] * 3, "sum": 0}, "step_seconds.counts: expected a list of 17"),
        ("step_seconds", {"counts": [0] * 16 + [-1], "sum": 0}, "step_seconds.counts[16]: must be >= 0"),
        ("phases", {"Data Wait": 1.0}, "phases: name 'Data Wait' must match"),
        ("phases", {"data_wait": "1"}, "phases.data_wait: expected a number"),
        ("phases", {f"p{i}": 1.0 for i in range(17)}, "phases: at most 16 phases"),
        ("final", "yes", "final: expected true or false"),
        ("surprise", 1, "unknown field 'surprise'"),
    ],
)
def test_each_bad_field_is_refused_with_a_message_naming_it(field: str, value: object, message: str) -> None:
    data = report(5)
    data[field] = value
    with pytest.raises(InvalidReport) as exc:
        parse(data)
    assert message in str(exc.value)
    assert len(str(exc.value)) < 300, "a huge value must not be echoed whole"


@pytest.mark.parametrize("body", [None, [], "report", 3])
def test_a_body_that_is_not_an_object_is_refused(body: object) -> None:
    with pytest.raises(InvalidReport, match="must be a JSON object"):
        parse(body)


def test_devices_accept_uuids_mig_uuids_and_indexes_and_drop_repeats() -> None:
    devices = [
        "GPU-14d55335-a6d7-1452-05de-f286311f653e",
        "MIG-0b1c2d3e-0000-1111-2222-333344445555",
        "3",
        "3",
    ]
    assert parse(report(1, devices=devices)).devices == tuple(devices[:3])


def test_every_protocol_dtype_and_convention_is_accepted() -> None:
    for dtype in P.DTYPES:
        assert parse(report(1, dtype=dtype)).dtype == dtype
    for convention in P.CONVENTIONS:
        assert parse(report(1, flops_convention=convention)).flops_convention == convention


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["anchor"].update(tokens=10**6), "anchor.tokens: larger than totals.tokens"),
        (lambda d: d.update(updated=d["time"] + 3600), "updated: later than the report's own time"),
        (lambda d: d["anchor"].update(time=d["updated"] + 60), "anchor.time: later than updated"),
        (lambda d: d.update(started=d["time"] + 3600), "started: later than the report's own time"),
        (lambda d: d["step_seconds"]["counts"].__setitem__(0, 99), "step_seconds: more observations"),
        (lambda d: d.update(request_seconds=d["step_seconds"]), "request_seconds: more observations"),
        (lambda d: d.update(peak_flops=989.5), "give FLOP/s, not TFLOP/s"),
        (lambda d: d.update(peak_flops=5e-324), "below 1 GFLOP/s"),
        (lambda d: d.update(v=True), "protocol version 1"),
        (lambda d: d.update(v=1.0), "protocol version 1"),
    ],
)
def test_fields_that_contradict_each_other_are_refused(change, message) -> None:
    """What one honest incarnation cannot send: a rate derived from it would be negative, infinite or
    forever progressing."""
    data = report(10)
    change(data)
    with pytest.raises(InvalidReport, match=re.escape(message)):
        parse(data)


def test_the_sdk_s_per_call_bounds_fit_the_daemon_s_totals() -> None:
    """A value the SDK accepts can never make the daemon refuse the rank's later reports."""
    assert P.MAX_PER_CALL * 1000 < P.MAX_COUNT and P.MAX_PER_CALL_SECONDS * 100 < P.MAX_SECONDS
    data = report(1)
    data["totals"]["tokens"] = P.MAX_PER_CALL
    data["phases"] = {"data_wait": P.MAX_PER_CALL_SECONDS}
    assert parse(data).totals.tokens == P.MAX_PER_CALL


# ---- the optional fields of the goodput ledger and the allocator (protocol.EXTENSIONS) ------------------

LLAMA = {"layers": 32, "hidden": 4096, "heads": 32, "vocab": 32000, "seq_len": 4096, "name": "llama2-7b"}


def test_a_report_without_the_optional_fields_is_what_older_sdks_send() -> None:
    r = parse(report())
    assert (r.process_started, r.resumed_step, r.memory, r.setup) == (None, None, None, None)
    assert r.open_phases == {}


def test_the_optional_fields_are_parsed() -> None:
    data = report(
        process_started=T0 - 5,
        resumed_step=1200,
        open_phases={"checkpoint": 12.5},
        memory={"device": 1, "allocated_bytes": 10, "reserved_bytes": 20, "alloc_retries": 3, "ooms": 0},
        setup={"model": LLAMA, "micro_batch": 4, "zero_stage": 2, "checkpointing": "full", "tp": 2},
    )
    r = parse(data)
    assert (r.process_started, r.resumed_step, dict(r.open_phases)) == (T0 - 5, 1200, {"checkpoint": 12.5})
    assert r.memory is not None and (r.memory.device, r.memory.allocated_bytes, r.memory.ooms) == (1, 10, 0)
    assert r.memory.active_bytes is None  # not sent: unknown, not 0
    assert r.setup == {
        "model": LLAMA, "micro_batch": 4, "zero_stage": 2, "checkpointing": "full", "tp": 2
    }  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("process_started", T0 + 3600, "process_started: later than started"),
        ("process_started", 12.5, "process_started: expected unix seconds"),
        ("process_started", T0 - 31 * 86400, "process_started: 31 days before started (at most 30)"),
        ("resumed_step", -1, "resumed_step: must be between"),
        ("resumed_step", 1.5, "resumed_step: expected an integer"),
        ("open_phases", {"Bad Name": 1.0}, "open_phases: name"),
        ("open_phases", {"checkpoint": -1.0}, "open_phases.checkpoint: must be >= 0"),
        ("open_phases", {f"p{i}": 1.0 for i in range(17)}, "open_phases: at most 16"),
        ("memory", [], "memory: expected an object"),
        ("memory", {"allocated_bytes": -1}, "memory.allocated_bytes: must be between"),
        ("memory", {"allocated_bytes": 1.5}, "memory.allocated_bytes: expected an integer"),
        ("memory", {"num_ooms": 1}, "memory: unknown field 'num_ooms'"),
        ("memory", {"device": True}, "memory.device: expected an integer"),
        ("setup", {"micro_batch": 1}, "setup.model: expected an object"),
        (
            "setup",
            {"model": {**LLAMA, "layers": 0}, "micro_batch": 1},
            "setup.model.layers: must be between 1",
        ),
        (
            "setup",
            {"model": {"hidden": 8, "heads": 1, "vocab": 8, "seq_len": 8}, "micro_batch": 1},
            "setup.model.layers: required",
        ),
        (
            "setup",
            {"model": {**LLAMA, "experts": 8}, "micro_batch": 1},
            "setup.model: unknown field 'experts'",
        ),
        ("setup", {"model": {**LLAMA, "name": "a b"}, "micro_batch": 1}, "setup.model.name: expected"),
        ("setup", {"model": LLAMA, "micro_batch": 0}, "setup.micro_batch: must be between 1"),
        (
            "setup",
            {"model": LLAMA, "micro_batch": 1, "zero_stage": 4},
            "setup.zero_stage: must be between 0 and 3",
        ),
        (
            "setup",
            {"model": LLAMA, "micro_batch": 1, "optimizer": "lion"},
            "setup.optimizer: expected one of",
        ),
        ("setup", {"model": LLAMA, "micro_batch": 1, "pipeline": 4}, "setup: unknown field 'pipeline'"),
        ("setup", {"model": LLAMA, "micro_batch": 1, "offload": True}, "setup.offload: expected one of none"),
        (
            "setup",
            {"model": LLAMA, "micro_batch": 1, "flash_attention": 1},
            "setup.flash_attention: expected true",
        ),
    ],
)
def test_bad_optional_fields_are_refused_with_the_field_named(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(InvalidReport, match=re.escape(message)):
        parse(report(**{field: value}))


def test_the_protocol_choices_match_the_estimators() -> None:
    from gpumon.estimate.activations import CHECKPOINTING
    from gpumon.estimate.breakdown import OFFLOADS
    from gpumon.estimate.memory import OPTIMIZERS

    assert P.SETUP_CHOICES == {"optimizer": OPTIMIZERS, "checkpointing": CHECKPOINTING, "offload": OFFLOADS}
    assert set(P.MODEL_FIELDS) == {f.name for f in dataclasses.fields(ModelSpec)}


@pytest.mark.parametrize(
    ("predecessor", "message"),
    [
        ({"incarnation": "a1b2c3d4", "step": 5, "last_step": T0 - 10}, "this report's own"),
        ({"incarnation": "old", "step": -1, "last_step": T0 - 10}, "predecessor.step"),
        ({"incarnation": "../x", "step": 5, "last_step": T0 - 10}, "predecessor.incarnation"),
        ({"incarnation": "old", "step": 5, "last_step": T0 - 10, "pid": 1}, "unknown field"),
        ("a1", "predecessor: expected an object"),
    ],
)
def test_a_predecessor_must_be_another_process(predecessor: object, message: str) -> None:
    with pytest.raises(InvalidReport, match=message):
        parse({**report(3), "predecessor": predecessor})


def test_a_predecessor_is_parsed() -> None:
    p = parse(
        {**report(3), "predecessor": {"incarnation": "old", "step": 7, "last_step": T0 - 10}}
    ).predecessor
    assert p is not None and (p.incarnation, p.step, p.last_step) == ("old", 7, T0 - 10)
