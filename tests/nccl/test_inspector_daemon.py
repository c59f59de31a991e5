"""A real daemon over loopback reads NCCL Inspector dumps written as the plugin writes them, joins them to the
rank that reports the same hostname and pid, and shows NCCL's bus bandwidth in counters and verdict."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import Daemon, require_tool
from support.inspector import append, record
from support.poll import poll
from support.reports import now_report

from gpumon.client import protocol as P

HOST = "trainer-0"


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    }


def post(d: Daemon, body: dict[str, object]) -> httpx.Response:
    return d.client.post(P.PATH, content=json.dumps(body).encode())


def started(daemon: Callable[..., Daemon], tmp_path: Path) -> Daemon:
    """A daemon whose reader has made its first pass (files before it are read from their end)."""
    d = daemon("--simulate", "2xH100-SXM", "--nccl-inspector-dir", str(tmp_path))
    poll(lambda: any("read from their end" in line for line in d.log), 15, "the first pass")
    return d


def test_records_join_the_rank_that_reports_their_hostname_and_pid(
    daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = started(daemon, tmp_path)
    pid = os.getpid()  # alive: the rank is not judged gone
    t = time.time()
    for seq, (steps, comm) in enumerate([(100, 0.0), (110, 0.6)], 1):
        rep = now_report(steps, t=t - 2 + seq, seq=seq, hostname=HOST, pid=pid, world_size=16)
        rep["phases"] = {"communication": comm}
        assert post(d, rep).status_code == 204
    append(tmp_path, HOST, pid, [record(HOST, pid, n, seconds=0.3, busbw_gbs=40.0) for n in range(1, 11)])
    append(
        tmp_path, HOST, pid, [record(HOST, pid, 1, op="AllGather", comm="0xaa", seconds=0.1, busbw_gbs=80.0)]
    )
    # another process on the node (a job that does not report): not even read
    append(tmp_path, "other-host", 99, [record("other-host", 99, 1)])
    job = (("job_name", "llm"), ("operation", "AllReduce"))

    def joined() -> str | None:
        text = d.get("/metrics").text
        return text if samples(text, "gpumon_training_nccl_operations_total").get(job) == 10 else None

    text = poll(joined, 20, "the records joined to the rank")
    assert samples(text, "gpumon_training_nccl_seconds_total")[job] == pytest.approx(3.0)
    assert samples(text, "gpumon_training_nccl_bus_bytes_total")[job] == pytest.approx(3.0 * 40e9)
    gather = (("job_name", "llm"), ("operation", "AllGather"))
    assert samples(text, "gpumon_training_nccl_bus_bytes_total")[gather] == pytest.approx(0.1 * 80e9)
    assert samples(text, "gpumon_training_nccl_records_total")[(("outcome", "counted"),)] == 11
    assert len(samples(text, "gpumon_training_nccl_operations_total")) == 2  # only the job's
    # the verdict shows NCCL's own figure beside the NICs' (the simulated NICs idle: waiting on peers)
    doc = d.get("/v1/jobs/llm").json()
    summary = doc["diagnosis"]["summary"]
    assert doc["diagnosis"]["bottleneck"] == "communication"
    assert "NCCL's bus bandwidth 41.3 GB/s (AllReduce)" in summary, summary  # (3*40 + 0.1*80) / 3.1
    rank = doc["ranks"][0]["diagnosis"]["summary"]
    assert "NCCL's bus bandwidth" in rank
    check = subprocess.run(
        [require_tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_only_ranks_that_report_their_hostname_join_and_only_their_files_are_read(
    daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = started(daemon, tmp_path)
    pid = os.getpid()
    old = now_report(50, pid=pid, job="old-sdk")  # an SDK older than the hostname field
    assert post(d, old).status_code == 204
    assert post(d, now_report(50, pid=pid, job="new-sdk", hostname="trainer-1")).status_code == 204
    append(tmp_path, HOST, pid, [record(HOST, pid, 1)])  # nobody reports trainer-0: never read
    append(tmp_path, "trainer-1", pid, [record("trainer-1", pid, n) for n in (1, 2, 3)])
    new = (("job_name", "new-sdk"), ("operation", "AllReduce"))
    poll(
        lambda: samples(d.get("/metrics").text, "gpumon_training_nccl_operations_total").get(new) == 3,
        15,
        "joined",
    )
    text = d.get("/metrics").text
    assert samples(text, "gpumon_training_nccl_records_total")[(("outcome", "counted"),)] == 3
    assert samples(text, "gpumon_training_nccl_files") == {(("state", "read"),): 1, (("state", "unread"),): 0}
    assert {k[0][1] for k in samples(text, "gpumon_training_nccl_operations_total")} == {"new-sdk"}
    plain = daemon("--simulate", "1xH100-SXM")
    assert "gpumon_training_nccl" not in plain.get("/metrics").text


def test_a_hostile_dump_directory_costs_the_records_not_the_daemon(
    daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    d = started(daemon, tmp_path)
    for rank, host in enumerate(("fifo", "link", "deep", "nonl")):  # ranks whose files are hostile
        rep = now_report(5, job="hostile", rank=rank, world_size=4, hostname=host, pid=5 + rank)
        assert post(d, rep).status_code == 204
    os.mkfifo(tmp_path / "fifo-pid5.log")
    os.symlink("/etc/passwd", tmp_path / "link-pid6.log")
    (tmp_path / "deep-pid7.log").write_bytes(
        b"[" * 200_000 + b"\n" + b"{" * 10 + b"\n" + b"\xff" * 1000 + b"\n"
    )
    (tmp_path / "nonl-pid8.log").write_bytes(b"x" * (3 << 20))  # a line without end
    poll(
        lambda: (
            samples(d.get("/metrics").text, "gpumon_training_nccl_records_total").get(
                (("outcome", "invalid"),)
            )
            == 2
        ),
        15,
        "the invalid lines counted",
    )
    text = d.get("/metrics").text
    assert samples(text, "gpumon_training_nccl_skipped_bytes_total")[()] >= 3 << 20
    assert d.proc.poll() is None and d.get("/metrics").status_code == 200
    assert not [line for line in d.log if "Traceback" in line]
