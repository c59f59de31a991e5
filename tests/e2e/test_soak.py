"""Soak, CI form (issue 7): about three simulated hours of churn in under a minute leave the daemon as it was.

A real ``gpumon serve --simulate 8xH100-SXM --sim-speed 240 --rank-ttl 3s`` runs node jobs that start and stop
(their processes with them), GPUs lost and back, a hung call, NVML errors, a driver reload, a slowdown and
XIDs of five codes, while real SDK processes report one short job after another (every third SIGKILLed).
Its threads, open fds and series at the end, once everything is over, are those it had after warm-up, but
for the series that are cumulative by design and bounded by what happened (tests/support/soak.py says
which). The full simulated day, with its figures, is bench/bench_soak.py.

Below: the leaks the soak's review found, each with a test that fails without its fix.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import pytest
from support import soak
from support.reports import T0, report

from gpumon.gpu.sim import SimNvml
from gpumon.jobs.report import parse
from gpumon.jobs.store import JobStore

pytestmark = pytest.mark.slow  # hours of simulated churn

# 240x: a 20-60 minute node job lasts 5-15 s; faults span 28 s of real time (almost 2 simulated hours). The
# warm-up point comes by 10 s (the seed's first node job ends at 7.8 s, the next starts at 8.4 s)
CI_PLAN = soak.Plan(speed=240, active=(12.0, 40.0), settle=8.0, job_seconds=4.0, ranks=4, crash_every=3)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> soak.Result:
    log = tmp_path_factory.mktemp("soak") / "daemon.log"
    r = soak.run(CI_PLAN, log_file=log)
    print(soak.markdown([r]))
    print(r.figures())
    return r


def test_the_run_played_hours_of_lost_gpus_process_churn_and_sdk_jobs(result: soak.Result) -> None:
    assert CI_PLAN.simulated_hours >= 3
    assert soak.checks(result)["exercised"] == [], result.figures()


def test_threads_and_open_fds_end_as_they_were_after_warm_up_and_rss_stays_put(result: soak.Result) -> None:
    assert soak.checks(result)["footprint"] == [], result.figures()


def test_the_series_end_as_they_were_but_for_bounded_cumulative_ones(result: soak.Result) -> None:
    assert soak.checks(result)["series"] == [], result.figures()
    assert set(result.cumulative_added()) <= set(soak.CUMULATIVE)


def test_every_injected_xid_is_counted_on_its_gpu_and_nothing_else_is_invented(result: soak.Result) -> None:
    assert soak.checks(result)["xids"] == []


def test_error_counters_exist_only_for_the_gpus_a_fault_touched(result: soak.Result) -> None:
    assert soak.checks(result)["errors"] == []


def test_no_series_of_an_ended_sdk_job_remains_but_its_lost_ranks_counter(result: soak.Result) -> None:
    assert soak.checks(result)["jobs"] == []


def test_every_report_and_scrape_was_accepted_and_the_daemon_logged_no_error(result: soak.Result) -> None:
    found = soak.checks(result)
    assert found["ingest"] == [] and found["scrapes"] == [] and found["daemon"] == []


# -- leaks found while building the soak ---------------------------------------------------------------------
def test_a_gone_rank_keeps_its_counters_but_not_its_report_history() -> None:
    """A rank that went (finished or silent) is kept an hour so that a process coming back as the same
    (job, rank) continues its counters; it used to keep its whole window of report points too: ~9 MiB per
    256 ranks reporting once a second, up to ~300 MiB at 4 x --max-ranks gone ranks reporting 10 times a
    second. Now only the latest report stays, a tenth of that or less."""
    store = JobStore(max_jobs=8, max_ranks=64, ttl=60.0, window=60.0)
    reports = [
        parse(report(seq * 10, t=T0 + seq, seq=seq, job=f"j{rank // 8}", rank=rank % 8, world_size=8,
                     phases={"data_wait": 0.1 * seq, "forward_backward": 0.7 * seq}))
        for seq in range(1, 61) for rank in range(64)
    ]  # fmt: skip
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for r in reports:
            store.ingest(r, r.time)
        del reports
        gc.collect()
        live = tracemalloc.get_traced_memory()[0] - base
        assert len(store.views(T0 + 60)) == 64
        assert store.views(T0 + 200) == []  # all silent past the TTL: gone
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert kept < 0.25 * live, f"gone ranks hold {kept / 2**20:.2f} MiB of the {live / 2**20:.2f} MiB live"
    phases = {"data_wait": 7.0, "forward_backward": 49.0}
    revived = parse(report(700, t=T0 + 300, seq=70, job="j0", rank=0, world_size=8, phases=phases))
    store.ingest(revived, T0 + 300)
    (view,) = store.views(T0 + 300)
    assert view.report.totals.steps == 700 and len(view.points) == 1, "it continues where it was"


def test_the_simulated_proc_tree_drops_a_process_when_no_gpu_lists_it(sims, clock) -> None:
    """A simulated day runs dozens of node jobs, a process per GPU each: their /proc entries used to stay
    for good (files on disk and a set entry per pid); as in /proc, they now go when the process ends."""
    sim: SimNvml = sims("2xH100-SXM", clock=clock, speed=600)
    sim.nvmlInit()
    root = Path(sim.proc_root())
    try:
        seen: set[str] = set()
        for _ in range(60):  # 10 simulated hours in steps of 10 simulated minutes
            listed = set()
            for i in range(2):
                handle = sim.nvmlDeviceGetHandleByIndex(i)
                listed |= {str(p.pid) for p in sim.nvmlDeviceGetComputeRunningProcesses(handle)}
            seen |= listed
            assert set(os.listdir(root)) == listed
            clock.advance(1.0)
        assert len(seen) >= 10, "the node's jobs came and went"
        sim.gpus[0].processes = []  # a fixed list from a test replaces the job's process on GPU 0 only
        listed = {str(p.pid) for p in sim.nvmlDeviceGetComputeRunningProcesses(sim.gpus[1])}
        sim.nvmlDeviceGetComputeRunningProcesses(sim.gpus[0])
        assert set(os.listdir(root)) == listed
    finally:
        sim.remove_proc_root()
