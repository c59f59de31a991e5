"""The bottleneck flow: each verdict from the signals that should produce it, with its evidence."""

from __future__ import annotations

import pytest
from support.helpers import ROOT

from gpumon.gpu.capture import ReplayNvml, load
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.types import THROTTLE_REASONS
from gpumon.jobs.diagnosis import (
    ADVICE,
    BOTTLENECKS,
    Signals,
    Thresholds,
    diagnose,
    parse_thresholds,
    straggler_scores,
)
from gpumon.jobs.diagnosis.wording import WAIT_ADVICE
from gpumon.jobs.gpus import THROTTLING, _point

T = Thresholds()
BUSY = {"utilization": 0.98, "sm_active": 0.9, "tensor_active": 0.6, "dram_active": 0.3}


@pytest.mark.parametrize(
    ("signals", "verdict"),
    [
        (Signals(progressing=True, gpu_down="GPU 3: GpuIsLost", **BUSY), "gpu_down"),
        (Signals(progressing=False, utilization=0.0), "idle"),
        (Signals(progressing=None), "idle"),
        (Signals(progressing=False, utilization=1.0), "stalled"),
        # a finished run is judged by its window, not called stalled for the seconds its totals linger
        (Signals(progressing=False, utilization=0.3, data_wait_share=0.5, finished=True), "input"),
        (Signals(progressing=False, utilization=0.12, finished=True), "undetermined"),
        (Signals(progressing=True, utilization=0.4, data_wait_share=0.35), "input"),
        (Signals(progressing=True, data_wait_share=0.35), "input"),  # no GPU data: the share decides
        (Signals(progressing=True, utilization=0.6, communication_share=0.45), "communication"),
        (Signals(progressing=True, nvlink_utilization=0.85, sm_active=0.3, utilization=0.9), "communication"),
        (Signals(progressing=True, pcie_utilization=0.9, utilization=0.4), "communication"),
        (Signals(progressing=True, throttled_share=0.8, slowdown=0.2, **BUSY), "throttled"),
        (Signals(progressing=True, exited="pid 7 is gone", utilization_now=0.0, **BUSY), "exited"),
        (Signals(progressing=True, memory_used_ratio=0.95, utilization=0.8), "memory_capacity"),
        (Signals(progressing=True, utilization=0.95, dram_active=0.8, tensor_active=0.1), "memory_bandwidth"),
        (Signals(progressing=True, **BUSY), "compute"),
        (Signals(progressing=True, utilization=0.95), "compute"),  # without profiling: utilisation
        (Signals(progressing=True, utilization=0.8), "undetermined"),
    ],
)
def test_each_verdict(signals: Signals, verdict: str) -> None:
    v = diagnose(signals, T)
    assert v.bottleneck == verdict
    assert v.advice == ADVICE[verdict] and v.summary


def test_input_needs_an_idle_gpu_not_just_a_data_wait_share() -> None:
    v = diagnose(Signals(progressing=True, data_wait_share=0.2, **BUSY), T)
    assert v.bottleneck == "compute" and "input" not in v.findings
    # waiting 25 % with the GPU 75 % busy: the GPU idles as the loop waits (it was compute once the window
    # filled, in the scenario suite's input-25)
    mild = diagnose(Signals(progressing=True, data_wait_share=0.25, utilization=0.75), T)
    assert mild.bottleneck == "input"


def test_memory_pressure_under_a_compute_bound_job_is_a_finding_not_the_verdict() -> None:
    v = diagnose(Signals(progressing=True, memory_used_ratio=0.97, **BUSY), T)
    assert v.bottleneck == "compute" and "memory_capacity" in v.findings


def test_evidence_gives_every_signal_its_value_threshold_and_outcome() -> None:
    v = diagnose(Signals(progressing=True, utilization=0.4, data_wait_share=0.35, memory_used_ratio=0.5), T)
    first = v.evidence[0].json()
    assert first == {
        "signal": "data_wait_share",
        "value": 0.35,
        "threshold": 0.15,
        "op": ">=",
        "met": True,
        "unit": "ratio",
    }
    by_signal = {(e.signal, e.threshold): e for e in v.evidence}
    assert by_signal[("gpu_utilization", 1 - 0.35 / 2)].met is True, "the GPU idles while the loop waits"
    assert by_signal[("memory_used_ratio", 0.9)].met is False
    assert by_signal[("tensor_active", 0.4)].met is None, "an unmeasured signal is unknown, not false"
    assert "35 %" in v.summary and "40 %" in v.summary


def test_thresholds_are_configurable() -> None:
    s = Signals(progressing=True, utilization=0.5, data_wait_share=0.2)
    assert diagnose(s, T).bottleneck == "input"
    assert diagnose(s, parse_thresholds(["data_wait_share=0.25"])).bottleneck == "undetermined"


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["nope=0.1"], "unknown threshold 'nope'"),
        (["data_wait_share"], "expected NAME=VALUE"),
        (["data_wait_share=x"], "expected a number between 0 and 1"),
        (["data_wait_share=1.5"], "expected a number between 0 and 1"),
        (["nic_cnp_rate=-1"], "expected a number between 0 and 1e"),
        (["nic_cnp_rate=inf"], "expected a number between 0 and 1e"),
        (["nic_retransmit_rate=nan"], "expected a number between 0 and 1e"),
    ],
)
def test_bad_thresholds_say_what_to_fix(items: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_thresholds(items)


def test_thresholds_from_a_toml_table_and_comma_lists() -> None:
    assert parse_thresholds({"sm_busy": 0.7}).sm_busy == 0.7
    assert parse_thresholds(["nic_cnp_rate=5000"]).nic_cnp_rate == 5000.0  # a rate, not a ratio
    t = parse_thresholds(["sm_busy=0.7,tensor_busy=0.5"])
    assert (t.sm_busy, t.tensor_busy) == (0.7, 0.5)


def test_bottleneck_names_are_the_one_hot_label_values() -> None:
    assert set(ADVICE) == set(BOTTLENECKS)


def test_straggler_scores_are_relative_to_the_median() -> None:
    # busy seconds per step: three at 1.0, one at 2.0 (twice as slow: 0.5), one faster (0)
    assert straggler_scores([1.0, 1.0, 1.0, 2.0, 0.8]) == [0.0, 0.0, 0.0, 0.5, 0.0]
    assert straggler_scores([1.0]) == [0.0]
    assert straggler_scores([1.0, None]) == [0.0, None]
    assert straggler_scores([1.0, 4.0]) == [0.0, pytest.approx(1 - 2.5 / 4.0)]


def test_every_threshold_is_documented_with_its_default() -> None:
    import dataclasses
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    for f in dataclasses.fields(Thresholds):
        assert f"| `{f.name}` | {f.default:.2f} |" in doc, f"docs/training.md lacks threshold {f.name}"


def test_an_mfu_above_one_is_flagged_as_a_reporting_mistake() -> None:
    v = diagnose(Signals(progressing=True, mfu=1.4, **BUSY), T)
    assert v.bottleneck == "compute" and "mfu_above_peak" in v.findings
    assert "mfu_above_peak" not in diagnose(Signals(progressing=True, mfu=0.4, **BUSY), T).findings


def test_a_busy_gpu_at_its_power_limit_is_not_throttled_but_a_hot_one_is() -> None:
    """A real H200 running bf16 products (tests/fixtures/captures/h200-load.json, driver 580.159.04) had
    the software power cap asserted 97 % of the time at 647-666 W of 700: that is a busy GPU, and the verdict
    must be compute. Thermal and hardware slowdowns still count."""
    bits = {name: bit for bit, name, _ in THROTTLE_REASONS}
    backend = NvmlBackend(ReplayNvml(load(str(ROOT / "tests/fixtures/captures/h200-load.json"))))
    (dev,) = backend.open()
    reading = backend.read(dev, 1e12).reading
    backend.close()
    assert reading.throttle_reasons == bits["sw_power_cap"]
    assert _point(0.0, reading).throttled is False
    assert (
        THROTTLING & bits["hw_thermal"]
        and THROTTLING & bits["hw_slowdown"]
        and THROTTLING & bits["sw_thermal"]
    )
    assert diagnose(Signals(progressing=True, throttled_share=0.0, **BUSY), T).bottleneck == "compute"


def test_throttling_the_job_does_not_feel_is_a_finding_not_the_verdict() -> None:
    """A brief thermal excursion (38 % of the window's samples) while the job keeps its speed: compute, with
    the clock limit noted; the same limit with the job 20 % slower than before: throttled."""
    kept = diagnose(Signals(progressing=True, throttled_share=0.38, slowdown=0.01, **BUSY), T)
    assert kept.bottleneck == "compute" and "clocks_limited" in kept.findings
    assert any("1 % slower than its recent unthrottled speed" in n for n in kept.notes)
    unknown = diagnose(Signals(progressing=True, throttled_share=0.9, **BUSY), T)
    assert unknown.bottleneck == "compute" and "no unthrottled speed or baseline" in " ".join(unknown.notes)
    paid = diagnose(Signals(progressing=True, throttled_share=0.38, slowdown=0.2, **BUSY), T)
    assert paid.bottleneck == "throttled" and "20 % slower" in paid.summary
    assert "clocks_limited" not in paid.findings


def test_stalled_or_idle_reads_the_gpu_now_not_the_window() -> None:
    """A process killed 20 s ago left a window that averages 56 % busy while the GPU reads 0 %."""
    v = diagnose(Signals(progressing=False, utilization=0.56, utilization_now=0.0), T)
    assert v.bottleneck == "idle" and "utilisation 0 %" in v.summary and "busy" not in v.summary
    v = diagnose(Signals(progressing=False, utilization=0.2, utilization_now=0.9), T)
    assert v.bottleneck == "stalled" and "utilisation 90 %" in v.summary


def test_an_exited_process_says_so_and_whether_its_gpu_is_idle() -> None:
    v = diagnose(Signals(progressing=True, exited="pid 7 exited", utilization=0.6, utilization_now=0.0), T)
    assert v.bottleneck == "exited" and "pid 7 exited" in v.summary and "idle now" in v.summary
    # a finished process is gone too: it says finished, with its last window's verdict
    v = diagnose(Signals(progressing=True, exited="pid 7", finished=True, data_wait_share=0.5), T)
    assert v.bottleneck == "input" and "finished" in v.findings and v.summary.startswith("finished")


def test_a_shared_gpu_decides_from_the_jobs_own_signals() -> None:
    """The README walkthrough: the example waits 68 % on data on a GPU another job keeps 98 % busy. The
    GPU's activity is not the example's: input-bound, and the sharing said."""
    walk = Signals(
        progressing=True, data_wait_share=0.68, shared_with=("llama-70b (GPU 0)",), shared_utilization=0.98
    )
    v = diagnose(walk, T)
    assert v.bottleneck == "input" and "gpu_shared" in v.findings
    assert any("llama-70b" in n and "not attributable" in n for n in v.notes)
    # the neighbour: busy GPU, its own phases say it waits on nothing
    busy = Signals(
        progressing=True,
        data_wait_share=0.01,
        communication_share=0.1,
        shared_with=("x",),
        shared_utilization=0.98,
    )
    assert diagnose(busy, T).bottleneck == "compute"
    # nothing of its own to go by: no claim
    assert diagnose(Signals(progressing=True, shared_with=("x",), shared_utilization=0.98), T).bottleneck == (
        "undetermined"
    )
    # its own NVML per-process use says it is busy itself
    own = Signals(
        progressing=True, utilization=0.95, own_utilization=True, shared_with=("x",), shared_utilization=1.0
    )
    v = diagnose(own, T)
    assert v.bottleneck == "compute" and "95 %" in " ".join(v.notes)


def test_mfu_above_the_tensor_cores_activity_names_the_declared_flops() -> None:
    v = diagnose(Signals(progressing=True, mfu=0.377, **{**BUSY, "tensor_active": 0.229}), T)
    assert "flops_per_token_high" in v.findings and any("1.6x too high" in n for n in v.notes)
    assert "flops_per_token_high" not in diagnose(Signals(progressing=True, mfu=0.35, **BUSY), T).findings
    # on a shared GPU the tensor activity is not the job's own: no claim
    shared = Signals(progressing=True, mfu=0.377, shared_with=("x",), **{**BUSY, "tensor_active": 0.229})
    assert "flops_per_token_high" not in diagnose(shared, T).findings


def test_a_declared_setup_the_memory_contradicts_is_a_finding() -> None:
    gib = float(1 << 30)

    def findings(est: float, peak: float | None, hbm: float = 80 * gib, settled: bool = True) -> list[str]:
        held = None if peak is None else peak * gib
        s = Signals(
            progressing=True, setup_estimate_bytes=est * gib, allocated_peak_bytes=held, hbm_bytes=hbm,
            settled=settled, **BUSY,
        )  # fmt: skip
        v = diagnose(s, T)
        assert len([n for n in v.notes if "declared setup" in n]) == ("setup_mismatch" in v.findings)
        return list(v.findings)

    assert "setup_mismatch" in findings(189.4, 57.8)  # llama3-70b ZeRO-3 over 6 ranks, as the demo once was
    assert "setup_mismatch" in findings(189.4, None), "cannot fit in HBM, whatever the allocator says"
    assert "setup_mismatch" in findings(30.0, 45.0), "50 % above: a lower ZeRO stage than declared"
    assert "setup_mismatch" not in findings(36.1, 36.1)
    assert "setup_mismatch" not in findings(30.0, 38.0), "27 % off: within the estimate's reach"
    assert "setup_mismatch" not in findings(3.0, 4.5), "50 % but 1.5 GiB: buffers no estimate has"
    assert "setup_mismatch" not in findings(189.4, 57.8, settled=False), "the peak is still growing"
    v = diagnose(
        Signals(progressing=True, setup_estimate_bytes=100 * gib, allocated_peak_bytes=50 * gib, **BUSY), T
    )
    assert any("50 % below the declared setup's estimate of 100.0 GiB" in n for n in v.notes), v.notes


def test_a_settle_function_holds_the_previous_verdict() -> None:
    v = diagnose(Signals(progressing=True, data_wait_share=0.2, utilization=0.5), T, lambda raw: "compute")
    assert v.bottleneck == "compute" and "input" in v.findings


def test_a_node_that_sees_its_ranks_wait_for_peers_elsewhere_does_not_claim_the_network() -> None:
    """Ranks on other nodes: a long communication phase may be a wait for a slower peer, which this node
    cannot see; the verdict says "waiting in communication" and hands over to the job's view. Saturated
    links here, or a job all on this node, are still communication-bound."""
    waiting = Signals(progressing=True, utilization=0.6, communication_share=0.45, peers_elsewhere=16)
    v = diagnose(waiting, T)
    assert v.bottleneck == "communication"  # the one-hot label the job rules average stays
    assert v.summary.startswith("waiting in communication: 45 % of wall time in collectives with 16 ranks")
    assert "communication-bound" not in v.summary
    assert v.advice == WAIT_ADVICE and "straggler" in v.advice
    alone = diagnose(Signals(progressing=True, utilization=0.6, communication_share=0.45), T)
    assert alone.summary.startswith("communication-bound") and alone.advice == ADVICE["communication"]
    saturated = Signals(
        progressing=True, utilization=0.6, communication_share=0.45, nvlink_utilization=0.9, peers_elsewhere=8
    )
    assert diagnose(saturated, T).summary.startswith("communication-bound")
    # the configured link threshold, not the default, decides what saturated means
    assert diagnose(saturated, Thresholds(link_busy=0.95)).summary.startswith("waiting in communication")


MULTI = {"progressing": True, "utilization": 0.6, "communication_share": 0.45, "peers_elsewhere": 14}


def test_a_rank_in_collectives_with_busy_nics_is_network_bound_and_says_their_figures() -> None:
    s = Signals(**MULTI, nics=("mlx5_0",), nic_utilization=0.41)
    v = diagnose(s, T)
    assert v.bottleneck == "communication" and "waiting_on_peers" not in v.findings
    assert v.summary.startswith("communication-bound: 45 % of wall time in communication")
    assert "its NICs at 91 % of line rate while communicating (41 % over the window)" in v.summary
    nic = next(e for e in v.evidence if e.signal == "nic_utilization_in_communication")
    assert nic.value == pytest.approx(0.41 / 0.45) and nic.threshold == T.nic_busy and nic.met
    assert v.advice == ADVICE["communication"]


def test_a_rank_in_collectives_with_idle_nics_waits_on_peers() -> None:
    s = Signals(**MULTI, nics=("mlx5_0", "mlx5_1"), nic_utilization=0.09)
    v = diagnose(s, T)
    assert v.bottleneck == "communication"  # the one-hot label the job rules average
    assert "waiting_on_peers" in v.findings
    assert v.summary.startswith("waiting on peers: 45 % of wall time in collectives with 14 ranks")
    assert "(mlx5_0, mlx5_1) carry 20 % of their line rate" in v.summary
    assert "communication-bound" not in v.summary and "straggler" in v.advice
    nic = next(e for e in v.evidence if e.signal == "nic_utilization_in_communication")
    assert nic.met is False
    # the threshold is the configured one
    assert "waiting_on_peers" not in diagnose(s, Thresholds(nic_busy=0.15)).findings


def test_nic_errors_or_a_port_down_make_the_network_the_suspect_however_idle() -> None:
    erring = diagnose(Signals(**MULTI, nics=("mlx5_0",), nic_utilization=0.05, nic_errors=12.0), T)
    assert "waiting_on_peers" not in erring.findings and "nic_errors" in erring.findings
    assert (
        erring.summary.startswith("communication-bound") and "12 NIC errors in the window" in erring.summary
    )
    assert any("NIC mlx5_0: 12 errors in the window" in n for n in erring.notes)
    down = diagnose(Signals(**MULTI, nics=("mlx5_0",), nic_utilization=0.0, nics_down=("mlx5_0/1",)), T)
    assert "nic_errors" in down.findings and "ports not ACTIVE: mlx5_0/1" in down.summary


def test_without_nic_evidence_or_peers_elsewhere_the_nics_say_nothing() -> None:
    # no NIC reading in the window (one point): the ambiguous wording of a node that cannot tell
    unread = diagnose(Signals(**MULTI, nics=("mlx5_0",), nic_utilization=None), T)
    assert unread.summary.startswith("waiting in communication") and unread.advice == WAIT_ADVICE
    # a job all on this node: its collectives stay on NVLink, its NICs' idleness is no evidence
    alone = {**MULTI, "peers_elsewhere": 0}
    v = diagnose(Signals(**alone, nics=("mlx5_0",), nic_utilization=0.0, nic_errors=3.0), T)
    assert v.summary == "communication-bound: 45 % of wall time in communication, link use n/a"
    assert not {"waiting_on_peers", "nic_errors"} & set(v.findings)
    assert not [e for e in v.evidence if e.signal.startswith("nic")]


def test_a_lossy_or_congested_roce_fabric_is_the_network_however_idle_the_nics() -> None:
    """Low throughput with the transport retransmitting, or slowing down for congestion notifications, is
    the fabric's fault, not a slower peer's (found by review: it read "waiting on peers")."""
    lossy = diagnose(Signals(**MULTI, nics=("mlx5_0",), nic_utilization=0.05, nic_retransmit_rate=40.0), T)
    assert "waiting_on_peers" not in lossy.findings and "nic_congestion" in lossy.findings
    assert (
        lossy.summary.startswith("communication-bound")
        and "40 transport retransmissions a second" in lossy.summary
    )
    assert any("PFC and ECN" in n for n in lossy.notes)
    retries = next(e for e in lossy.evidence if e.signal == "nic_retransmit_rate")
    assert retries.met and retries.threshold == T.nic_retransmit_rate and retries.unit == "count"
    congested = diagnose(Signals(**MULTI, nics=("mlx5_0",), nic_utilization=0.05, nic_cnp_rate=2500.0), T)
    assert (
        "nic_congestion" in congested.findings
        and "2.5e+03 congestion notifications a second" in congested.summary
    )
    # below both thresholds: a healthy RoCE fabric's few, and the NICs idle: a slower peer
    healthy = Signals(
        **MULTI, nics=("mlx5_0",), nic_utilization=0.05, nic_retransmit_rate=0.1, nic_cnp_rate=20.0
    )
    v = diagnose(healthy, T)
    assert "waiting_on_peers" in v.findings and "nic_congestion" not in v.findings
    assert "waiting_on_peers" not in diagnose(healthy, Thresholds(nic_cnp_rate=10.0)).findings
    # InfiniBand ports (no hw_counters read): no such evidence at all
    ib = diagnose(Signals(**MULTI, nics=("mlx5_0",), nic_utilization=0.05), T)
    assert not [e for e in ib.evidence if e.signal in ("nic_retransmit_rate", "nic_cnp_rate")]


def test_a_rate_threshold_of_zero_needs_a_measured_rate_above_zero() -> None:
    """Found by review: nic_cnp_rate=0 made every job across nodes network-bound, RoCE counters or not."""
    t = Thresholds(nic_cnp_rate=0.0, nic_retransmit_rate=0.0)
    ib = diagnose(Signals(**MULTI, nics=("mlx5_0",), nic_utilization=0.05), t)
    assert "waiting_on_peers" in ib.findings
    healthy = diagnose(Signals(**MULTI, nics=("mlx5_0",), nic_utilization=0.05, nic_cnp_rate=0.0), t)
    assert "waiting_on_peers" in healthy.findings
    with pytest.raises(ValueError, match="nic_busy"):
        parse_thresholds({"nic_busy": True})  # TOML's true is no number
