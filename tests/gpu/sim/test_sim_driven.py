"""A coherent simulated node: GPUs idle unless something uses them, and a real SDK process reporting on a
simulated GPU drives it by its phases (gpumon/gpu/sim/driven.py). The end-to-end half (a real training loop,
a real daemon, the verdict) is tests/e2e/test_training.py's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpumon.gpu.sim import SimNvml
from gpumon.gpu.sim.driven import CONTEXT_BYTES, STALE, _shares
from gpumon.gpu.sim.dynamics import ALLREDUCE, CHECKPOINT, COMPUTE, DATA_WAIT

GIB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Rep:
    """The fields of gpumon.jobs.report.Report the driver reads."""

    time: float
    phases: dict[str, float]
    devices: tuple[str, ...] = ("0",)
    pid: int = field(default_factory=os.getpid)  # alive: this test's own process
    job: str = "j"
    rank: int = 0
    incarnation: str = "i1"
    started: float = 0.0
    open_phases: dict[str, float] = field(default_factory=dict)
    memory: Any = None
    final: bool = False
    world_size: int = 1
    steps: float = 0.0

    @property
    def totals(self) -> Any:
        return Steps(self.steps)


@dataclass
class Steps:
    steps: float


@dataclass
class Mem:
    reserved_bytes: int | None


def node(spec: str = "2xH100-SXM", **kw: Any) -> tuple[SimNvml, Clock]:
    clock = Clock()
    sim = SimNvml(spec, clock=clock, unreported_jobs=False, **kw)
    sim.nvmlInit()
    return sim, clock


def read(sim: SimNvml, index: int = 0) -> dict[str, Any]:
    h = sim.nvmlDeviceGetHandleByIndex(index)
    return {
        "util": sim.nvmlDeviceGetUtilizationRates(h).gpu / 100,
        "used": sim.nvmlDeviceGetMemoryInfo(h).used,
        "power": sim.nvmlDeviceGetPowerUsage(h) / 1000,
        "reasons": sim.nvmlDeviceGetCurrentClocksEventReasons(h),
        "procs": sim.nvmlDeviceGetComputeRunningProcesses(h),
    }


def drive(sim: SimNvml, clock: Clock, shares: dict[str, float], seconds: float = 30.0, **kw: Any) -> None:
    """Reports every second for ``seconds``, each second split by ``shares`` (phase -> share)."""
    totals = dict.fromkeys(shares, 0.0)
    start = clock.t
    sim.driver.observe(Rep(time=clock.t, phases=dict(totals), started=start - 1, **kw))
    for _ in range(int(seconds)):
        clock.t += 1.0
        for name, share in shares.items():
            totals[name] += share
        sim.driver.observe(Rep(time=clock.t, phases=dict(totals), started=start - 1, **kw))


def test_a_node_nobody_uses_idles() -> None:
    sim, clock = node()
    clock.t += 60
    for i in range(2):
        r = read(sim, i)
        model = sim.gpus[i].model
        assert r["util"] == 0 and sim.gpus[i].state.memory_used == 0 and r["procs"] == []
        assert r["power"] < model.idle_watts * 1.05 and r["reasons"] & 0x1  # GPU idle
    assert not sim.pod_owners()


def test_a_loop_waiting_on_data_leaves_its_gpu_mostly_idle() -> None:
    sim, clock = node()
    drive(sim, clock, {"data_wait": 0.6, "forward_backward": 0.35, "optimizer": 0.05})
    r = read(sim)
    # 40 % compute at 99 %, 60 % data wait at 4 %
    assert r["util"] == pytest.approx(0.4 * 0.99 + 0.6 * 0.04, abs=0.04)
    assert not r["reasons"] & 0x1
    assert read(sim, 1)["util"] == 0  # the other GPU is nobody's
    (proc,) = r["procs"]
    assert proc.pid == os.getpid() and proc.usedGpuMemory == CONTEXT_BYTES
    busy, busy_clock = node()
    drive(busy, busy_clock, {"forward_backward": 1.0})
    assert read(busy)["util"] > 0.95 and read(busy)["power"] > r["power"]


def test_the_process_is_listed_as_this_host_names_it() -> None:
    sim, clock = node()
    root = sim.proc_root()
    drive(sim, clock, {"forward_backward": 1.0}, seconds=3)
    read(sim)  # lists the process and writes its /proc entry
    with open(f"/proc/{os.getpid()}/comm") as fh:
        comm = fh.read().strip()
    with open(os.path.join(root, str(os.getpid()), "comm")) as fh:
        assert fh.read().strip() == comm
    with open(os.path.join(root, str(os.getpid()), "status")) as fh:
        assert f"Uid:\t{os.getuid()}" in fh.read()
    sim.remove_proc_root()


def test_reported_allocator_bytes_fill_hbm() -> None:
    sim, clock = node()
    drive(sim, clock, {"forward_backward": 1.0}, memory=Mem(reserved_bytes=20 * GIB))
    r = read(sim)
    assert sim.gpus[0].state.memory_used == pytest.approx(20 * GIB + CONTEXT_BYTES, rel=0.01)
    assert r["procs"][0].usedGpuMemory == 20 * GIB + CONTEXT_BYTES


def test_communication_goes_over_nvlink_and_checkpoints_over_pcie() -> None:
    def traffic(shares: dict[str, float]) -> tuple[float, float]:
        sim, clock = node()
        h = sim.nvmlDeviceGetHandleByIndex(0)
        drive(sim, clock, shares, seconds=2)
        sim.nvmlDeviceGetUtilizationRates(h)
        nvl0 = sum(sim.gpus[0].state.nvlink_tx)
        tx0 = sim.gpus[0].state.pcie_tx_bytes
        drive(sim, clock, shares, seconds=10)
        sim.nvmlDeviceGetUtilizationRates(h)
        return sum(sim.gpus[0].state.nvlink_tx) - nvl0, sim.gpus[0].state.pcie_tx_bytes - tx0

    comm_nvl, _ = traffic({"communication": 0.5, "forward_backward": 0.5})
    compute_nvl, compute_tx = traffic({"forward_backward": 1.0})
    _, ckpt_tx = traffic({"checkpoint": 0.8, "forward_backward": 0.2})
    assert comm_nvl > 5 * compute_nvl and ckpt_tx > 5 * compute_tx


def test_the_gpu_idles_again_when_the_process_ends_goes_silent_or_dies() -> None:
    sim, clock = node()
    drive(sim, clock, {"forward_backward": 1.0}, seconds=5)
    assert read(sim)["procs"]
    sim.driver.observe(Rep(time=clock.t + 1, phases={"forward_backward": 6.0}, final=True))
    clock.t += 30
    assert read(sim)["procs"] == [] and read(sim)["util"] == 0

    drive(sim, clock, {"forward_backward": 1.0}, seconds=5, incarnation="i2")
    clock.t += STALE + 1  # silent
    assert read(sim)["procs"] == []

    dead = 2**22 + 12345  # above any pid_max: no such process
    drive(sim, clock, {"forward_backward": 1.0}, seconds=5, incarnation="i3", pid=dead)
    assert read(sim)["procs"] == [] and read(sim)["util"] == 0


def test_devices_by_uuid_and_what_cannot_be_driven() -> None:
    sim, clock = node("3xH100-SXM", jobs=["demo:2"])
    drive(sim, clock, {"forward_backward": 1.0}, devices=(sim.gpus[1].uuid,))
    assert read(sim, 1)["util"] > 0.9 and read(sim, 0)["util"] == 0
    # GPU 2 runs a --sim-job, whose own ranks report for it: a report naming it changes nothing there
    before = sim.processes(sim.gpus[2])
    drive(sim, clock, {"data_wait": 1.0}, devices=("2", "7", "GPU-nonexistent"), incarnation="x", job="k")
    assert [p.pid for p in sim.processes(sim.gpus[2])] == [p.pid for p in before]


def test_with_unreported_jobs_a_driven_gpu_still_shows_its_process_not_the_background() -> None:
    clock = Clock()
    sim = SimNvml("1xH100-SXM", clock=clock, warmup=120.0)  # the node's own jobs, the class default
    sim.nvmlInit()
    assert read(sim)["procs"] and read(sim)["procs"][0].pid != os.getpid()
    drive(sim, clock, {"data_wait": 1.0}, seconds=5)
    assert [p.pid for p in read(sim)["procs"]] == [os.getpid()]


@pytest.mark.parametrize(
    ("spent", "wall", "expected"),
    [
        ({}, 1.0, {COMPUTE: 1.0}),  # step() only: busy
        ({"data_wait": 0.25}, 1.0, {DATA_WAIT: 0.25, COMPUTE: 0.75}),
        (
            {"communication": 0.2, "checkpoint": 0.1, "evaluation": 0.3},
            1.0,
            {ALLREDUCE: 0.2, CHECKPOINT: 0.1, COMPUTE: 0.7},
        ),
        ({"data_wait": 1.5, "forward_backward": 0.5}, 1.0, {DATA_WAIT: 0.75, COMPUTE: 0.25}),  # overlapping
        ({"data_wait": -1.0}, 1.0, {COMPUTE: 1.0}),  # a restart's counters: nothing negative
    ],
)
def test_shares(spent: dict[str, float], wall: float, expected: dict[str, float]) -> None:
    got = _shares(spent, wall)
    assert got == pytest.approx(expected) and sum(got.values()) == pytest.approx(1.0)


def test_running_phases_count() -> None:
    """A checkpoint still running at the report (open_phases) already idles the SMs."""
    sim, clock = node()
    drive(sim, clock, {"forward_backward": 1.0}, seconds=3)
    clock.t += 1
    sim.driver.observe(Rep(time=clock.t, phases={"forward_backward": 3.0}, open_phases={"checkpoint": 1.0}))
    assert sim.gpus[0].dynamics.workload.shares() == pytest.approx({CHECKPOINT: 1.0})  # type: ignore[union-attr]
    assert read(sim)["util"] < 0.2


def test_a_restarted_rank_replaces_its_predecessor() -> None:
    """One entry per (job, rank), as the store admits them: a flood of incarnations cannot grow the driver."""
    sim, clock = node()
    parent = os.getppid()  # alive too: the restarted process
    drive(sim, clock, {"forward_backward": 1.0}, seconds=2)
    for n in range(200):
        sim.driver.observe(
            Rep(time=clock.t + 1, phases={}, incarnation=f"new{n}", pid=parent, started=clock.t)
        )
    assert [p.pid for p in read(sim)["procs"]] == [parent]
    assert len(sim.driver._procs) == 1


def test_hbm_is_what_the_listed_processes_hold_at_once_and_free_when_they_go() -> None:
    sim, clock = node()
    drive(sim, clock, {"forward_backward": 1.0}, seconds=1, memory=Mem(reserved_bytes=60 * GIB))
    r = read(sim)
    (proc,) = r["procs"]
    assert sim.gpus[0].state.memory_used == proc.usedGpuMemory == 60 * GIB + CONTEXT_BYTES
    sim.driver.observe(Rep(time=clock.t + 0.5, phases={"forward_backward": 1.5}, final=True))
    clock.t += 0.2  # within a sweep
    assert read(sim)["procs"] == [] and sim.gpus[0].state.memory_used == 0


def test_process_memory_never_exceeds_the_gpu() -> None:
    sim, clock = node()
    drive(sim, clock, {"forward_backward": 1.0}, seconds=2, memory=Mem(reserved_bytes=2**61))
    model = sim.gpus[0].model
    total = (model.memory_mib - model.reserved_mib) << 20
    (proc,) = read(sim)["procs"]
    assert proc.usedGpuMemory == total == sim.gpus[0].state.memory_used


def test_one_pid_reporting_twice_is_one_process() -> None:
    sim, clock = node()
    drive(sim, clock, {"forward_backward": 1.0}, seconds=2, job="a", memory=Mem(reserved_bytes=4 * GIB))
    drive(sim, clock, {"forward_backward": 1.0}, seconds=2, job="b", memory=Mem(reserved_bytes=2 * GIB))
    (proc,) = read(sim)["procs"]
    assert proc.usedGpuMemory == 4 * GIB + CONTEXT_BYTES == sim.gpus[0].state.memory_used


def test_mig_gpus_and_non_ascii_indexes_are_not_driven() -> None:
    sim, clock = node("1xH100-SXM/mig=3g.40gb+2g.20gb,1xH100-SXM")
    mig_uuid = sim.gpus[0].mig[0].uuid
    drive(sim, clock, {"forward_backward": 1.0}, devices=("0", mig_uuid, sim.gpus[0].uuid, "\u0661"))
    assert sim.processes(sim.gpus[0]) == [] and sim.processes(sim.gpus[1]) == []


def test_two_jobs_time_sliced_on_one_gpu_each_get_their_share_of_its_busy_time() -> None:
    """A compute-bound loop and one waiting 60 % on data, on one GPU: their kernels add up (the GPU is busy
    all the time, not their mean), and NVML's per-process use splits that by their demand, as the diagnosis
    reads it to tell the two jobs apart."""
    sim, clock = node()
    busy, waiting = os.getpid(), os.getppid()
    start = clock.t
    totals = {"a": 0.0, "b": 0.0}
    for _ in range(30):
        clock.t += 1.0
        totals["a"] += 1.0
        totals["b"] += 0.6
        sim.driver.observe(
            Rep(time=clock.t, phases={"forward_backward": totals["a"]}, pid=busy, job="a", started=start - 1)
        )
        sim.driver.observe(
            Rep(time=clock.t, phases={"data_wait": totals["b"]}, pid=waiting, job="b", started=start - 1)
        )
    state = read(sim)
    assert state["util"] >= 0.9, "1.0 + 0.4 of demand keeps the GPU busy"
    h = sim.nvmlDeviceGetHandleByIndex(0)
    use = {s.pid: s.smUtil / 100 for s in sim.nvmlDeviceGetProcessUtilization(h, 0)}
    assert use[busy] == pytest.approx(state["util"] / 1.4, abs=0.02)
    assert use[waiting] == pytest.approx(state["util"] * 0.4 / 1.4, abs=0.02)
