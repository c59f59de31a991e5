"""Simulated GPUs driven by real training processes: a loop that reports through the SDK on a simulated GPU
makes that GPU as busy as its phases say.

A process reporting with ``device=N`` (the NVML index or UUID of a simulated GPU that runs no ``--sim-job``
and is not in MIG mode) drives that GPU while it reports. Over each interval between two of its reports, the
GPU spends the share of time the loop spent in each phase (running phases included):

- ``data_wait``: the SMs wait (the input pipeline's PCIe traffic only);
- ``checkpoint``: the SMs wait while the state goes out over PCIe;
- ``communication``: the all-reduce, on NVLink; for a job with ranks on other nodes (a world size larger
  than the ranks driving GPUs here), across the node's NICs as well, but only for as long as the collective
  itself takes: the least communication time per step the process has shown (over LEAST_OVER steps at a
  time). The rest of its communication time is a wait for a slower peer, with the NIC idle;
- everything else, named phases (forward/backward, optimizer, evaluation...) and time outside any phase:
  compute. A loop that reports only ``step()`` keeps its GPU busy, as it would.

Utilisation, power, clocks, profiling activity and traffic are the blend of those phases (dynamics.MIXED),
as the driver's own averaging over its sample window would show them. HBM is the allocator's reserved bytes
when the SDK reports them (torch on CUDA), plus a CUDA context. The GPU lists the process under its real pid,
name, user and cgroup (read from this host's /proc), so attribution names it as it would on a real node.

A GPU is driven from its first report to the process's final report, its exit, or ``STALE`` seconds without
a report; then it idles again (or runs ``--sim-unreported-jobs``' work). Standard library and the
simulator only: the reports arrive as duck-typed objects (gpumon.jobs.report.Report), handed over by
``gpumon serve``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gpumon.gpu.attribution.proc import real_uid, running, start_time
from gpumon.gpu.sim.catalog import MiB
from gpumon.gpu.sim.device import SimGpu, SimProcess
from gpumon.gpu.sim.dynamics import ALLREDUCE, CHECKPOINT, COMPUTE, DATA_WAIT, MIXED, Job, Workload

STALE = 10.0  # seconds without a report after which a process no longer drives its GPU
CONTEXT_BYTES = 512 * MiB  # a CUDA context and the libraries' workspaces, which no allocator counts
LIVENESS_EVERY = 1.0  # seconds between checks that a driving process still exists
# steps over which a process's communication time per step is measured: a report interval cuts a step's
# phases at its edges, which a single interval's figure would take for a faster collective
LEAST_OVER = 8
# the phases that leave the SMs idle or move data elsewhere; every other phase is compute
_PHASES = {"data_wait": DATA_WAIT, "checkpoint": CHECKPOINT, "communication": ALLREDUCE}


class ReportLike(Protocol):
    """What the driver reads of a report (gpumon.jobs.report.Report has these)."""

    @property
    def job(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def incarnation(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def time(self) -> float: ...
    @property
    def started(self) -> float: ...
    @property
    def devices(self) -> tuple[str, ...]: ...
    @property
    def phases(self) -> Mapping[str, float]: ...
    @property
    def open_phases(self) -> Mapping[str, float]: ...
    @property
    def memory(self) -> Any: ...
    @property
    def final(self) -> bool: ...
    @property
    def world_size(self) -> int: ...
    @property
    def totals(self) -> Any: ...  # .steps


@dataclass
class _Process:
    pid: int
    incarnation: str
    gpus: tuple[int, ...]
    at: float  # the last report's own time
    phases: dict[str, float]  # the last report's phase seconds, running phases included
    shares: dict[str, float] = field(default_factory=lambda: {COMPUTE: 1.0})
    reserved: int | None = None  # the allocator's reserved bytes, when reported
    seen: float = 0.0  # monotonic, when the last report arrived
    alive_checked: float = 0.0
    alive: bool = True
    identity: SimProcess | None = None  # name, user and cgroup, read once
    steps: float = 0.0  # the last report's step count
    # communication seconds and steps since the last measure of the collective's own time, and the least
    # communication seconds per step measured so far (None: not yet)
    comm_seconds: float = 0.0
    comm_steps: float = 0.0
    least_comm: float | None = None
    transfer: float = 0.0  # the share of wall time its collectives moved data across the NICs
    spans: bool = False  # its job has ranks on other nodes


class SdkDriver:
    """The reports of real SDK processes, turned into the workload of the simulated GPUs they name."""

    def __init__(
        self,
        gpus: Sequence[SimGpu],
        eligible: Iterable[int],
        *,
        clock: Callable[[], float] = time.monotonic,
        proc: str = "/proc",
    ) -> None:
        self._gpus = list(gpus)
        # a GPU in MIG mode is never driven: a MIG device's process would belong to one instance, whose
        # memory and profiling the simulator keeps per instance, not per GPU
        self._eligible = frozenset(i for i in eligible if not gpus[i].mig)
        self._by_uuid = {g.uuid: g.index for g in gpus}
        self._clock = clock
        self._proc = proc
        self._lock = threading.Lock()
        self._procs: dict[tuple[str, int], _Process] = {}  # (job, rank)

    def wrap(self, index: int, fallback: Workload) -> DrivenWorkload:
        return DrivenWorkload(self, index, fallback)

    def observe(self, r: ReportLike) -> None:
        """One accepted report (called by the daemon after it stored the report)."""
        key = (r.job, r.rank)  # one entry per rank the store admitted: a restart replaces its predecessor
        now = self._clock()
        gpus = self._resolve(r.devices)
        with self._lock:
            for k in [k for k, p in self._procs.items() if now - p.seen > STALE]:
                del self._procs[k]
            if r.final or not gpus:
                self._procs.pop(key, None)
                return
            phases = dict(r.phases)
            for name, seconds in r.open_phases.items():
                phases[name] = phases.get(name, 0.0) + seconds
            p = self._procs.get(key)
            if p is None or p.incarnation != r.incarnation:
                p = self._procs[key] = _Process(r.pid, r.incarnation, gpus, r.started, {})
            wall = r.time - p.at
            steps = float(r.totals.steps)
            if wall > 0:
                spent = {n: s - p.phases.get(n, 0.0) for n, s in phases.items()}
                p.shares = _shares(spent, wall)
                p.transfer = _transfer(p, spent.get("communication", 0.0), steps - p.steps, wall)
                p.at, p.phases = r.time, phases
            p.gpus, p.seen, p.steps = gpus, now, steps
            here = sum(1 for name, _ in self._procs if name == r.job)
            p.spans = r.world_size > here
            memory = r.memory
            p.reserved = getattr(memory, "reserved_bytes", None) if memory is not None else None

    def _resolve(self, devices: Iterable[str]) -> tuple[int, ...]:
        out = []
        for d in devices:
            index = (
                int(d) if d.isascii() and d.isdigit() and int(d) < len(self._gpus) else self._by_uuid.get(d)
            )
            if index is not None and index in self._eligible and index not in out:
                out.append(index)
        return tuple(out)

    def active(self, index: int) -> list[_Process]:
        """The processes driving GPU ``index`` now."""
        now = self._clock()
        with self._lock:
            procs = [p for p in self._procs.values() if index in p.gpus and now - p.seen <= STALE]
            for p in procs:
                if now - p.alive_checked >= LIVENESS_EVERY:
                    p.alive_checked = now
                    p.alive = _running(os.path.join(self._proc, str(p.pid), "stat"))
            return [p for p in procs if p.alive]

    def identity(self, p: _Process) -> SimProcess:
        """The process as this host's /proc describes it (read once; a vanished one keeps the defaults)."""
        if p.identity is None:
            p.identity = _read_identity(os.path.join(self._proc, str(p.pid)), p.pid)
        return p.identity


class DrivenWorkload:
    """One simulated GPU's workload: what the SDK processes on it report, else ``fallback``'s."""

    def __init__(self, driver: SdkDriver, index: int, fallback: Workload) -> None:
        self.driver = driver
        self.index = index
        self.fallback = fallback
        self._total = driver._gpus[index].model.process_bytes

    def _used(self, procs: list[_Process]) -> dict[int, int]:
        """HBM per pid: its context once, and the larger allocator figure where one pid reports twice (two
        Reporters in one process), never more than the GPU holds."""
        used: dict[int, int] = {}
        for p in procs:
            used[p.pid] = max(used.get(p.pid, 0), min((p.reserved or 0) + CONTEXT_BYTES, self._total))
        return used

    def _job(self, procs: list[_Process]) -> Job:
        """The driving processes as one job, the HBM they hold. One process: its phase shares. Several,
        time-sliced on one GPU: their kernels add up, so the GPU computes for the sum of their compute shares
        (at most all of the time); the rest of the time is their other phases, in the mean's proportions."""
        shares: dict[str, float] = {}
        for p in procs:
            for phase, share in p.shares.items():
                shares[phase] = shares.get(phase, 0.0) + share / len(procs)
        if len(procs) > 1:
            compute = min(1.0, sum(p.shares.get(COMPUTE, 0.0) for p in procs))
            rest = {k: v for k, v in shares.items() if k != COMPUTE}
            left = sum(rest.values())
            shares = {k: v * (1.0 - compute) / left for k, v in rest.items()} if left > 0 else {}
            shares[COMPUTE] = compute
        fill = min(1.0, sum(self._used(procs).values()) / self._total)
        comm = sum(p.shares.get(ALLREDUCE, 0.0) for p in procs)
        moved = sum(p.transfer for p in procs if p.spans)
        network = min(1.0, moved / comm) if comm > 0 else 0.0
        return Job(-1, 0.0, math.inf, 0.0, 1.0, shares.get(ALLREDUCE, 0.0), fill, shares, network=network)

    def job_at(self, t: float) -> Job | None:
        procs = self.driver.active(self.index)
        return self._job(procs) if procs else self.fallback.job_at(t)

    def phase(self, t: float) -> tuple[str, Job | None]:
        procs = self.driver.active(self.index)
        return (MIXED, self._job(procs)) if procs else self.fallback.phase(t)

    def shares(self) -> dict[str, float]:
        """The phase shares the GPU shows now (all compute when nothing drives it)."""
        procs = self.driver.active(self.index)
        return dict(self._job(procs).shares or {}) if procs else {COMPUTE: 1.0}

    def processes(self, util: float, mem_util: float) -> list[SimProcess] | None:
        """The driving processes as NVML lists them, or None when nothing drives this GPU."""
        procs = self.driver.active(self.index)
        if not procs:
            return None
        out = []
        used = self._used(procs)
        # each process's share of the GPU's busy time: its compute share of all of theirs
        demand: dict[int, float] = {}
        for p in procs:
            demand[p.pid] = demand.get(p.pid, 0.0) + p.shares.get(COMPUTE, 0.0)
        total = sum(demand.values())
        for p in procs:
            if p.pid not in used:
                continue  # listed once, however many of its Reporters drive this GPU
            part = demand[p.pid] / total if total > 0 else 1.0 / len(demand)
            who = self.driver.identity(p)
            out.append(
                replace(who, used_memory=used.pop(p.pid), sm_util=util * part, mem_util=mem_util * part)
            )
        return out


def _shares(spent: Mapping[str, float], wall: float) -> dict[str, float]:
    """Each simulator phase's share of ``wall`` seconds, from the seconds spent in each reported phase."""
    out: dict[str, float] = {}
    for name, seconds in spent.items():
        if seconds > 0:
            phase = _PHASES.get(name, COMPUTE)
            out[phase] = out.get(phase, 0.0) + seconds / wall
    named = sum(out.values())
    if named > 1.0:  # phases overlapping (nested, or on two threads): proportions, no remainder
        out = {k: v / named for k, v in out.items()}
    elif named < 1.0:
        out[COMPUTE] = out.get(COMPUTE, 0.0) + 1.0 - named  # outside any phase: taken as GPU work
    return out


def _transfer(p: _Process, comm: float, steps: float, wall: float) -> float:
    """The share of ``wall`` seconds the process's collectives moved data: its ``comm`` seconds in
    communication over ``steps`` steps, at most the least time per step its collectives have taken."""
    comm, steps = max(0.0, comm), max(0.0, steps)
    p.comm_seconds += comm
    p.comm_steps += steps
    if p.comm_steps >= LEAST_OVER:
        per_step = p.comm_seconds / p.comm_steps
        p.least_comm = per_step if p.least_comm is None else min(p.least_comm, per_step)
        p.comm_seconds = p.comm_steps = 0.0
    if p.least_comm is None:
        return comm / wall  # no measure yet: every second of it moves data
    return min(comm, p.least_comm * steps) / wall


def _running(stat: str) -> bool:
    try:
        with open(stat, "rb") as f:
            return running(f.read(4096))
    except OSError:
        return False


def _read_identity(folder: str, pid: int) -> SimProcess:
    """Name, user, cgroup and start time of a real process, by attribution's own readers of /proc."""
    who = SimProcess(pid, 0, name="python")

    def read(name: str) -> bytes:
        try:
            with open(os.path.join(folder, name), "rb") as fh:
                return fh.read(65536)
        except OSError:
            return b""

    comm = read("comm").decode(errors="replace").strip()
    if comm:
        who.name = comm[:64]
    uid = real_uid(read("status"))
    if uid is not None:
        who.uid = uid
    cgroup = read("cgroup")
    if cgroup:
        who.cgroup = cgroup.decode(errors="replace")
    start = start_time(read("stat"))
    if start is not None:
        who.start_ticks = start
    return who
