"""One Inspector dump line → a record: the plugin's documented examples, and lines no plugin writes."""

from __future__ import annotations

import json

import pytest
from support.inspector import README_RECORD, line, record

from gpumon.nccl.records import MAX_LINE, BadRecord, parse


def test_the_readme_example_reads_as_documented() -> None:
    r = parse(line(README_RECORD))
    assert (r.hostname, r.pid, r.communicator, r.kind) == (
        "example-hostname",
        1639453,
        "0x7f8c496ae9f661",
        "coll",
    )
    assert (r.operation, r.sn, r.message_bytes) == ("AllReduce", 1407, 17179869184)
    assert r.seconds == pytest.approx(0.061974)
    assert r.bus_bytes_per_second == pytest.approx(485.119099e9)  # GB/s are 1e9 bytes


def test_a_verbose_record_and_a_point_to_point_one() -> None:
    verbose = record("node-1", 7, 1231, op="ReduceScatter")
    verbose["coll_perf"]["event_trace_sn"] = {"coll_start_sn": 1, "kernel_events": [{"channel_id": 0}]}
    assert parse(line(verbose)).operation == "ReduceScatter"
    send = parse(line(record("node-1", 7, 3, op="Send", p2p=True)))
    assert (send.kind, send.operation, send.sn) == ("p2p", "Send", 3)


def test_nan_bandwidth_is_unmeasured_not_an_error() -> None:
    assert parse(line(record("h", 1, 0, busbw_gbs="nan"))).bus_bytes_per_second is None


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda r: r["metadata"].update(inspector_output_format_version="v3.0"), "format_version"),
        (lambda r: r["metadata"].update(pid=-1), "metadata.pid"),
        (lambda r: r["metadata"].update(pid=True), "metadata.pid"),
        (lambda r: r["metadata"].update(hostname="a b"), "metadata.hostname"),
        (lambda r: r["metadata"].update(hostname="\u202eevil"), "metadata.hostname"),
        (lambda r: r["coll_perf"].update(coll_exec_time_us=1e300), "coll_exec_time_us"),
        (lambda r: r["coll_perf"].update(coll_exec_time_us=-5), "coll_exec_time_us"),
        (lambda r: r["coll_perf"].update(coll_busbw_gbs="inf"), "coll_busbw_gbs"),
        (lambda r: r["coll_perf"].update(coll_busbw_gbs=1e9), "coll_busbw_gbs"),
        (lambda r: r["coll_perf"].update(coll='All Reduce{x="1"}'), "coll_perf.coll"),
        (lambda r: r["coll_perf"].update(coll_sn="7"), "coll_sn"),
        (lambda r: r["coll_perf"].update(coll_exec_time_us=10**400), "coll_exec_time_us"),
        (lambda r: r.pop("coll_perf"), "neither"),
        (lambda r: r.update(header=[]), "header"),
    ],
)
def test_fields_out_of_type_or_range_are_refused_by_name(mutate, why: str) -> None:  # type: ignore[no-untyped-def]
    r = record("node-1", 7, 1)
    mutate(r)
    with pytest.raises(BadRecord, match=why):
        parse(line(r))


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"null", b"[1,2]", b"\xff\xfe", b"[" * 60_000 + b"]" * 60_000, b'{"header":' * 20_000],
)
def test_garbage_is_a_bad_record_never_an_exception_of_another_kind(raw: bytes) -> None:
    with pytest.raises(BadRecord):
        parse(raw)


def test_a_line_over_the_limit_is_refused_before_parsing() -> None:
    big = record("h", 1, 1)
    big["coll_perf"]["pad"] = "x" * MAX_LINE
    with pytest.raises(BadRecord, match="longer"):
        parse(json.dumps(big).encode())
