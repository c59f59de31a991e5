"""Simulated training jobs (--sim-job): specs, timing every node agrees on, GPUs that show the job, the
slowdown fault, and ranks that report through the real SDK to a real daemon."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import ROOT, run_gpumon
from support.poll import poll

from gpumon.gpu.sim import SimNvml
from gpumon.gpu.sim.catalog import MODELS
from gpumon.gpu.sim.dynamics import ALLREDUCE, COMPUTE, DATA_WAIT
from gpumon.gpu.sim.jobs import SimJobError, parse_job, parse_jobs, timing
from gpumon.gpu.sim.ranks import JobRanks, flops_per_token, tokens_per_step

H100_BF16 = 989.5e12
THROTTLE_TIME_POWER_BRAKE = 271


@pytest.mark.parametrize(
    ("text", "gpus", "first", "world", "model"),
    [
        ("llama-70b:0-7:8/24", (0, 1, 2, 3, 4, 5, 6, 7), 8, 24, "llama3-70b"),
        ("bert-ft:0-3", (0, 1, 2, 3), 0, 4, "llama3-8b"),
        ("gpt2-ft:5,1,3-4", (5, 1, 3, 4), 0, 4, "gpt2"),
        ("x:2:3/4:model=Mistral-7B:step=0.5", (2,), 3, 4, "mistral-7b"),
    ],
)
def test_specs_parse(text, gpus, first, world, model) -> None:
    job = parse_job(text)
    assert (job.gpus, job.first_rank, job.world_size, job.model) == (gpus, first, world, model)
    assert [job.rank(g) for g in gpus] == list(range(first, first + len(gpus)))


def test_options_override_what_the_name_gives() -> None:
    job = parse_job("demo:0:step=0.5:data_wait=0.3:comm=0.2:mfu=0.5")
    t = job.timing
    assert (t.step_seconds, t.data_wait, t.communication, t.mfu) == (0.5, 0.3, 0.2, 0.5)
    assert t.load_seconds == timing("demo").load_seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("llama", "expected NAME:GPUS"),
        ("llama:", "expected NAME:GPUS"),
        ("-x:0", "NAME must be"),
        ("llama:a-b", "GPUS 'a-b' is not like 0-7"),
        ("llama:3-1", "runs backwards"),
        ("llama:0,0", "listed twice"),
        ("llama:0-7:20/24", "ranks 20..27 .* do not fit in a world size of 24"),
        # found by review: a range was built before any check (MemoryError, OverflowError: exit 70)
        ("llama:0-999999999", "GPU 999999999 does not exist \\(at most 1023\\)"),
        ("llama:0-99999999999999999999", "GPUS '0-9+' is not like 0-7"),
        ("llama:0-7:0/1048577", "WORLD_SIZE 1048577 is over 1048576"),  # every report would get 422
        ("llama:\u0663", "is not like 0-7"),  # an Arabic-Indic digit
        ("llama:0:data_wait=0.1:data_wait=0.2", "data_wait is given twice"),
        ("llama:0:model=llama3-8b:model=llama3-70b", "model is given twice"),
        ("llama:0:1/x", "expected NAME:GPUS"),
        ("llama:0:model=gpt9", "unknown model 'gpt9'"),
        ("llama:0:step=0", "step must be a number from 0.1 to 600"),
        ("llama:0:mfu=nan", "mfu must be a number"),
        ("llama:0:speed=2", "unknown option 'speed=2'"),
        ("llama:0:data_wait=0.5:comm=0.45", "under 10 % of a step for compute"),
    ],
)
def test_bad_specs_say_what_to_fix(text, message) -> None:
    with pytest.raises(SimJobError, match=message):
        parse_job(text)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["a:0-8"], "GPU 8 does not exist; the simulated node has 8 \\(0-7\\)"),
        (["a:0-3", "b:3-5"], "GPU 3 already runs sim job a"),
        (["a:0:0/4", "a:1:1/4"], "a is given twice"),
    ],
)
def test_jobs_are_checked_against_the_node_and_each_other(texts, message) -> None:
    with pytest.raises(SimJobError, match=message):
        parse_jobs(texts, 8)


def test_timing_depends_on_the_name_only_even_in_another_process() -> None:
    mine = timing("llama-70b")
    code = "from gpumon.gpu.sim.jobs import timing; print(repr(timing('llama-70b')))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert other.stdout.strip() == repr(mine)  # hash() would differ here: it is salted per process
    assert timing("llama-8b") != mine
    for name in (f"job-{i}" for i in range(200)):
        t = timing(name)
        assert 0.8 <= t.step_seconds <= 1.6 and 0.35 <= t.mfu <= 0.45
        assert 0.02 <= t.data_wait <= 0.08 and 0.08 <= t.communication <= 0.22


def test_nodes_with_other_seeds_step_the_same_job_in_step(clock) -> None:
    a = SimNvml("8xH100-SXM", seed=1, clock=clock, warmup=120, jobs=["llama-70b:0-7:0/16"])
    b = SimNvml("4xH100-SXM", seed=2, clock=clock, warmup=120, jobs=["llama-70b:0-3:8/12"])
    ja, jb = a.jobs[0], b.jobs[0]
    assert ja.timing == jb.timing
    assert [ja.steps_done(t) for t in range(0, 600, 7)] == [jb.steps_done(t) for t in range(0, 600, 7)]
    assert ja.step_end(500) - ja.step_end(499) == pytest.approx(timing("llama-70b").step_seconds)


def _readings(sim: SimNvml, clock, index: int, times: list[float]) -> list[tuple[str, int, int, float]]:
    """(job phase, utilisation %, SM MHz, cumulative NVLink KiB) of one GPU at each time."""
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(index)
    out = []
    for t in times:
        clock.t = t
        nvlink = sim.nvmlDeviceGetFieldValues(h, [(138, 0xFFFFFFFF)])[0].value.ullVal
        util = sim.nvmlDeviceGetUtilizationRates(h).gpu
        phase, _ = sim.jobs[0].phase(sim.now() - 0.1)  # the middle of the simulator's last 0.1 s step
        out.append((phase, util, sim.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), nvlink))
    return out


def test_the_jobs_gpus_follow_its_phases_and_never_idle(sims, clock) -> None:
    sim = sims("4xH100-SXM", clock=clock, warmup=120, jobs=["demo:0-1:step=1.234"])
    rows = _readings(sim, clock, 0, [0.1 * k + 0.05 for k in range(1, 1500)])
    by_phase: dict[str, list[int]] = {DATA_WAIT: [], COMPUTE: [], ALLREDUCE: []}
    traffic: dict[str, list[int]] = {COMPUTE: [], ALLREDUCE: []}
    for (phase, util, _, nvl), (_, _, _, before) in zip(rows[1:], rows, strict=False):
        by_phase[phase].append(util)
        if phase in traffic:
            traffic[phase].append(nvl - before)
    assert min(by_phase[COMPUTE]) > 90 and max(by_phase[DATA_WAIT]) < 20
    assert sum(traffic[ALLREDUCE]) / len(traffic[ALLREDUCE]) > 5 * sum(traffic[COMPUTE]) / len(
        traffic[COMPUTE]
    )
    # still the same job half an hour later, through the node's first idle gap (seed 0: 1873-2012 s)
    hours = [1500.0 + k for k in range(0, 1200, 20)]
    late = _readings(sim, clock, 1, hours)
    assert all(phase in (DATA_WAIT, COMPUTE, ALLREDUCE) and util > 0 for phase, util, _, _ in late)
    free = _readings(sim, clock, 2, hours)
    assert any(util == 0 for _, util, _, _ in free)  # a GPU outside the job keeps the node's idle gaps


def test_a_slowdown_slows_the_job_and_shows_on_the_gpu_then_both_recover(sims, clock) -> None:
    sim = sims("8xH100-SXM", clock=clock, warmup=120, jobs=["llama-70b:0-3", "bert-ft:4-7"])
    sim.nvmlInit()
    sim.faults.add("slowdown:2=2@100+200")
    llama, bert = sim.jobs
    step = llama.timing.step_seconds

    def pace(job, start: float, end: float) -> float:  # steps per second between two fault-clock times
        return (job.steps_done(end + 120) - job.steps_done(start + 120)) / (end - start)

    assert pace(llama, 0, 100) == pytest.approx(1 / step, rel=0.02)
    assert pace(llama, 100, 300) == pytest.approx(0.5 / step, rel=0.02)
    assert pace(llama, 300, 600) == pytest.approx(1 / step, rel=0.02)
    assert pace(bert, 100, 300) == pytest.approx(1 / bert.timing.step_seconds, rel=0.02)  # not its GPU

    h2, h3 = sim.nvmlDeviceGetHandleByIndex(2), sim.nvmlDeviceGetHandleByIndex(3)

    def brake_seconds() -> float:
        return sim.nvmlDeviceGetFieldValues(h2, [THROTTLE_TIME_POWER_BRAKE])[0].value.ullVal / 1e9

    clock.t = 99.0
    assert brake_seconds() == 0
    clocks, others, reasons = [], [], 0
    for k in range(1, 200):
        clock.t = 100.0 + k
        clocks.append(sim.nvmlDeviceGetClockInfo(h2, pynvml.NVML_CLOCK_SM))
        others.append(sim.nvmlDeviceGetClockInfo(h3, pynvml.NVML_CLOCK_SM))
        reasons |= sim.nvmlDeviceGetCurrentClocksEventReasons(h2)
    assert max(clocks) <= MODELS["H100-SXM"].sm_clock_max_mhz / 2 < min(others)
    assert reasons & pynvml.nvmlClocksEventReasonHwSlowdown
    assert brake_seconds() == pytest.approx(199.0, abs=1.0)
    clock.t = 400.0
    assert sim.nvmlDeviceGetClockInfo(h2, pynvml.NVML_CLOCK_SM) > MODELS["H100-SXM"].sm_clock_max_mhz / 2
    assert not sim.nvmlDeviceGetCurrentClocksEventReasons(h2) & pynvml.nvmlClocksEventReasonHwSlowdown
    assert brake_seconds() == pytest.approx(200.0, abs=1.0)


def test_a_slowdown_added_from_python_acts_from_then_on(sims, clock) -> None:
    sim = sims("2xH100-SXM", clock=clock, warmup=120, jobs=["demo:0-1"])
    job = sim.jobs[0]
    clock.t = 50.0
    before = job.steps_done(sim.now())
    fault = sim.faults.add("slowdown:1=4")
    assert job.steps_done(sim.now()) == before  # steps already taken stay taken
    clock.t = 50.0 + 40 * job.timing.step_seconds
    assert job.steps_done(sim.now()) - before in (9, 10, 11)
    sim.faults.remove(fault)
    slowed = job.steps_done(sim.now())
    clock.t += 10 * job.timing.step_seconds
    assert job.steps_done(sim.now()) - slowed in (9, 10, 11)


def test_ranks_report_steps_tokens_and_phases_for_the_jobs_mfu(sims, clock) -> None:
    sim = sims("4xH100-SXM", clock=clock, warmup=120, jobs=["llama-70b:1-2:8/24"])
    job = sim.jobs[0]
    spec, t = job.spec, job.timing
    # nothing listens on the discard port: the Reporters count, and keep their reports to themselves
    ranks = JobRanks(sim, job, "http://127.0.0.1:9", None)
    try:
        assert ranks.advance(sim.now()) == 0  # steps from before the ranks started are not theirs
        clock.t = 100 * t.step_seconds
        steps = ranks.advance(sim.now())
        assert steps in (99, 100, 101)
        tokens = tokens_per_step(spec, MODELS["H100-SXM"])
        assert tokens * flops_per_token(spec) / t.step_seconds / H100_BF16 == pytest.approx(t.mfu, rel=0.01)
        for rank in ranks.ranks:
            totals = rank.reporter.totals
            assert totals["steps"] == steps and totals["tokens"] == steps * tokens
            assert totals["samples"] == steps * tokens // 8192  # llama3-70b's sequences
            phases = totals["phases"]
            # phases cover the time since the ranks started (120 s of warm-up in), to the last step's end
            reported = job.step_end(job.steps_done(sim.now())) - 120.0
            assert sum(phases.values()) == pytest.approx(reported)
            assert phases["data_wait"] == pytest.approx(reported * t.data_wait)
            assert phases["communication"] == pytest.approx(reported * t.communication)
        settings = [r.reporter.settings for r in ranks.ranks]
        assert [(s.rank, s.local_rank, s.world_size) for s in settings] == [(8, 0, 24), (9, 1, 24)]
        assert [s.devices for s in settings] == [[sim.gpus[1].uuid], [sim.gpus[2].uuid]]
        assert {(s.job, s.workload, s.dtype, s.flops_convention) for s in settings} == {
            ("llama-70b", "llama-70b", "bf16", "palm")
        }
    finally:
        ranks.close(0.2)


@pytest.mark.parametrize(
    ("spec", "offload", "fits"),
    [
        ("llama-70b:0-5", "optimizer", True),
        ("llama-70b:0-7:0/24", "none", True),
        ("llama-70b:0-1", "optimizer", False),
    ],
)
def test_a_sim_jobs_declared_setup_is_what_its_gpus_hold(sims, clock, caplog, spec, offload, fits) -> None:
    """The daemon's estimate for what the ranks declare is what their allocators hold (the README demo's
    llama-70b on six GPUs must put its optimizer on the host); a job that cannot fit says so at start."""
    from gpumon.jobs.memoryview import gap, rank_estimate
    from gpumon.jobs.report import parse

    sim = sims("8xH100-SXM", clock=clock, warmup=120, jobs=[spec])
    with caplog.at_level("WARNING", logger="gpumon"):
        ranks = JobRanks(sim, sim.jobs[0], "http://127.0.0.1:9", None)
    try:
        assert any("more than its GPUs hold" in r.getMessage() for r in caplog.records) is not fits
        clock.t = 300.0  # loaded and steady
        ranks.advance(sim.now())
        sim.nvmlInit()
        used = sim.nvmlDeviceGetMemoryInfo(sim.nvmlDeviceGetHandleByIndex(0)).used  # the dynamics advance
        assert (used / MODELS["H100-SXM"].process_bytes > 0.96) is not fits
        reporter = ranks.ranks[0].reporter
        body = reporter._report(False)
        body["memory"] = reporter.memory_source()  # type: ignore[misc]  # the sender thread reads it so
        report = parse(body)
        assert report.setup is not None and report.setup.get("offload") == offload
        said = gap(report.memory, rank_estimate(report))  # type: ignore[arg-type]
        assert ("within 5 %" in (said or "")) is fits, said
    finally:
        ranks.close(0.2)


def test_a_gpu_without_a_known_peak_cannot_run_a_job() -> None:
    line = run_gpumon("snapshot", "--simulate", "2xRTX-A6000", "--sim-job", "a:0").stderr.strip()
    assert "no bf16 peak for RTX-A6000" in line and "\n" not in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sim-job", "a:0"], "--sim-job needs simulated GPUs"),
        (["--simulate", "2xH100-SXM", "--sim-job", "a:0-3"], "GPU 2 does not exist"),
        (["--simulate", "2xH100-SXM", "--sim-job", "a:0", "--no-ingest"], "drop --no-ingest"),
        (["--simulate", "2xH100-SXM", "--sim-job", "a", "--sim-job", "b:1"], "bad sim job 'a'"),
    ],
)
def test_bad_sim_jobs_stop_serve_with_one_line_and_exit_2(args, message) -> None:
    result = run_gpumon("serve", "--listen", "127.0.0.1:0", *args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def _samples(text: str, name: str) -> dict[tuple[str, str], dict[str, str] | float]:
    out: dict = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[(s.labels.get("job_name"), s.labels.get("rank"))] = (
                    s.labels if name.endswith("_info") else s.value
                )
    return out


def _metrics_when(d, condition: Callable[[str], bool]) -> Callable[[], str | None]:
    """A condition for poll: the daemon's /metrics text once ``condition(metrics)`` holds."""

    def cond() -> str | None:
        metrics = d.get("/metrics").text
        return metrics if condition(metrics) else None

    return cond


def _log(d) -> Callable[[], str]:
    """poll's ``detail``: the daemon's log, for when what it waits for never comes."""
    return lambda: "daemon log:\n" + "\n".join(d.log)


def _tps(metrics: str) -> dict:
    return _samples(metrics, "gpumon_training_tokens_per_second")


@pytest.mark.slow
def test_serve_runs_the_jobs_through_its_own_ingest_and_a_slowdown_drops_tokens(daemon) -> None:
    token = "sim-job-test-token-0123"
    d = daemon(
        "--simulate", "8xH100-SXM", "--interval", "250ms", "--rate-window", "3s", "--ingest-token", token,
        "--sim-job", "llama-70b:0-3:4/12", "--sim-job", "bert-ft:4-7:step=0.5",
        "--sim-fault", "slowdown:1=3@10", "--collect", "rank-rates",  # per-rank tokens/s and MFU
    )  # fmt: skip
    ranks = {("llama-70b", str(r)) for r in range(4, 8)} | {("bert-ft", str(r)) for r in range(4)}
    metrics = poll(
        _metrics_when(d, lambda m: all(_tps(m).get(k, 0) > 0 for k in ranks)),
        60,
        "tokens/s from every rank of both jobs",
        every=0.25,
        detail=_log(d),
    )
    before = _tps(metrics)
    mfu = _samples(metrics, "gpumon_training_mfu_ratio")
    assert all(0.3 < mfu[k] < 0.5 for k in ranks), mfu  # type: ignore[operator]
    gpus = {str(g["index"]): g["uuid"] for g in d.get("/v1/gpus").json()["gpus"]}
    info = _samples(metrics, "gpumon_training_rank_gpu_info")
    for job, first, gpu0 in (("llama-70b", 4, 0), ("bert-ft", 0, 4)):
        for i in range(4):
            labels = info[(job, str(first + i))]
            assert labels["via"] == "device" and labels["gpu"] == str(gpu0 + i)  # type: ignore[index]
            assert labels["uuid"] == gpus[str(gpu0 + i)]  # type: ignore[index]

    # GPU 1 runs three times slower from t=10 s: every llama rank on this node waits for it; bert does not
    slowed = poll(
        _metrics_when(
            d,
            lambda m: all(
                _tps(m)[("llama-70b", str(r))] < 0.6 * before[("llama-70b", str(r))] for r in range(4, 8)
            ),
        ),
        60,
        "every llama-70b rank to slow down",
        every=0.25,
        detail=_log(d),
    )
    after = _tps(slowed)
    for r in range(4):
        assert after[("bert-ft", str(r))] == pytest.approx(before[("bert-ft", str(r))], rel=0.25)
    throttled = {
        (s.labels["gpu"], s.labels["reason"]): s.value
        for fam in text_string_to_metric_families(slowed)
        for s in fam.samples
        if s.name == "gpumon_gpu_throttle_active"
    }
    assert throttled[("1", "hw_slowdown")] == 1 and throttled[("2", "hw_slowdown")] == 0
    assert d.stop() == 0


@pytest.mark.slow
def test_ranks_report_over_the_ingest_socket_when_there_is_one(daemon, tmp_path) -> None:
    sock = tmp_path / "ingest.sock"
    d = daemon(
        "--simulate", "2xH100-SXM", "--rate-window", "3s", "--ingest-socket", str(sock), "--sim-job", "s:0-1"
    )
    tokens = lambda m: _samples(m, "gpumon_training_tokens_total")  # noqa: E731
    poll(
        _metrics_when(d, lambda m: all(tokens(m).get(("s", r), 0) > 0 for r in "01")),
        60,
        "tokens from both ranks over the ingest socket",
        every=0.25,
        detail=_log(d),
    )
    assert any(f"reporting to unix://{sock}" in line for line in d.log)
