"""Verdicts where fleets live: shared GPUs, finished and killed processes, throttling with and without a cost,
and a verdict that does not flip with one window."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pynvml
import pytest
from support.helpers import set_state
from support.reports import report

from gpumon.client.model import preset
from gpumon.client.process.start import process_start_time
from gpumon.client.protocol import MODEL_FIELDS
from gpumon.gpu.sim.device import SimProcess
from gpumon.gpu.snapshot import Snapshot
from gpumon.jobs.analysis import SETTLED_POINTS, Analysis
from gpumon.jobs.collector import IngestStats, TrainingCollector
from gpumon.jobs.diagnosis.state import REFERENCE_EVERY, SpeedReference, VerdictHold
from gpumon.jobs.jobjson import job_json
from gpumon.jobs.report import parse
from gpumon.jobs.store import JobStore
from gpumon.net.rdma import RdmaPort


@pytest.fixture
def gpu(sims, samplers):
    """One busy simulated H100 (97 % utilisation), no clock limits unless a test sets them."""
    sim = sims("1xH100-SXM", static=True)
    set_state(sim, 0)
    sim.gpus[0].state.reasons = pynvml.nvmlClocksEventReasonSwPowerCap
    return sim, samplers(sim)


RATES = frozenset({"rank-rates"})  # the per-rank windowed figures, opt-in


def store() -> JobStore:
    return JobStore(max_jobs=8, max_ranks=16, ttl=600.0, window=60.0)


def ingest_rank(
    s: JobStore,
    job: str,
    *,
    pid: int,
    phases_per_step: dict[str, float] | None = None,
    step_seconds: float = 0.5,
    steps: int = 40,
    end: float | None = None,
    received: float | None = None,
    **kw,
) -> None:
    """Two reports of one rank ``steps`` steps apart, its last step at ``end`` (default now)."""
    end = time.time() if end is None else end
    started = end - steps * step_seconds - 1.0
    incarnation = f"{job}-{pid}"[:64]
    for n, seq in ((steps // 2, 5), (steps, 9)):
        phases = {name: n * per for name, per in (phases_per_step or {}).items()}
        r = report(
            n,
            started=started,
            step_seconds=step_seconds,
            phases=phases,
            job=job,
            pid=pid,
            seq=seq,
            incarnation=incarnation,
            **kw,
        )
        s.ingest(parse(r), time.time() if received is None else received)


def test_the_readme_walkthrough_on_a_shared_gpu_is_input_bound(gpu) -> None:
    """The README's example waits 60 % on data on the GPU a demo job keeps 97 % busy: the GPU's activity is
    the other job's, so the example is input-bound (it was compute), and both say the GPU is shared."""
    _, sampler = gpu
    snap = sampler.sweep()
    s = store()
    ingest_rank(s, "tiny", pid=101, phases_per_step={"data_wait": 0.3})
    ingest_rank(s, "llama-70b", pid=202, phases_per_step={"data_wait": 0.005, "communication": 0.05})
    jobs = {j.job: j for j in Analysis(s, lambda: snap).jobs()}
    tiny, llama = jobs["tiny"], jobs["llama-70b"]
    assert tiny.verdict.bottleneck == "input", tiny.verdict.summary
    assert "gpu_shared" in tiny.verdict.findings
    assert any("llama-70b (GPU 0)" in n and "not attributable" in n for n in tiny.verdict.notes)
    assert llama.verdict.bottleneck == "compute" and "gpu_shared" in llama.verdict.findings
    assert tiny.ranks[0].signals.utilization is None, "the whole GPU's utilisation is not the example's"
    doc = job_json(tiny, 60.0)
    assert doc["diagnosis"]["notes"] and doc["ranks"][0]["gpus"][0]["shared_with"] == ["llama-70b"]


def test_nvml_per_process_use_attributes_a_shared_gpu(gpu) -> None:
    """Two processes NVML lists on one GPU, each sampled: each rank's activity is its own."""
    sim, sampler = gpu
    sim.gpus[0].processes = [
        SimProcess(pid=101, used_memory=10 << 30, sm_util=0.92),
        SimProcess(pid=202, used_memory=10 << 30, sm_util=0.05),
    ]
    snap = sampler.sweep()
    s = store()
    ingest_rank(s, "busy", pid=101)
    ingest_rank(s, "starved", pid=202, phases_per_step={"data_wait": 0.35})
    jobs = {j.job: j for j in Analysis(s, lambda: snap).jobs()}
    busy, starved = jobs["busy"].ranks[0], jobs["starved"].ranks[0]
    assert busy.signals.utilization == pytest.approx(0.92) and busy.signals.own_utilization
    assert busy.verdict.bottleneck == "compute"
    assert any("own SM use is 92 %" in n for n in busy.verdict.notes)
    assert starved.signals.utilization == pytest.approx(0.05)
    assert starved.verdict.bottleneck == "input"


def test_a_process_no_rank_reports_from_makes_the_gpu_shared(gpu) -> None:
    sim, sampler = gpu
    sim.gpus[0].processes = [
        SimProcess(pid=101, used_memory=1 << 30),
        SimProcess(pid=999, used_memory=1 << 30),
    ]
    snap = sampler.sweep()
    s = store()
    ingest_rank(s, "mine", pid=101)
    (job,) = Analysis(s, lambda: snap).jobs()
    assert job.ranks[0].gpus[0].shared_with == ("pid 999",)
    assert "gpu_shared" in job.verdict.findings


def test_per_process_use_is_read_on_a_gpu_with_two_processes_without_the_opt_in(sims, samplers) -> None:
    sim = sims("1xH100-SXM", static=True)
    sampler = samplers(sim, details=frozenset())
    sim.gpus[0].processes = [SimProcess(pid=101, used_memory=1 << 30, sm_util=0.5)]
    (one,) = sampler.sweep().gpus[0].reading.processes
    assert one.sm_utilization_ratio is None, "one process: no extra NVML call without --collect"
    sim.gpus[0].processes.append(SimProcess(pid=202, used_memory=1 << 30, sm_util=0.25))
    two = sampler.sweep().gpus[0].reading.processes
    assert [p.sm_utilization_ratio for p in two] == [0.5, 0.25]


def test_a_finished_job_keeps_its_last_window(gpu) -> None:
    """25 s after its final report, a finished job shows the tokens/s it ended with, not 0, and says
    finished; before the change it read 0 tokens/s."""
    _, sampler = gpu
    snap = sampler.sweep()
    s = store()
    ingest_rank(s, "done", pid=101, final=True)
    (job,) = Analysis(s, lambda: snap).jobs(now=time.time() + 25.0)
    assert job.tokens_per_second == pytest.approx(1000 / 0.5, rel=0.05)
    assert "finished" in job.verdict.findings and job.verdict.summary.startswith("finished;")
    assert job.verdict.bottleneck == "compute"


def test_a_killed_process_is_exited_and_its_idle_gpu_is_not_called_busy(sims, samplers) -> None:
    sim = sims("1xH100-SXM", static=True)
    sim.gpus[0].state.util = 0.0
    sampler = samplers(sim)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.time() + 10
        while (born := process_start_time(f"/proc/{child.pid}/stat")) is None and time.time() < deadline:
            time.sleep(0.01)
        assert born is not None
        s = store()
        time.sleep(max(0.0, born + 2.2 - time.time()))  # its Reporter starts after the process
        ingest_rank(s, "victim", pid=child.pid, steps=4, step_seconds=0.25, process_started=born)
        a = Analysis(s, sampler.sweep)
        first = a.jobs()[0]
        assert first.verdict.bottleneck != "exited", "alive: confirmed, not gone"
        child.kill()  # not reaped yet: a zombie keeps its /proc entry, and is gone all the same
        time.sleep(0.2)
        (job,) = a.jobs(now=time.time() + 2.0)
        assert job.verdict.bottleneck == "exited", job.verdict.summary
        assert f"pid {child.pid}" in job.verdict.summary and "idle now" in job.verdict.summary
        assert "busy" not in job.verdict.summary
    finally:
        child.kill()
        child.wait()


def test_a_pid_the_daemon_cannot_see_is_never_called_exited(gpu) -> None:
    """Another pid namespace: the pid is not in our /proc from the start, so nothing is known of it."""
    _, sampler = gpu
    snap = sampler.sweep()
    s = store()
    ingest_rank(s, "elsewhere", pid=4_000_000)
    a = Analysis(s, lambda: snap)
    for later in (0.0, 2.0, 4.0):
        assert a.jobs(now=time.time() + later)[0].verdict.bottleneck != "exited"


def test_throttling_is_the_verdict_only_when_the_job_pays_for_it(gpu) -> None:
    sim, sampler = gpu
    sim.gpus[0].state.reasons = pynvml.nvmlClocksEventReasonSwThermalSlowdown
    snap = sampler.sweep()
    s = store()
    ingest_rank(s, "hot", pid=101)
    a = Analysis(s, lambda: snap)
    (job,) = a.jobs()
    assert job.verdict.bottleneck == "compute" and "clocks_limited" in job.verdict.findings
    s.baseline_steps["hot"] = 0.4  # its baseline ran 0.4 s steps; it now takes 0.5 s
    (job,) = a.jobs()
    assert job.verdict.bottleneck == "compute", "a verdict between bottlenecks waits to settle"
    a.holds.settle = 0.0  # as if SETTLE_SECONDS of evaluations had passed (the steps would have gone stale)
    (job,) = a.jobs()
    assert job.verdict.bottleneck == "throttled" and "25 % slower than its baseline" in job.verdict.summary


def test_the_reference_speed_is_the_unthrottled_median() -> None:
    ref = SpeedReference()
    t = 1000.0
    for i, cost in enumerate((1.0, 1.02, 0.98, 1.0)):
        assert ref.slowdown("k", cost, True, t + i * REFERENCE_EVERY)[1] == "recent"
    later = t + 10 * REFERENCE_EVERY
    slow, against = ref.slowdown("k", 1.3, False, later)  # throttled: compared, never the reference
    assert against == "recent" and slow == pytest.approx(0.3)
    assert ref.slowdown("k", 1.3, False, later + REFERENCE_EVERY)[0] == pytest.approx(0.3)
    assert ref.slowdown("k", 0.7, True, later, baseline=(1.0, 0.8)) == (pytest.approx(0.25), "baseline")
    assert ref.slowdown("new", 1.0, False, later) == (None, None)


def test_a_verdict_changes_only_after_it_settles_and_facts_at_once() -> None:
    hold = VerdictHold(settle=10.0)
    assert hold.hold("k", "compute", 0.0) == "compute"
    assert hold.hold("k", "throttled", 2.0) == "compute"
    assert hold.hold("k", "compute", 4.0) == "compute", "one excursion"
    assert hold.hold("k", "throttled", 6.0) == "compute"
    assert hold.hold("k", "throttled", 15.0) == "compute", "9 s: not yet"
    assert hold.hold("k", "throttled", 16.0) == "throttled"
    assert hold.hold("k", "exited", 17.0) == "exited", "a fact at once"
    assert hold.hold("k", "input", 18.0) == "input", "and left at once"
    assert hold.hold("k", "undetermined", 19.0) == "input", "a claim is not dropped for one window"
    assert hold.hold("k", "stalled", 20.0) == "stalled", "progress stopping is a fact"
    assert hold.hold("k", "idle", 21.0) == "stalled", "idle or stalled: GPU activity near a threshold"
    assert hold.hold("k", "idle", 31.0) == "idle"
    assert hold.hold("k", "compute", 32.0) == "compute", "progress resuming is a fact"
    assert hold.hold("first", "undetermined", 0.0) == "undetermined"
    assert hold.hold("first", "input", 1.0) == "input", "out of undetermined at once"
    assert hold.hold("first", "compute", 2.0) == "input"
    assert hold.hold("first", "compute", 70.0) == "compute", "a key back after a minute starts afresh"


def test_a_device_this_node_does_not_have_is_said(gpu) -> None:
    _, sampler = gpu
    snap = sampler.sweep()
    s = store()
    ingest_rank(s, "typo", pid=101, devices=["12"])
    (job,) = Analysis(s, lambda: snap).jobs()
    assert "unknown_device" in job.verdict.findings
    assert any("'12' names no GPU of this node" in n for n in job.verdict.notes)


def test_a_declared_setup_that_cannot_be_the_one_running_is_said(gpu) -> None:
    """llama3-70b, ZeRO 3 over six ranks, the optimizer on the GPU: ~189 GiB per GPU, on an 80 GB H100 whose
    allocator holds 36 GiB. Declaring the optimizer on the host (what such a job must do) agrees."""
    _, sampler = gpu
    gib = 1 << 30
    spec = preset("llama3-70b")
    model = {f: getattr(spec, f) for f in MODEL_FIELDS}
    memory = {
        "device": 0, "allocated_bytes": 36 * gib, "allocated_peak_bytes": int(36.1 * gib),
        "reserved_bytes": 40 * gib, "reserved_peak_bytes": 40 * gib, "alloc_retries": 0, "ooms": 0,
    }  # fmt: skip
    for offload, expected in (("none", True), ("optimizer", False)):
        s = store()
        setup = {"model": model, "micro_batch": 1, "zero_stage": 3, "checkpointing": "full"}
        setup |= {"flash_attention": True, "offload": offload}
        ingest_rank(s, f"big-{offload}", pid=101, world_size=6, setup=setup, memory=memory)
        a = Analysis(s, sampler.sweep)
        for _ in range(SETTLED_POINTS + 2):  # a GPU window of SETTLED_POINTS sweeps: the peak is reached
            (job,) = a.jobs()
        assert ("setup_mismatch" in job.verdict.findings) is expected, (offload, job.verdict.notes)
        rank = job.ranks[0].verdict
        assert ("setup_mismatch" in rank.findings) is expected
        if expected:
            assert any("more than the GPU's 79.6 GiB" in n for n in job.verdict.notes), job.verdict.notes


def test_a_rank_gone_leaves_the_jobs_gpus_throughput_and_mfu_at_once(sims, samplers) -> None:
    """Two ranks of one job on two GPUs; rank 1 finishes (its final report), or falls silent: at the next
    evaluation it holds no GPU in the exposition and the job's tokens/s and MFU are rank 0's alone, while its
    counters and ledger stay (a restart elsewhere still needs them)."""
    sim = sims("2xH100-SXM", static=True)
    for i in range(2):
        set_state(sim, i)
    sampler = samplers(sim)
    for how in ("final", "silent"):
        s = store()
        t = time.time()
        ingest_rank(s, "pair", pid=101, world_size=2, end=t)
        # 10 s between rank 1's two reports: silent once 4 of those (40 s) pass without one
        last = t - 45.0 if how == "silent" else t
        one = {"rank": 1, "world_size": 2, "devices": ["1"], "end": last, "received": last}
        ingest_rank(s, "pair", pid=102, final=how == "final", **one)
        a = Analysis(s, sampler.sweep)
        later = t
        (job,) = a.jobs(now=later)
        gone = {r.view.report.rank: r.gone for r in job.ranks}
        assert gone == {0: None, 1: "finished" if how == "final" else "silent"}, how
        live = next(r for r in job.ranks if r.gone is None)
        assert job.tokens_per_second == pytest.approx(live.rates.tokens_per_second)
        assert job.mfu == pytest.approx(live.mfu)
        f = _families(TrainingCollector(a, IngestStats(), details=RATES), later)
        assert {s.labels["rank"] for s in f["gpumon_training_rank_gpu_info"]} == {"0"}, how
        assert {s.labels["rank"] for s in f["gpumon_training_peak_flops_per_second"]} == {"0"}
        (peak,) = f["gpumon_training_job_peak_flops_per_second"]
        assert peak.value == pytest.approx(live.peak.flops)
        assert {s.labels["rank"] for s in f["gpumon_training_steps_total"]} == {"0", "1"}, "counters stay"
        assert {s.labels["rank"] for s in f["gpumon_training_goodput_seconds_total"]} == {"0", "1"}
    (job,) = Analysis(s, sampler.sweep).jobs(now=later - 6.0)  # 39 s after rank 1's last report
    assert all(r.gone is None for r in job.ranks), "under 4 report intervals of silence is not gone"


def _families(c: TrainingCollector, now: float) -> dict[str, list]:
    c.analysis.clock = lambda: now
    out: dict[str, list] = {}
    for fam in c.collect():
        out.setdefault(fam.name if fam.type != "counter" else fam.name + "_total", []).extend(fam.samples)
    return out


def test_a_loop_hung_inside_a_phase_it_timed_shows_that_phase(gpu) -> None:
    """A dead data loader: 20 steps, then 30 s inside data_wait. The open phase counts as far as it has run,
    and the verdict says where the loop is, with advice for that phase, not for a hung collective."""
    _, sampler = gpu
    s = store()
    t = time.time()
    started = t - 41.0
    for n, at, running in ((20, t - 30.0, 0.0), (20, t, 30.0)):
        r = report(n, started=started, step_seconds=0.5, t=at, seq=n + int(running), job="dlhang", pid=101)
        r["open_phases"] = {"data_wait": running} if running else {}
        s.ingest(parse(r), time.time())
    (job,) = Analysis(s, sampler.sweep).jobs()
    (rank,) = job.ranks
    assert rank.rates.phase_ratios["data_wait"] == pytest.approx(1.0, abs=0.02)
    v = job.verdict
    assert v.bottleneck in ("stalled", "idle"), v.summary
    assert "inside its data_wait phase for 30 s (the input pipeline delivers nothing" in v.summary
    assert v.advice.startswith("The loop is inside data_wait")


def test_a_held_verdict_says_it_is_held() -> None:
    from gpumon.jobs.diagnosis import Signals, Thresholds, diagnose

    s = Signals(progressing=True, data_wait_share=0.09, utilization=0.9, sm_active=0.9, tensor_active=0.6)
    v = diagnose(s, Thresholds(), lambda raw: "input")
    assert v.bottleneck == "input"
    assert v.summary.startswith("input (held while a change settles; this window reads compute): input-bound")


def test_two_reporters_of_one_process_do_not_share_its_gpu(gpu) -> None:
    """A notebook: an earlier Reporter left open, a new job in the same process. One process is not two
    jobs competing for the GPU; two processes are."""
    _, sampler = gpu
    snap = sampler.sweep()
    for second_pid, shared in ((101, False), (202, True)):
        s = store()
        ingest_rank(s, "nb-a", pid=101)
        ingest_rank(s, "nb-b", pid=second_pid)
        jobs = Analysis(s, lambda: snap).jobs()
        assert [("gpu_shared" in j.verdict.findings) for j in jobs] == [shared, shared], second_pid


def test_a_job_with_ranks_on_other_nodes_waits_in_communication(gpu) -> None:
    """Two of a job's eight ranks report here, 45 % of each step in communication: six ranks are elsewhere,
    and the rank's and the job's verdicts say the ranks wait, not that the network is the bottleneck."""
    _, sampler = gpu
    snap = sampler.sweep()
    s = store()
    for rank, pid in ((0, 101), (1, 102)):
        ingest_rank(s, "spread", pid=pid, rank=rank, world_size=8, phases_per_step={"communication": 0.225})
    (job,) = Analysis(s, lambda: snap).jobs()
    assert job.signals.peers_elsewhere == 6
    assert job.verdict.bottleneck == "communication"
    assert job.verdict.summary.startswith("waiting in communication: 45 % of wall time in collectives with 6")
    assert all(r.verdict.summary.startswith("waiting in communication") for r in job.ranks)


@pytest.mark.parametrize(
    ("nic_busy", "summary"),
    [
        (0.41, "communication-bound: 45 % of wall time in communication, link use n/a, its NICs at 91 %"),
        (0.05, "waiting on peers: 45 % of wall time in collectives with 6 ranks on other nodes, while its "
         "NICs (mlx5_0) carry 11 % of their line rate in them (5 % over the window)"),
    ],
)  # fmt: skip
def test_the_nics_nearest_a_spread_jobs_gpus_tell_the_network_from_a_slower_peer(
    gpu, nic_busy: float, summary: str
) -> None:
    """The same two ranks of eight, beside the GPU's nearest NIC read twice 10 s apart (inside the ranks' 20 s
    of steps): near line rate while they communicate, the network is the bottleneck; idle, they wait for a
    slower peer elsewhere."""
    _, sampler = gpu
    snap = sampler.sweep()
    uuid = snap.gpus[0].info.uuid

    def read(at: float, moved: float) -> Snapshot:
        port = RdmaPort(
            "mlx5_0", 1, "InfiniBand", "ACTIVE", "LinkUp", 5e10, int(moved), int(moved), None, None
        )
        return dataclasses.replace(snap, nics=(port,), nics_at=at, nic_affinity=((uuid, "mlx5_0", "PIX"),))

    now = time.time()
    s = store()
    for rank, pid in ((0, 101), (1, 102)):
        ingest_rank(s, "spread", pid=pid, rank=rank, world_size=8, phases_per_step={"communication": 0.225})
    later = read(now, nic_busy * 5e10 * 10)
    analysis = Analysis(s, lambda: later)
    analysis.observe(read(now - 10, 0.0))
    (job,) = analysis.jobs(now)
    assert job.signals.nics == ("mlx5_0",) and job.signals.nic_utilization == pytest.approx(nic_busy)
    assert job.verdict.bottleneck == "communication"
    assert job.verdict.summary.startswith(summary), job.verdict.summary
    assert all(r.verdict.summary == job.verdict.summary for r in job.ranks)
    assert ("waiting_on_peers" in job.verdict.findings) == (nic_busy < 0.2)


def test_a_lossy_roce_fabric_under_idle_nics_is_the_network_not_a_peer(gpu) -> None:
    """The spread job again, its NIC a RoCE port nearly idle while it communicates; its transport retransmits
    40 times a second (hw_counters read 10 s apart): the fabric, not a slower peer."""
    _, sampler = gpu
    snap = sampler.sweep()
    uuid = snap.gpus[0].info.uuid

    def read(at: float, moved: float, retries: int) -> Snapshot:
        port = RdmaPort(
            "mlx5_0", 1, "Ethernet", "ACTIVE", "LinkUp", 2.5e10, int(moved), int(moved), None, None,
            hw_counters={"local_ack_timeout_err": retries, "out_of_sequence": 3 * retries},
        )  # fmt: skip
        return dataclasses.replace(snap, nics=(port,), nics_at=at, nic_affinity=((uuid, "mlx5_0", "PIX"),))

    now = time.time()
    s = store()
    for rank, pid in ((0, 101), (1, 102)):
        ingest_rank(s, "spread", pid=pid, rank=rank, world_size=8, phases_per_step={"communication": 0.225})
    analysis = Analysis(s, lambda: read(now, 0.05 * 2.5e10 * 10, 100))
    analysis.observe(read(now - 10, 0.0, 0))
    (job,) = analysis.jobs(now)
    assert job.signals.nic_retransmit_rate == pytest.approx(40.0)
    assert "waiting_on_peers" not in job.verdict.findings and "nic_congestion" in job.verdict.findings
    assert job.verdict.summary.startswith("communication-bound"), job.verdict.summary
    assert "40 transport retransmissions a second" in job.verdict.summary


def test_a_restart_carried_from_another_node_reaches_metrics_once_its_series_exist(gpu) -> None:
    """A rank that moved here books its dead gap at its first report; Prometheus's increase() cannot see a
    counter born at that value, so /metrics shows its restart series at 0 for two renders and their value
    from the third on; /v1/jobs has them at once."""
    _, sampler = gpu
    now = time.time()
    s = store()
    # the daemon was up before the rank's process started (one older than it is a daemon restart's)
    # renders alone, not time, in this test (counter_hold 0): two at 0, then the value
    c = TrainingCollector(Analysis(s, sampler.sweep, clock=lambda: now - 60.0), IngestStats(), counter_hold=0)
    was = {"incarnation": "dead-one", "step": 30, "last_step": now - 80.0}
    started = now - 21.0
    for n, seq in ((0, 0), (40, 1)):  # seen from its start: its first reports
        r = report(
            n, started=started, step_seconds=0.5, job="moved", pid=os.getpid(), seq=seq, predecessor=was
        )
        s.ingest(parse(r), time.time())

    def restart() -> tuple[float, float]:
        f = _families(c, now)
        (gap,) = [
            x.value for x in f["gpumon_training_badput_seconds_total"] if x.labels["cause"] == "restart"
        ]
        (count,) = [x.value for x in f["gpumon_training_restarts_total"]]
        return gap, count

    ledger = s.views(now)[0].ledger
    assert ledger.moves == 1 and ledger.carried > 50  # the predecessor's last step to this process's start
    booked = ledger.badput["restart"]
    first, second, third = restart(), restart(), restart()
    assert first == second == (0, 0)
    assert third == (pytest.approx(booked), 1)
    assert job_json(Analysis(s, sampler.sweep).jobs(now)[0], 60.0)["goodput"]["restarts"] == 1


def test_a_rank_still_loading_adds_no_gpu_or_peak_to_a_stepping_job(gpu) -> None:
    """Rank 1 restarted (on this node, say) and loads its checkpoint while rank 0 steps: until its first step
    it exports no GPU and no rates, so the job's per-GPU throughput and MFU rules do not sag (the fleet test
    saw both baseline alerts go pending for the seconds between a restart's first report and first step)."""
    _, sampler = gpu
    now = time.time()
    s = store()
    ingest_rank(s, "mixed", pid=os.getpid(), rank=0, world_size=2, end=now)
    s.ingest(
        parse(report(0, job="mixed", rank=1, world_size=2, pid=os.getppid(), seq=0, started=now - 3)), now
    )
    (job,) = Analysis(s, sampler.sweep).jobs(now)
    loading = next(r for r in job.ranks if r.view.report.rank == 1)
    assert loading.gone is None and not loading.counts
    f = _families(TrainingCollector(Analysis(s, sampler.sweep), IngestStats(), details=RATES), now)
    assert {x.labels["rank"] for x in f["gpumon_training_rank_gpu_info"]} == {"0"}
    assert {x.labels["rank"] for x in f["gpumon_training_peak_flops_per_second"]} == {"0"}
    (peak,) = f["gpumon_training_job_peak_flops_per_second"]
    assert peak.value == pytest.approx(next(r for r in job.ranks if r.view.report.rank == 0).peak.flops)
    assert {x.labels["rank"] for x in f["gpumon_training_rank_info"]} == {"0", "1"}  # it is listed
    assert job.mfu == pytest.approx(next(r for r in job.ranks if r.view.report.rank == 0).mfu)
