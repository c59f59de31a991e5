"""--sim-speed: simulated time runs FACTOR times faster than real time, and everything timed follows it (the
node's jobs and processes, the dynamics and their counters, fault windows, XIDs), while what NVML stamps with
the wall clock stays on it; the setting is validated like every other."""

from __future__ import annotations

import math
import threading
import time

import pynvml
import pytest
from support.helpers import ManualClock, run_gpumon

from gpumon.cli.common import simulated_backend
from gpumon.config import ConfigError, resolve
from gpumon.gpu.sim import SimNvml
from gpumon.gpu.sim.dynamics import DT, MAX_STEP_RATE, NodeWorkload, step_seconds
from gpumon.gpu.sim.nvml import MAX_SPEED


def pids(sim: SimNvml) -> list[int]:
    return [int(p.pid) for g in sim.gpus for p in sim.nvmlDeviceGetComputeRunningProcesses(g)]


def test_simulated_time_runs_speed_times_faster_than_the_clock(sims, clock: ManualClock) -> None:
    sim = sims(clock=clock, speed=240, warmup=120.0)
    clock.advance(15.0)
    assert sim.elapsed() == pytest.approx(3600.0)
    assert sim.now() == pytest.approx(3720.0)
    assert sim.wall_elapsed() == pytest.approx(15.0)


def test_the_node_job_schedule_and_its_processes_follow_simulated_time(sims, clock: ManualClock) -> None:
    """At 60x, a real minute is a simulated hour: the processes are those of the job the node's schedule (a
    pure function of the seed and simulated time) runs then."""
    sim = sims(clock=clock, speed=60, warmup=120.0)
    sim.nvmlInit()
    schedule = NodeWorkload(0)
    seen = set()
    for minute in range(0, 240, 7):  # four simulated hours in 7-minute strides
        clock.t = minute * 1.0
        job = schedule.job_at(minute * 60.0 + 120.0)
        assert pids(sim) == ([] if job is None else [20000 + job.number * 64 + i for i in range(2)])
        seen.add(None if job is None else job.number)
    assert len(seen) >= 4, "jobs started and stopped, their processes with them"


def test_energy_and_traffic_counters_grow_with_simulated_time(sims, clock: ManualClock) -> None:
    sim = sims("1xH100-SXM", clock=clock, speed=50)
    sim.nvmlInit()
    gpu = sim.gpus[0]
    clock.advance(10.0)  # 500 simulated seconds
    joules = sim.nvmlDeviceGetTotalEnergyConsumption(gpu) / 1000
    model = gpu.model
    # at least idle power for 500 s: ten times what 10 s at full power could give
    assert model.idle_watts * 500 <= joules <= model.tdp_watts * 1.1 * 500
    assert joules > 5 * model.tdp_watts * 10
    assert sum(gpu.state.nvlink_tx) > 0 and gpu.state.pcie_rx_bytes > 0


def test_gpm_rates_are_per_simulated_second(sims, clock: ManualClock) -> None:
    """GPM averages over simulated time: the SM active share stays a share (0-100 %), not speed x it."""
    sim = sims("1xH100-SXM", clock=clock, speed=100, warmup=120.0)
    sim.nvmlInit()
    gpu = sim.gpus[0]
    first, second = sim.nvmlGpmSampleAlloc(), sim.nvmlGpmSampleAlloc()
    sim.nvmlGpmSampleGet(gpu, first)
    clock.advance(1.0)
    sim.nvmlGpmSampleGet(gpu, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    sim.nvmlGpmMetricsGet(request)
    assert request.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert 0.0 <= request.metrics[0].value <= 100.0


def test_fault_windows_are_in_simulated_seconds(sims, clock: ManualClock) -> None:
    sim = sims(clock=clock, speed=100)
    sim.nvmlInit()
    sim.faults.add("lost:1@600+300")  # simulated minute 10 to 15: real seconds 6 to 9
    gpu = sim.gpus[1]
    for t, lost in ((5.9, False), (6.1, True), (8.9, True), (9.1, False)):
        clock.t = t
        if lost:
            with pytest.raises(pynvml.NVMLError_GpuIsLost):
                sim.nvmlDeviceGetPowerUsage(gpu)
        else:
            sim.nvmlDeviceGetPowerUsage(gpu)


def test_a_scheduled_xid_arrives_at_its_simulated_time(sims, clock: ManualClock) -> None:
    sim = sims(clock=clock, speed=100)
    sim.nvmlInit()
    sim.faults.add("xid:1:79@1000")
    event_set = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(sim.gpus[1], pynvml.nvmlEventTypeXidCriticalError, event_set)
    clock.t = 9.9
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(event_set, 0)
    clock.t = 10.1
    event = sim.nvmlEventSetWait_v2(event_set, 0)
    assert (event.device.index, event.eventData) == (1, 79)


def test_a_hang_lasts_its_simulated_duration_divided_by_the_speed(sims) -> None:
    """Generous bound: the hang is 50 simulated seconds; unaccelerated it would block 50 s, here 0.5 s."""
    sim = sims("1xH100-SXM", speed=100)
    sim.nvmlInit()
    sim.faults.add("hang:0:nvmlDeviceGetPowerUsage@0+50")
    done = threading.Event()
    t0 = time.monotonic()
    threading.Thread(
        target=lambda: (sim.nvmlDeviceGetPowerUsage(sim.gpus[0]), done.set()), daemon=True
    ).start()
    assert done.wait(20.0), "the hang did not end"
    assert 0.4 <= time.monotonic() - t0 < 20.0


def test_process_samples_stay_stamped_with_the_wall_clock(sims, clock: ManualClock) -> None:
    sim = sims("1xH100-SXM", clock=clock, speed=1000, warmup=120.0)
    sim.nvmlInit()
    epoch = time.time()
    clock.advance(10.0)  # 10 000 simulated seconds
    (sample,) = sim.nvmlDeviceGetProcessUtilization(sim.gpus[0], 0)
    assert sample.timeStamp / 1e6 - epoch == pytest.approx(10.0, abs=1.0)


def test_a_fast_simulator_takes_longer_steps_so_its_cost_per_real_second_is_bounded(sims, clock) -> None:
    assert step_seconds(1) == step_seconds(10) == DT
    assert step_seconds(1000) == 1000 / MAX_STEP_RATE
    sim = sims("1xH100-SXM", clock=clock, speed=1000)
    sim.nvmlInit()
    clock.advance(1.0)
    sim.nvmlDeviceGetPowerUsage(sim.gpus[0])
    assert sim.gpus[0].dynamics.steps == MAX_STEP_RATE  # 1000 simulated seconds in 10 s steps, not 10 000


@pytest.mark.parametrize("speed", [0, -1, MAX_SPEED * 2, math.nan, math.inf])
def test_the_simulator_refuses_a_speed_out_of_range(speed: float) -> None:
    with pytest.raises(ValueError, match="speed must be above 0"):
        SimNvml("1xH100-SXM", speed=speed)


def test_simulated_jobs_need_real_time() -> None:
    with pytest.raises(ValueError, match="speed must be 1 with jobs"):
        SimNvml("2xH100-SXM", speed=10, jobs=["bert:0-1"])


def test_sim_speed_comes_from_flags_env_and_the_config_file(tmp_path) -> None:
    assert resolve({"simulate": "2xL4", "sim_speed": "480"}, env={}).sim_speed == 480.0
    assert resolve({}, env={"GPUMON_SIMULATE": "2xL4", "GPUMON_SIM_SPEED": "0.5"}).sim_speed == 0.5
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text('backend = "sim"\nsim_speed = 100\n')
    assert resolve({}, env={"GPUMON_CONFIG": str(cfg)}).sim_speed == 100.0
    assert resolve({"simulate": "2xL4"}, env={}).sim_speed == 1.0


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"simulate": "2xL4", "sim_speed": "0"}, "sim-speed: expected a number above 0 and at most 10000"),
        ({"simulate": "2xL4", "sim_speed": "fast"}, "got 'fast'"),
        ({"simulate": "2xL4", "sim_speed": "nan"}, "sim-speed: expected a number"),
        ({"simulate": "2xL4", "sim_speed": "1e9"}, "at most 10000"),
        ({"simulate": "2xL4", "sim_speed": True}, "got True"),
        ({"sim_speed": "10"}, "--sim-speed needs simulated GPUs"),
        ({"simulate": "2xL4", "sim_speed": "10", "sim_jobs": ["a:0"]}, "drop --sim-speed 10"),
    ],
)
def test_a_bad_sim_speed_is_a_one_line_error(given, message) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(given, env={})


def test_gpumon_refuses_a_bad_sim_speed_with_exit_2_and_no_traceback() -> None:
    result = run_gpumon("serve", "--simulate", "1xH100-SXM", "--sim-speed", "0")
    assert result.returncode == 2
    assert "sim-speed: expected a number above 0" in result.stderr and "Traceback" not in result.stderr


def test_the_setting_reaches_the_simulator_the_daemon_opens() -> None:
    settings = resolve({"simulate": "2xH100-SXM", "sim_speed": "480", "sim_faults": ["lost:1@3600"]}, env={})
    backend = simulated_backend("2xH100-SXM", settings)
    assert isinstance(backend.nv, SimNvml) and backend.nv.speed == 480.0
