"""Believable GPU dynamics for the simulator, deterministic under a seed.

A node runs a sequence of training jobs. Each job loads (HBM fills), then repeats optimizer steps made of a
compute phase (util and power high, occasional power capping), an all-reduce (NVLink traffic) and, every so
often, a data-wait stall or a checkpoint (PCIe traffic to the host); between jobs the GPUs idle. Every GPU
advances in fixed steps of ``DT`` seconds with its own seeded random stream, so the state at time t depends
only on the seed and t, never on when or how often it was read. A simulator whose clock runs faster than real
time (``--sim-speed``) takes longer steps (``step_seconds``), so that its cost per real second stays bounded;
its state then depends on the speed too.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gpumon.gpu.sim.catalog import SimModel
from gpumon.gpu.types import THROTTLE_REASONS

DT = 0.1  # seconds per simulation step
# at most this many steps per GPU per real second: beyond 10x real time the steps lengthen instead, since a
# step costs ~20 us of Python and a sweep must read 8 GPUs well inside its deadline (at 1000x, 0.1 s steps
# would cost 80 % of a core)
MAX_STEP_RATE = 100.0


def step_seconds(speed: float) -> float:
    """The simulation step for a clock running ``speed`` times real time: DT up to 10x, then longer."""
    return max(DT, speed / MAX_STEP_RATE)


IDLE, LOADING, COMPUTE, ALLREDUCE, DATA_WAIT, CHECKPOINT = (
    "idle",
    "loading",
    "compute",
    "allreduce",
    "data_wait",
    "checkpoint",
)
# a workload whose GPU is in several phases over each interval (driven.py): its loads blended by share
MIXED = "mixed"

# NVML clock-event bits the simulator raises
GPU_IDLE, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x1, 0x4, 0x8, 0x20, 0x40, 0x80
# cumulative throttle-time field ids (ns) by reason bit, for every reason NVML keeps a time for
THROTTLE_FIELDS = {bit: fid for bit, _, fid in THROTTLE_REASONS if fid is not None}


def _mix(*parts: int) -> int:
    """A stable 64-bit hash of integers (splitmix64 steps): Python's hash() is salted per process."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x


def _unit(*parts: int) -> float:
    return _mix(*parts) / 2.0**64


@dataclass(frozen=True)
class Job:
    number: int
    start: float
    end: float
    load_seconds: float
    step_seconds: float
    allreduce_fraction: float
    fill_ratio: float  # share of HBM the job ends up holding
    # a MIXED phase's share of time in each phase (driven.py); None for jobs that are in one phase at a time
    shares: Mapping[str, float] | None = None
    # bytes the job holds on each of its GPUs, in place of fill_ratio (a --sim-job: what its declared setup
    # needs, gpumon/gpu/sim/jobs.py)
    fill_bytes: float | None = None
    # the share of its all-reduce time a GPU's traffic crosses its NIC at full speed: 0 for a job on one
    # node (NVLink carries it all), 1 for one across nodes that never waits, less for one that waits in its
    # collectives for a slower peer on another node (its NIC idles meanwhile)
    network: float = 0.0


class Workload(Protocol):
    """What a GPU runs: nothing (IdleWorkload), the node's job sequence (NodeWorkload), one simulated job
    (jobs.SimJob), or what SDK processes report (driven.DrivenWorkload). A MIXED phase's job carries the
    share of each phase (``Job.shares``)."""

    def job_at(self, t: float) -> Job | None: ...
    def phase(self, t: float) -> tuple[str, Job | None]: ...


class IdleWorkload:
    """A GPU nothing uses: what a simulated GPU runs unless a job or an SDK process uses it."""

    def job_at(self, t: float) -> Job | None:
        return None

    def phase(self, t: float) -> tuple[str, Job | None]:
        return IDLE, None


class NodeWorkload:
    """The job schedule of one node: a pure function of (seed, time)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._jobs: list[Job] = []
        self._starts: list[float] = []
        self._next_start = 0.0

    def _extend(self, until: float) -> None:
        while self._next_start <= until:
            n = len(self._jobs)
            u = [_unit(self.seed, n, k) for k in range(7)]
            length = 1200.0 + 2400.0 * u[1]  # 20-60 min
            job = Job(
                number=n,
                start=self._next_start,
                end=self._next_start + length,
                load_seconds=15.0 + 20.0 * u[2],
                step_seconds=0.8 + 0.8 * u[3],
                allreduce_fraction=0.12 + 0.15 * u[4],
                fill_ratio=0.70 + 0.25 * u[5],
                network=1.0,  # the node's jobs span nodes: their all-reduce crosses the NICs
            )
            self._jobs.append(job)
            self._starts.append(job.start)
            self._next_start = job.end + 60.0 + 120.0 * u[6]  # 1-3 min idle between jobs

    def job_at(self, t: float) -> Job | None:
        self._extend(t)
        i = bisect.bisect_right(self._starts, t) - 1
        if i < 0:
            return None
        job = self._jobs[i]
        return job if t < job.end else None

    def phase(self, t: float) -> tuple[str, Job | None]:
        job = self.job_at(t)
        if job is None:
            return IDLE, None
        into = t - job.start
        if into < job.load_seconds:
            return LOADING, job
        step, offset = divmod(into - job.load_seconds, job.step_seconds)
        step = int(step)
        if step % 600 == 599:  # a checkpoint every ~10-15 min, a whole step long
            return CHECKPOINT, job
        frac = offset / job.step_seconds
        if step % 25 == 0 and frac < 0.3:  # the input pipeline falls behind now and then
            return DATA_WAIT, job
        if frac >= 1.0 - job.allreduce_fraction:
            return ALLREDUCE, job
        return COMPUTE, job


class DeviceState:
    """Current physical values of one simulated GPU (base units; the NVML facade converts)."""

    __slots__ = (
        "activity",
        "ecc_aggregate",
        "ecc_volatile",
        "energy_j",
        "fan_ratio",
        "link_up",
        "mem_clock_mhz",
        "mem_temp_c",
        "mem_util",
        "memory_used",
        "net_seconds",
        "nvlink_rx",
        "nvlink_tx",
        "pcie_gen",
        "pcie_rx_bytes",
        "pcie_rx_rate",
        "pcie_tx_bytes",
        "pcie_tx_rate",
        "pcie_width",
        "power_limit_w",
        "power_w",
        "pstate",
        "reasons",
        "remap",
        "replays",
        "sm_clock_mhz",
        "temp_c",
        "throttle_ns",
        "util",
    )

    def __init__(self, model: SimModel) -> None:
        self.util = 0.0
        self.mem_util = 0.0
        self.memory_used = 0.0
        self.power_w = model.idle_watts
        self.power_limit_w = model.tdp_watts
        self.energy_j = 0.0
        self.temp_c = 30.0
        self.mem_temp_c = 32.0
        self.sm_clock_mhz = float(model.sm_clock_idle_mhz)
        self.mem_clock_mhz = float(model.memory_clock_mhz)
        self.reasons = GPU_IDLE
        self.throttle_ns = dict.fromkeys(THROTTLE_FIELDS.values(), 0)
        self.pcie_tx_bytes = 0.0
        self.pcie_rx_bytes = 0.0
        self.pcie_tx_rate = 0.0
        self.pcie_rx_rate = 0.0
        self.pcie_gen = model.pcie_generation
        self.pcie_width = model.pcie_width
        self.replays = 0
        self.nvlink_tx = [0.0] * model.nvlinks
        self.nvlink_rx = [0.0] * model.nvlinks
        self.link_up = [True] * model.nvlinks
        self.ecc_volatile = [0, 0]  # corrected, uncorrected
        self.ecc_aggregate = [0, 0]
        self.remap = [0, 0, 0, 0]  # correctable, uncorrectable, pending, failure
        self.pstate = 0
        self.fan_ratio = 0.30
        # ratio-seconds each profiling unit was active, cumulative (what GPM samples difference)
        self.activity = dict.fromkeys(ACTIVITY_UNITS, 0.0)
        # seconds this GPU's inter-node traffic kept a NIC busy at full speed, cumulative (gpumon/net/
        # simulated.py turns them into a NIC's bytes)
        self.net_seconds = 0.0


# phase → (power share of TDP, util, memory-controller util, NVLink share of link bandwidth,
#          PCIe rx B/s, PCIe tx B/s)
_PHASE_LOAD = {
    # an idle GPU still moves ~0.35 MB/s over PCIe each way (driver housekeeping: H100 and H200 captures)
    IDLE: (0.0, 0.0, 0.0, 0.0, 0.33e6, 0.35e6),
    LOADING: (0.22, 0.12, 0.05, 0.0, 9.0e9, 0.1e9),
    # what dense kernels would draw at full clocks: more than the limit, so the limiter holds them (below)
    COMPUTE: (1.3, 0.99, 0.38, 0.04, 2.0e9, 0.15e9),
    ALLREDUCE: (0.55, 0.92, 0.22, 0.82, 0.3e9, 0.05e9),
    DATA_WAIT: (0.24, 0.04, 0.02, 0.0, 6.0e9, 0.05e9),
    CHECKPOINT: (0.30, 0.15, 0.18, 0.0, 0.2e9, 11.0e9),
}


# GPM's units; per phase, the share of time each was active (tensor-heavy compute, memory-bound all-reduce)
ACTIVITY_UNITS = ("graphics", "sm", "occupancy", "tensor", "dram", "fp64", "fp32", "fp16")
_PHASE_ACTIVITY = {
    IDLE: (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    LOADING: (0.12, 0.08, 0.04, 0.0, 0.05, 0.0, 0.03, 0.01),
    COMPUTE: (0.99, 0.93, 0.55, 0.62, 0.38, 0.0, 0.08, 0.05),
    ALLREDUCE: (0.92, 0.35, 0.20, 0.02, 0.55, 0.0, 0.06, 0.01),
    DATA_WAIT: (0.04, 0.02, 0.01, 0.01, 0.02, 0.0, 0.01, 0.0),
    CHECKPOINT: (0.15, 0.10, 0.05, 0.0, 0.18, 0.0, 0.02, 0.0),
}


def _blend(table: Mapping[str, tuple[float, ...]], shares: Mapping[str, float]) -> tuple[float, ...]:
    """A phase table's row for a GPU that spends ``shares`` of its time in each phase (shares sum to 1)."""
    rows = [(table[phase], share) for phase, share in shares.items()]
    return tuple(sum(row[i] * share for row, share in rows) for i in range(len(table[IDLE])))


class TrainingDynamics:
    """Advances one GPU's DeviceState through its workload. ``slowdown(t)`` says how many times slower the
    GPU itself runs at t (a ``slowdown`` fault): its clocks drop and the hardware-slowdown reasons show."""

    def __init__(
        self,
        model: SimModel,
        index: int,
        seed: int,
        workload: Workload,
        slowdown: Callable[[float], float] | None = None,
        dt: float = DT,
    ) -> None:
        self.model = model
        self.dt = dt
        self.workload = workload
        self.slowdown = slowdown
        self.state = DeviceState(model)
        self.rng = random.Random(_mix(seed, index, 0xD1CE))
        self.steps = 0
        self.thermal_left = 0.0
        self.total_bytes = model.process_bytes

    def advance_to(self, t: float) -> None:
        dt = self.dt
        target_steps = int(t / dt)
        while self.steps < target_steps:
            self._step((self.steps + 0.5) * dt)
            self.steps += 1

    def _step(self, t: float) -> None:
        m, s, rng, dt = self.model, self.state, self.rng, self.dt
        phase, job = self.workload.phase(t)
        if phase == MIXED and job is not None and job.shares is not None:
            loads, activity = _blend(_PHASE_LOAD, job.shares), _blend(_PHASE_ACTIVITY, job.shares)
        else:
            loads, activity = _PHASE_LOAD[phase], _PHASE_ACTIVITY[phase]
        power_share, util, mem_util, nvl_share, rx_rate, tx_rate = loads

        # HBM: a job fills memory quickly while loading, then holds it. A process's reported allocator (MIXED)
        # is what it holds, now; when no process is left, its memory is free at once, as the driver frees it.
        if job is None:
            target_mem = 0.0
        elif job.fill_bytes is not None:
            target_mem = min(job.fill_bytes, self.total_bytes)
        else:
            target_mem = job.fill_ratio * self.total_bytes
        if job is None or phase == MIXED:
            s.memory_used = target_mem
        else:
            fill_tau = 6.0 if phase == LOADING else 20.0
            s.memory_used += (target_mem - s.memory_used) * (1.0 - math.exp(-dt / fill_tau))
        s.memory_used = min(s.memory_used, self.total_bytes)

        # thermal excursions: rare, 10-30 s long
        if self.thermal_left > 0.0:
            self.thermal_left -= dt
        elif job is not None and rng.random() < dt / 1800.0:
            self.thermal_left = 10.0 + 20.0 * rng.random()
        thermal = self.thermal_left > 0.0

        reasons = 0
        if phase == IDLE:
            demand = m.idle_watts * (1.0 + 0.03 * rng.random())
            clock = float(m.sm_clock_idle_mhz)
            reasons |= GPU_IDLE
        else:
            demand = max(m.idle_watts, m.tdp_watts * (power_share + rng.gauss(0.0, 0.03)))
            clock = float(m.sm_clock_max_mhz)
            if phase == COMPUTE:
                demand *= 1.0 + 0.06 * rng.random()
        factor = self.slowdown(t) if self.slowdown is not None else 1.0
        if factor > 1.0:
            # NVML's "HW slowdown" is exactly this (clocks cut by a factor of 2 or more); NVML keeps no time
            # for it, so the power brake that usually asserts it is raised too and its time counted
            clock /= factor
            demand = max(m.idle_watts, demand / factor)
            reasons |= HW_SLOWDOWN | HW_POWER_BRAKE
        if demand > s.power_limit_w:
            # the power limiter holds the draw just under the limit by lowering clocks: a real H200 under
            # bf16 products sat at 647-666 W of 700, 1515-1785 MHz, the cap asserted 97 % of the time
            held = s.power_limit_w * (0.925 + 0.025 * rng.random())
            clock *= (held / demand) ** 0.5
            demand = held
            reasons |= SW_POWER_CAP
        if thermal:
            clock *= 0.85
            demand *= 0.9
            reasons |= SW_THERMAL
        s.power_w = demand
        s.sm_clock_mhz = round(clock / 15.0) * 15.0  # NVML reports clocks on a ~15 MHz grid

        noise = rng.gauss(0.0, 0.01)
        # an idle GPU reads 0 %, not noise around it (h200-idle.json: utilisation 0, memory 0)
        s.util = min(1.0, max(0.0, util + noise)) if util else 0.0
        s.mem_util = min(1.0, max(0.0, mem_util + noise * 0.5)) if mem_util else 0.0
        for unit, share in zip(ACTIVITY_UNITS, activity, strict=True):
            s.activity[unit] += min(1.0, max(0.0, share + noise)) * dt if share else 0.0

        # fitted to the H100 capture (41 °C at 70 W, 59-65 °C at 630 W) and holds for the H200 (38 °C at
        # 82 W, 61-66 °C at 657 W); HBM against the GPU is the board's own (SimModel.hbm_offset_c)
        load = s.power_w / m.tdp_watts
        target_temp = 36.0 + 30.0 * load + (22.0 if thermal else 0.0)
        s.temp_c += (target_temp - s.temp_c) * (1.0 - math.exp(-dt / 15.0))
        s.mem_temp_c = s.temp_c + m.hbm_offset_c[0] + m.hbm_offset_c[1] * load
        if s.temp_c > 86.0:
            reasons |= HW_THERMAL | HW_SLOWDOWN
        s.reasons = reasons
        s.fan_ratio = min(1.0, 0.3 + max(0.0, s.temp_c - 40.0) / 60.0)

        ns = int(dt * 1e9)
        for bit, fid in THROTTLE_FIELDS.items():
            if reasons & bit:
                s.throttle_ns[fid] += ns

        s.energy_j += s.power_w * dt
        s.pcie_rx_rate = rx_rate * (0.9 + 0.2 * rng.random()) if rx_rate else 0.0
        s.pcie_tx_rate = tx_rate * (0.9 + 0.2 * rng.random()) if tx_rate else 0.0
        s.pcie_rx_bytes += s.pcie_rx_rate * dt
        s.pcie_tx_bytes += s.pcie_tx_rate * dt
        # H100 and H200 hold Gen5 at idle in every capture; boards that drop it say so in the catalogue
        idle = phase == IDLE
        s.pcie_gen = m.pcie_idle_generation if idle and m.pcie_idle_generation else m.pcie_generation
        # GDDR boards drop the memory clock at idle (L40S: 9001 -> 405 MHz); HBM holds it
        s.mem_clock_mhz = float(
            m.memory_clock_idle_mhz if idle and m.memory_clock_idle_mhz else m.memory_clock_mhz
        )

        if job is not None and job.network:
            if phase == MIXED and job.shares is not None:
                s.net_seconds += job.shares.get(ALLREDUCE, 0.0) * job.network * dt
            elif phase == ALLREDUCE:
                s.net_seconds += job.network * dt

        if m.nvlinks and nvl_share:
            per_link = m.nvlink_link_gbps * 1e9 * nvl_share * dt
            for link in range(m.nvlinks):
                if s.link_up[link]:
                    jitter = 0.97 + 0.06 * rng.random()
                    s.nvlink_tx[link] += per_link * jitter
                    s.nvlink_rx[link] += per_link * jitter

        # Real boards show no corrected ECC error in their lifetime (every capture: 0); the simulator used to
        # make one every couple of hours. The draw stays, so that seeded runs keep their other numbers.
        rng.random()
        if rng.random() < dt / 3600.0:
            s.replays += 1
