"""NCCL Inspector dump lines as the plugin writes them (output format v4.0: one compact JSON object and a
newline per operation, plugins/profiler/inspector/inspector_json.cc), for tests: NCCL is not available
here."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

# the record of the plugin's README ("Output Example"), field for field, as one line
README_RECORD = {
    "header": {"id": "0x7f8c496ae9f661", "rank": 2, "n_ranks": 8, "nnodes": 1},
    "metadata": {
        "inspector_output_format_version": "v4.0",
        "git_rev": "",
        "rec_mechanism": "profiler_plugin",
        "dump_timestamp_us": 1748030377748202,
        "hostname": "example-hostname",
        "pid": 1639453,
    },
    "coll_perf": {
        "coll": "AllReduce",
        "coll_sn": 1407,
        "coll_msg_size_bytes": 17179869184,
        "coll_exec_time_us": 61974,
        "coll_algobw_gbs": 277.210914,
        "coll_busbw_gbs": 485.119099,
    },
}


def record(
    host: str,
    pid: int,
    sn: int,
    *,
    op: str = "AllReduce",
    comm: str = "0xe62dedaa97644a",
    seconds: float = 0.040,
    busbw_gbs: float | str = 40.0,
    size: int = 1 << 30,
    p2p: bool = False,
) -> dict[str, Any]:
    kind = "p2p" if p2p else "coll"
    perf: dict[str, Any] = {
        kind: op,
        f"{kind}_sn": sn,
        f"{kind}_msg_size_bytes": size,
        f"{kind}_exec_time_us": round(seconds * 1e6),
        f"{kind}_timing_source": "kernel_gpu",
        f"{kind}_algobw_gbs": busbw_gbs,
        f"{kind}_busbw_gbs": busbw_gbs,
    }
    if p2p:
        perf["p2p_peer"] = 1
    return {
        "header": {"id": comm, "comm_name": "DP Group 0", "rank": 0, "n_ranks": 16, "nnodes": 2},
        "metadata": {
            "inspector_output_format_version": "v4.0",
            "git_rev": "9019a1912",
            "rec_mechanism": "nccl_profiler_interface",
            "dump_timestamp_us": 1752867229276385,
            "hostname": host,
            "pid": pid,
        },
        f"{kind}_perf": perf,
    }


def line(rec: dict[str, Any]) -> bytes:
    return json.dumps(rec, separators=(",", ":")).encode() + b"\n"


def dump_path(directory: Path, host: str, pid: int) -> Path:
    return directory / f"{host}-pid{pid}.log"


def append(directory: Path, host: str, pid: int, records: list[dict[str, Any]]) -> Path:
    path = dump_path(directory, host, pid)
    with path.open("ab") as f:
        f.write(b"".join(line(r) for r in records))
    return path


class Writer:
    """A stand-in for the plugin in simulated training processes (NCCL is not available here): every
    ``every`` seconds, appends an AllReduce and an AllGather record for each process, at ``busbw_gbs``."""

    def __init__(
        self, directory: Path, processes: list[tuple[str, int]], every: float = 1.0, busbw_gbs: float = 40.0
    ) -> None:
        self.directory, self.processes, self.every, self.busbw = directory, processes, every, busbw_gbs
        self.sn = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="inspector-writer", daemon=True)

    def start(self) -> Writer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)

    def _run(self) -> None:
        while not self.stopping.wait(self.every):
            self.sn += 1
            for host, pid in self.processes:
                records = [
                    record(host, pid, self.sn, seconds=0.2, busbw_gbs=self.busbw),
                    record(
                        host, pid, self.sn, op="AllGather", comm="0x5a5a", seconds=0.05, busbw_gbs=self.busbw
                    ),
                ]
                append(self.directory, host, pid, records)
