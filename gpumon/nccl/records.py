"""One line of an NCCL Inspector dump (output format v4) → a ``Record``, or ``BadRecord`` saying why.

The plugin (NVIDIA/nccl, plugins/profiler/inspector; ext-profiler/inspector before 2.29.7) writes one
compact JSON object per line and per completed operation of a communicator:

    {"header": {"id", "comm_name", "rank", "n_ranks", "nnodes"},
     "metadata": {"inspector_output_format_version": "v4.0", "git_rev", "rec_mechanism",
                  "dump_timestamp_us", "hostname", "pid"},
     "coll_perf": {"coll", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us", "coll_timing_source",
                   "coll_algobw_gbs", "coll_busbw_gbs", ...}}

with ``p2p_perf`` ({"p2p", "p2p_sn", "p2p_peer", "p2p_msg_size_bytes", "p2p_exec_time_us", ...}) in place of
``coll_perf`` for sends and receives, and (format v4.2) a ``dump_stats`` record per communicator and dump
with the plugin's own counts, which is no operation. Bandwidths are in GB/s (1e9 bytes); a bandwidth the
plugin could not compute is the string "nan". The dump directory is writable by every training process on
the node, so each field is checked for type and range, and a line is at most MAX_LINE bytes.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_LINE = 64 * 1024  # a verbose record with every channel's kernel events is a few kB
MAX_SECONDS = 3600.0  # one collective longer than an hour is not a measurement
MAX_GBS = 1e6  # GB/s: a thousand times any fabric's
MAX_BYTES = 1 << 50
_OPERATION = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_COMM = re.compile(r"[A-Za-z0-9_.:x-]{1,64}")


class BadRecord(ValueError):
    """The line is not a v4 record; the message says which field."""


@dataclass(frozen=True, slots=True)
class Record:
    hostname: str
    pid: int
    communicator: str  # the communicator's hash ("0x7f8c496ae9f661"), the same in each of its ranks
    rank: int  # the process's rank in it (one process may drive several GPUs, each its own rank)
    kind: str  # "coll" or "p2p"
    operation: str  # NCCL's name: AllReduce, AllGather, ReduceScatter, Broadcast, Send, Recv, ...
    sn: int  # the operation's sequence number in its communicator
    message_bytes: int
    seconds: float  # execution time
    bus_bytes_per_second: float | None  # NCCL's bus bandwidth; None where it wrote "nan"


def parse(line: bytes) -> Record | None:
    """The operation a line records; None for a v4 record of another kind (dump_stats)."""
    if len(line) > MAX_LINE:
        raise BadRecord(f"line longer than {MAX_LINE} bytes")
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: a line of nested brackets
        raise BadRecord("not JSON") from None
    if not isinstance(data, dict):
        raise BadRecord("not a JSON object")
    header, meta = _object(data, "header"), _object(data, "metadata")
    version = meta.get("inspector_output_format_version")
    if not isinstance(version, str) or not version.startswith("v4."):
        raise BadRecord(f"metadata.inspector_output_format_version: expected v4.x, got {_show(version)}")
    if "coll_perf" in data:
        kind, perf = "coll", _object(data, "coll_perf")
    elif "p2p_perf" in data:
        kind, perf = "p2p", _object(data, "p2p_perf")
    elif isinstance(data.get("dump_stats"), dict):
        return None
    else:
        raise BadRecord("neither coll_perf, p2p_perf nor dump_stats")
    return Record(
        hostname=_text(meta, "hostname", _HOST, "metadata."),
        pid=_int(meta, "pid", 1, 1 << 31, "metadata."),
        communicator=_text(header, "id", _COMM, "header."),
        rank=_int(header, "rank", 0, 1 << 24, "header."),
        kind=kind,
        operation=_text(perf, kind, _OPERATION, f"{kind}_perf."),
        sn=_int(perf, f"{kind}_sn", 0, 1 << 63, f"{kind}_perf."),
        message_bytes=_int(perf, f"{kind}_msg_size_bytes", 0, MAX_BYTES, f"{kind}_perf."),
        seconds=_number(perf, f"{kind}_exec_time_us", MAX_SECONDS * 1e6, f"{kind}_perf.") / 1e6,
        bus_bytes_per_second=_bandwidth(perf, f"{kind}_busbw_gbs", f"{kind}_perf."),
    )


def _object(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise BadRecord(f"{key}: expected an object")
    return value


def _text(data: dict[str, Any], key: str, pattern: re.Pattern[str], where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise BadRecord(f"{where}{key}: unexpected {_show(value)}")
    return value


def _int(data: dict[str, Any], key: str, lo: int, hi: int, where: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRecord(f"{where}{key}: expected an integer from {lo} to {hi}, got {_show(value)}")
    return value


def _number(data: dict[str, Any], key: str, hi: float, where: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRecord(f"{where}{key}: expected a number, got {_show(value)}")
    try:
        x = float(value)
    except OverflowError:
        raise BadRecord(f"{where}{key}: number too large") from None
    if not (math.isfinite(x) and 0 <= x <= hi):
        raise BadRecord(f"{where}{key}: expected 0 to {hi:g}, got {_show(value)}")
    return x


def _bandwidth(data: dict[str, Any], key: str, where: str) -> float | None:
    if data.get(key) == "nan":
        return None
    return _number(data, key, MAX_GBS, where) * 1e9


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
