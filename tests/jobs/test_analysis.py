"""Reports joined with the GPU snapshot: the right GPU, the right peak, MFU, tokens/J, stragglers."""

from __future__ import annotations

import logging
import time

import pytest
from support.helpers import set_state
from support.reports import now_report

from gpumon.gpu.sim.device import SimProcess
from gpumon.jobs.analysis import Analysis
from gpumon.jobs.jobjson import job_json
from gpumon.jobs.report import parse
from gpumon.jobs.store import JobStore

H100_BF16 = 989.5e12
A100_BF16 = 312e12


@pytest.fixture
def node(sims, samplers):
    sim = sims("1xH100-SXM,1xA100,1xRTX-A6000", static=True)
    for i in range(3):
        set_state(sim, i)
    sampler = samplers(sim)
    return sim, sampler, sampler.sweep()


def analysis(snap, *reports, **kw) -> Analysis:
    store = JobStore(max_jobs=8, max_ranks=16, ttl=600.0, window=60.0)
    for r in reports:
        store.ingest(parse(r), time.time())
    return Analysis(store, lambda: snap, **kw)


def rank0(a: Analysis):
    (job,) = a.jobs()
    return job.ranks[0]


def test_mfu_uses_the_peak_of_the_gpu_the_rank_runs_on(node) -> None:
    _, _, snap = node
    r = rank0(analysis(snap, now_report(100, devices=["0"], flops_per_token=6e9)))
    tps = 99_000 / 9.9
    assert r.rates.tokens_per_second == pytest.approx(tps)
    assert r.peak.flops == H100_BF16 and r.peak.source == "table"
    assert r.flops == pytest.approx(tps * 6e9)
    assert r.mfu == pytest.approx(tps * 6e9 / H100_BF16)
    r1 = rank0(analysis(snap, now_report(100, devices=[snap.gpus[1].info.uuid], flops_per_token=6e9)))
    assert r1.peak.flops == A100_BF16 and r1.gpus[0].via == "device"


def test_a_uuid_prefix_as_cuda_visible_devices_allows_names_its_gpu(node) -> None:
    _, _, snap = node
    prefix = snap.gpus[1].info.uuid[:12]
    r = rank0(analysis(snap, now_report(10, devices=[prefix])))
    assert [u.window.index for u in r.gpus] == [1]
    r = rank0(analysis(snap, now_report(10, devices=["GPU-zz"])))  # matches no GPU: unknown, not a guess
    assert r.gpus == ()


def test_several_gpus_per_rank_add_their_peaks(node) -> None:
    _, _, snap = node
    r = rank0(analysis(snap, now_report(10, devices=["0", "1"])))
    assert r.peak.flops == H100_BF16 + A100_BF16


def test_an_unknown_gpu_leaves_mfu_absent_and_warns_once(node, caplog) -> None:
    _, _, snap = node
    a = analysis(snap, now_report(10, devices=["2"]))  # RTX A6000: not in the peak table
    with caplog.at_level(logging.WARNING):
        r = rank0(a)
        a.jobs()
    assert r.mfu is None and r.peak.flops is None and "RTX A6000" in (r.peak.problem or "")
    assert r.flops is not None, "achieved FLOP/s do not need a peak"
    warnings = [rec for rec in caplog.records if "peak FLOP/s" in rec.getMessage()]
    assert len(warnings) == 1 and "--peak-tflops" in warnings[0].getMessage()


def test_the_operator_override_and_the_rank_s_own_peak(node) -> None:
    _, _, snap = node
    r = rank0(analysis(snap, now_report(10, devices=["2"]), peak_override={"bf16": 155e12}))
    assert r.peak.flops == 155e12 and r.peak.source == "override"
    r = rank0(analysis(snap, now_report(10, devices=["0"], peak_flops=500e12)))
    assert r.peak.flops == 500e12 and r.peak.source == "report"


def test_no_dtype_means_no_mfu_and_says_why(node) -> None:
    _, _, snap = node
    r = rank0(analysis(snap, now_report(10, dtype=None)))
    assert r.mfu is None and "dtype" in (r.peak.problem or "")


def test_a_rank_without_a_device_is_found_by_its_pid_in_nvml_s_process_list(sims, samplers) -> None:
    sim = sims("2xH100-SXM", static=True)
    sim.gpus[1].processes = [SimProcess(pid=4242, used_memory=10 << 30)]
    sim.gpus[0].processes = []
    snap = samplers(sim).sweep()
    r = rank0(analysis(snap, now_report(10, devices=[], pid=4242)))
    assert [(u.window.index, u.via) for u in r.gpus] == [(1, "process")]
    r = rank0(analysis(snap, now_report(10, devices=[], pid=999)))
    assert r.gpus == () and "no GPU known" in (r.peak.problem or "")


def test_a_mig_device_gets_its_share_of_the_peak(sims, samplers) -> None:
    sim = sims("1xH100-SXM/mig=3g.40gb+2g.20gb", static=True)
    snap = samplers(sim).sweep()
    migs = snap.gpus[0].reading.mig
    three = next(m for m in migs if m.profile == "3g.40gb")
    r = rank0(analysis(snap, now_report(10, devices=[three.uuid])))
    assert r.gpus[0].via == "mig" and r.peak.flops == pytest.approx(H100_BF16 * 3 / 7)


def test_tokens_per_joule_from_the_gpu_power_split_among_its_ranks(node) -> None:
    _, _, snap = node
    watts = snap.gpus[0].reading.power_watts
    a = analysis(
        snap,
        now_report(100, devices=["0"], rank=0, world_size=2),
        now_report(100, devices=["0"], rank=1, world_size=2),
    )
    (job,) = a.jobs()
    tps = 99_000 / 9.9
    assert [r.gpus[0].sharers for r in job.ranks] == [2, 2]
    assert job.ranks[0].tokens_per_joule == pytest.approx(tps / (watts / 2))


def test_a_slow_rank_is_the_straggler_of_its_job(node) -> None:
    _, _, snap = node
    fast = [now_report(100, rank=i, world_size=4, devices=[str(i % 3)]) for i in range(3)]
    slow = now_report(100, rank=3, world_size=4, devices=["0"], step_seconds=0.2)
    (job,) = analysis(snap, *fast, slow).jobs()
    scores = [r.straggler for r in job.ranks]
    assert scores[:3] == [0.0, 0.0, 0.0] and scores[3] == pytest.approx(0.5)


def test_with_phases_the_straggler_is_the_rank_the_others_wait_for(node) -> None:
    _, _, snap = node
    t = time.time()

    def rank(i: int, comm: float) -> list[dict]:
        # the same step time for all (synchronous), but rank 2 computes while the others wait in all-reduce
        return [
            now_report(10, rank=i, world_size=3, t=t - 1, seq=1, phases={"communication": 0.0}),
            now_report(20, rank=i, world_size=3, t=t, seq=2, phases={"communication": comm}),
        ]

    (job,) = analysis(snap, *rank(0, 0.5), *rank(1, 0.5), *rank(2, 0.0)).jobs()
    assert [r.straggler for r in job.ranks] == [0.0, 0.0, pytest.approx(0.5)]


def test_job_totals_and_json_carry_the_evidence(node) -> None:
    _, _, snap = node
    a = analysis(
        snap, now_report(100, rank=0, world_size=2), now_report(100, rank=1, world_size=2, devices=["1"])
    )
    (job,) = a.jobs()
    assert job.tokens_per_second == pytest.approx(2 * 99_000 / 9.9)
    assert job.mfu == pytest.approx(sum(r.flops for r in job.ranks) / (H100_BF16 + A100_BF16))
    doc = job_json(job, 60.0)
    assert doc["ranks_on_node"] == 2 and doc["diagnosis"]["evidence"]
    assert doc["ranks"][1]["gpus"][0]["name"] == "NVIDIA A100-SXM4-80GB"
    assert doc["ranks"][0]["rates"]["span"]["tokens"] == 99_000


def test_the_override_fills_gaps_in_the_table_and_never_replaces_it(node) -> None:
    _, _, snap = node
    override = {"bf16": 155e12}
    r = rank0(analysis(snap, now_report(10, devices=["0", "2"]), peak_override=override))
    assert r.peak.flops == H100_BF16 + 155e12 and r.peak.source == "override+table"


def test_two_mig_devices_of_one_gpu_are_two_devices_with_their_own_memory(sims, samplers) -> None:
    sim = sims("1xH100-SXM/mig=3g.40gb+2g.20gb", static=True)
    snap = samplers(sim).sweep()
    migs = {m.profile: m for m in snap.gpus[0].reading.mig}
    r = rank0(analysis(snap, now_report(10, devices=[migs["3g.40gb"].uuid, migs["2g.20gb"].uuid])))
    assert [u.window.mig_profile for u in r.gpus] == ["3g.40gb", "2g.20gb"]
    assert r.peak.flops == pytest.approx(H100_BF16 * 5 / 7)
    three = r.gpus[0].window
    assert (
        three.memory_total_bytes
        == migs["3g.40gb"].memory_total_bytes
        != snap.gpus[0].reading.memory_total_bytes
    )
    assert three.utilization is None, "NVML has no per-instance utilisation; the parent's is not borrowed"
    r = rank0(analysis(snap, now_report(10, devices=[migs["3g.40gb"].uuid], peak_flops=700e12)))
    assert r.peak.flops == pytest.approx(700e12 * 3 / 7), "a rank's own peak is per GPU: its slice too"


def test_a_compute_instance_sharing_a_gpu_instance_gets_its_own_slices(sims, samplers) -> None:
    """nvidia_gpu_exporter's H200 MIG capture: two "1c.3g.71gb" compute instances in one 3g GPU instance.
    Each has one of the GPU's 7 slices; read as "3g" (or not at all, as before) it was given 3/7 or 7/7 of
    the peak, and its MFU came out 3 to 7 times too low."""
    sim = sims("1xH200/mig=1c.3g.71gb+1c.3g.71gb+2g.35gb", static=True)
    snap = samplers(sim).sweep()
    shared = [m for m in snap.gpus[0].reading.mig if m.profile == "1c.3g.71gb"]
    assert [(m.gpu_instance_id, m.compute_instance_id) for m in shared] == [(2, 0), (2, 1)]
    r = rank0(analysis(snap, now_report(10, devices=[shared[1].uuid], peak_flops=700e12)))
    assert r.gpus[0].window.mig_profile == "1c.3g.71gb"
    assert r.peak.flops == pytest.approx(700e12 / 7)


def test_a_lost_gpu_is_the_verdict_and_its_old_samples_are_dropped(sims, samplers) -> None:
    sim = sims("2xH100-SXM", static=True)
    set_state(sim, 0)
    sampler = samplers(sim)
    before = sampler.sweep()
    a = analysis(before, now_report(10, devices=["0"]))
    assert rank0(a).verdict.bottleneck != "gpu_down"
    sim.faults.add("lost:0")
    after = sampler.sweep()
    a.source = lambda: after
    r = rank0(a)
    assert r.verdict.bottleneck == "gpu_down" and "GPU 0" in r.verdict.summary
    assert r.gpus[0].window.up is False and r.gpus[0].window.points == 0
    assert r.gpus[0].window.utilization is None
