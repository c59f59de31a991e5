"""One (job, rank) per process: a second Reporter of a rank in the same process (the loop's own and a
framework callback's, or two made by hand) counts into the first one's counters through its one sender, so
the daemon never sees two incarnations of one rank from one process: no 409s, no halved counts, no restart
that never happened. And when it does see that (an older SDK, two urls of one daemon), its 409 says so."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.helpers import ROOT, Daemon, start_daemon
from test_reporter import Server, sdk_logs

from gpumon.client import Reporter
from gpumon.client.integrations.owner import ReporterOwner
from gpumon.jobs.report import Report, parse
from gpumon.jobs.store import CONFLICT_GRACE, Conflict, JobStore


def _of_rank(bodies: list[dict[str, Any]], job: str, rank: int = 0) -> list[dict[str, Any]]:
    return [b for b in bodies if b["job"] == job and b["rank"] == rank]


def test_a_second_reporter_of_a_rank_counts_into_the_first_ones(
    server: Server, reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    srv = server()
    with caplog.at_level(logging.INFO, logger="gpumon.client"):
        first = reporters(url=srv.url, interval=60)
        second = reporters(url=srv.url, interval=60, dtype="bf16")
        other_rank = reporters(url=srv.url, interval=60, rank=1, world_size=2)
    assert second.shares_with is first
    assert other_rank.shares_with is None  # another rank is another Reporter
    assert second.incarnation == first.incarnation and second.settings is first.settings

    first.step(tokens=10, samples=1)
    second.step(tokens=20, samples=2)
    with second.data_wait():
        time.sleep(0.01)
    second.add_phase("checkpoint", 0.5)
    assert first.totals == second.totals
    assert first.totals["steps"] == 2 and first.totals["tokens"] == 30

    # one warning, naming the rank, this process and the argument that was not used
    (warning,) = sdk_logs(caplog, "second Reporter")
    assert f"job 'test-job' rank 0 in this process (pid {os.getpid()})" in warning
    assert "its own dtype ignored" in warning

    second.close(timeout=0.5)  # not the last handle: no final report, the first goes on
    assert first.enabled and not second.enabled
    second.step(tokens=1000)  # a closed handle counts nothing
    first.step(tokens=5)
    assert not any(b["final"] for b in _of_rank(srv.bodies, "test-job"))
    first.close(timeout=0.5)  # the last: the final report, with everything both counted

    bodies = _of_rank(srv.bodies, "test-job")
    assert {b["incarnation"] for b in bodies} == {first.incarnation}
    (final,) = [b for b in bodies if b["final"]]
    assert final["totals"] == {"steps": 3, "tokens": 35, "samples": 3, "requests": 0}
    assert final["phases"]["checkpoint"] == 0.5 and final["phases"]["data_wait"] >= 0.01

    # once both are closed, the rank's next Reporter (the next run in a notebook) is a new incarnation
    again = reporters(url=srv.url, interval=60)
    assert again.shares_with is None and again.incarnation != first.incarnation


def test_a_framework_callback_reports_through_the_loops_own_reporter(
    server: Server, reporters: Callable[..., Reporter], caplog: pytest.LogCaptureFixture
) -> None:
    srv = server()
    own = reporters(url=srv.url, interval=60)
    # what GpumonCallback(job=..., url=...) does at train start (both integrations share this code)
    callback = ReporterOwner(None, {"job": "test-job", "rank": 0, "world_size": 1, "url": srv.url})
    with caplog.at_level(logging.INFO, logger="gpumon.client"):
        callback._open("fp32", 0, 1, 0, None)
    assert callback.reporter is not None and callback.reporter.shares_with is own
    assert not sdk_logs(caplog, "Reporter")  # what was asked for: no warning
    assert sdk_logs(caplog, "the callback reports through this process's Reporter", logging.INFO)

    callback.reporter.step(tokens=7, samples=1)
    own.step(tokens=3, samples=1)
    callback._close()  # the end of training: the callback lets go, the loop's Reporter goes on
    assert callback.reporter is None and own.enabled
    assert own.totals["steps"] == 2
    own.close(timeout=0.5)
    bodies = _of_rank(srv.bodies, "test-job")
    assert {b["incarnation"] for b in bodies} == {own.incarnation}
    (final,) = [b for b in bodies if b["final"]]
    assert final["totals"] == {"steps": 2, "tokens": 10, "samples": 2, "requests": 0}


EXITING = """
import gc, sys
from gpumon.client import Reporter
first = Reporter(url=sys.argv[1], job="exit-twice", rank=0, world_size=1, interval=60)
second = Reporter(url=sys.argv[1], job="exit-twice", rank=0, world_size=1, interval=60)
dropped = Reporter(url=sys.argv[1], job="exit-twice", rank=0, world_size=1, interval=60)
for r in (first, second, dropped):
    r.step(tokens=10)
del dropped  # collected unclosed: its counts stay in the shared ones
gc.collect()
"""


def test_handles_left_open_at_exit_send_one_final_report(server: Server) -> None:
    srv = server()
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EXITING), srv.url],
        capture_output=True, text=True, timeout=30, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    srv.wait_for(lambda b: b["final"], timeout=2)
    time.sleep(0.2)  # a second final report, if any, would follow at once
    bodies = _of_rank(srv.bodies, "exit-twice")
    assert len({b["incarnation"] for b in bodies}) == 1
    (final,) = [b for b in bodies if b["final"]]
    assert final["totals"]["steps"] == 3 and final["totals"]["tokens"] == 30


def test_the_daemon_names_one_process_when_two_of_its_reporters_claim_a_rank(
    reporters: Callable[..., Reporter],
) -> None:
    """Two urls of one daemon (or an SDK older than the sharing) still make two incarnations of one rank in
    one process: the 409 must say that, not name the same pid as two processes."""
    older = reporters(job="twice", url="http://127.0.0.1:9", interval=60)
    time.sleep(0.01)  # started strictly later
    newer = reporters(job="twice", url="http://localhost:9", interval=60)
    assert newer.incarnation != older.incarnation  # the SDK cannot know the two urls are one daemon

    def report(r: Reporter, seq: int, later: float = 0.0) -> Report:
        body = r._report(False)
        body["seq"], body["time"] = seq, body["time"] + later
        return parse(json.loads(json.dumps(body)))

    store = JobStore(max_jobs=4, max_ranks=4, ttl=60.0, window=60.0)
    now = time.time()
    store.ingest(report(older, 0), now)
    store.ingest(report(newer, 0), now)
    late = CONFLICT_GRACE + 1.0
    with pytest.raises(Conflict) as conflict:
        store.ingest(report(older, 1, late), now + late)
    detail = str(conflict.value)
    assert f"two Reporters in one process (pid {os.getpid()})" in detail
    assert older.incarnation in detail and newer.incarnation in detail

    # one incarnation sent by two senders of this process (a copied Reporter): said so too
    store.ingest(report(newer, 5, late), now + late)
    with pytest.raises(Conflict) as shared:
        store.ingest(report(newer, 3, 3 * late), now + 3 * late)
    assert f"two senders in one process (pid {os.getpid()})" in str(shared.value)
    assert "pids" not in str(shared.value)


# ---- with a real daemon ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = start_daemon("--simulate", "1xH100-SXM")
    yield d
    d.stop()


@pytest.mark.slow
def test_two_reporters_of_a_rank_in_one_process_count_once_at_the_daemon(
    daemon: Daemon, reporters: Callable[..., Reporter]
) -> None:
    job = "one-process-two-reporters"
    first = reporters(url=daemon.url, job=job, interval=0.05)
    second = reporters(url=daemon.url, job=job, interval=0.05)
    for _ in range(10):
        first.step(tokens=100, samples=1)
        second.step(tokens=100, samples=1)
        time.sleep(0.02)
    time.sleep(CONFLICT_GRACE + 0.5)  # past the daemon's grace for a late report of a replaced process
    first.step(tokens=100, samples=1)
    assert first.flush(timeout=5) and second.flush(timeout=5)  # neither is refused
    second.close(timeout=5)
    first.close(timeout=5)

    answer = daemon.get(f"/v1/jobs/{job}")
    answer.raise_for_status()
    (rank,) = answer.json()["ranks"]
    assert rank["totals"]["steps"] == 21 and rank["totals"]["tokens"] == 2100
    assert rank["restarts"] == 0
    conflicts = [
        line
        for line in daemon.get("/metrics").text.splitlines()
        if line.startswith("gpumon_ingest_reports_total") and 'outcome="conflict"' in line
    ]
    assert all(line.endswith(" 0") or line.endswith(" 0.0") for line in conflicts), conflicts
