"""The GPU side of a rank: which GPUs it uses, and their activity averaged over the rate window.

The sampler's snapshots are instantaneous; a diagnosis over one sample would flap with every kernel. This
keeps a short per-GPU history (one point per sweep, fed from whatever snapshot the daemon last took) and
averages it over the same window as the rank's rates, so GPU evidence and training evidence cover one span.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpumon.gpu.snapshot import GpuStatus, Snapshot
from gpumon.gpu.types import THROTTLE_REASONS, GpuReading, MigReading

# clock-event reasons that mean something is wrong: thermal limits and hardware slowdowns. Not the software
# power cap: a real H200 running bf16 products had it asserted 97 % of the time at 647-666 W of 700
# (tests/fixtures/captures/h200-load.json): a busy GPU sits at its power limit by design, as the
# GpumonGpuThrottled alert already says, and every compute-bound job would otherwise be called "throttled"
THROTTLING = sum(
    bit
    for bit, name, _ in THROTTLE_REASONS
    if name in ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
)
# per lane and direction, bytes/s after encoding overhead (gen 1-2: 8b/10b; 3+: 128b/130b; 6: PAM4/FLIT)
PCIE_LANE = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
MAX_HISTORY = 1024
# "now" for a GPU: its last sweep or two, not the whole window (a process killed 20 s ago left a GPU whose
# window still averages busy, while it reads 0 %)
NOW_SECONDS = 1.5
# seconds of history kept beyond the window: a finished rank is judged for FINISHED_LINGER (30 s) after its
# end by the window that ended then, which must not thin out as the GPU idles on
KEEP_AFTER = 30.0


class GpuPoint(NamedTuple):
    t: float
    utilization: float | None
    sm_active: float | None
    tensor_active: float | None
    dram_active: float | None
    memory_used_ratio: float | None
    energy: float | None
    power: float | None
    nvlink_bytes: float | None  # cumulative tx + rx
    nvlink_rate: float | None  # tx + rx bytes/s where the profiler measured it
    pcie_rate: float | None  # the busier direction, bytes/s
    pcie_capacity: float | None  # per direction, bytes/s
    throttled: bool | None
    # (pid, SM use) of each process NVML lists; the use is None where the driver kept no samples
    procs: tuple[tuple[int, float | None], ...] = ()


@dataclass(frozen=True, slots=True)
class GpuWindow:
    """One GPU (or one MIG device of it) over the window: means of ratios, rates from counters."""

    index: int
    uuid: str  # the GPU's; for a MIG device, its parent's
    name: str
    up: bool
    down_reason: str | None
    mig_uuid: str | None
    mig_profile: str | None
    points: int
    utilization: float | None
    sm_active: float | None
    tensor_active: float | None
    dram_active: float | None
    memory_used_ratio: float | None  # the latest, not a mean: capacity pressure is about now
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    power_watts: float | None
    nvlink_bytes_per_second: float | None
    pcie_utilization: float | None
    throttled_share: float | None
    utilization_now: float | None = None  # the last NOW_SECONDS, for "is the GPU busy" questions
    pids_now: tuple[int, ...] = ()  # the processes NVML lists in the latest sweep
    # pid -> its mean SM use over the window, where NVML's per-process samples say (shared GPUs)
    process_utilization: dict[int, float] = field(default_factory=dict)


def _point(t: float, r: GpuReading) -> GpuPoint:
    p = r.profiling
    used = (
        r.memory_used_bytes / r.memory_total_bytes
        if r.memory_used_bytes is not None and r.memory_total_bytes
        else None
    )
    nvl = (
        r.nvlink_transmit_bytes + r.nvlink_receive_bytes
        if r.nvlink_transmit_bytes is not None and r.nvlink_receive_bytes is not None
        else None
    )
    nvl_rate = None
    if p is not None and p.nvlink_transmit_bytes_per_second is not None:
        nvl_rate = p.nvlink_transmit_bytes_per_second + (p.nvlink_receive_bytes_per_second or 0.0)
    pcie = [x for x in (r.pcie_transmit_bytes_per_second, r.pcie_receive_bytes_per_second) if x is not None]
    lane = PCIE_LANE.get(r.pcie_link_generation or 0)
    return GpuPoint(
        t,
        r.utilization_ratio,
        None if p is None else p.sm_active_ratio,
        None if p is None else p.tensor_active_ratio,
        None if p is None else p.dram_active_ratio,
        used,
        r.energy_joules,
        r.power_watts,
        nvl,
        nvl_rate,
        max(pcie) if pcie else None,
        lane * r.pcie_link_width if lane and r.pcie_link_width else None,
        None if r.throttle_reasons is None else bool(r.throttle_reasons & THROTTLING),
        _procs(r),
    )


def _procs(r: GpuReading) -> tuple[tuple[int, float | None], ...]:
    """Each listed process's SM use. Where the driver sampled some processes of the GPU, one it did not
    sample ran no kernel since the last read: 0, not unknown."""
    procs = r.processes or ()
    sampled = any(p.sm_utilization_ratio is not None for p in procs)
    return tuple(
        (p.pid, p.sm_utilization_ratio if p.sm_utilization_ratio is not None else (0.0 if sampled else None))
        for p in procs
    )


def _mig_point(t: float, r: GpuReading, m: MigReading) -> GpuPoint:
    """A MIG device's own memory and profiling counters; the links, power and clocks are its parent's and
    are not apportioned (NVML has no per-instance utilisation, power or traffic)."""
    p = m.profiling
    used = (
        m.memory_used_bytes / m.memory_total_bytes
        if m.memory_used_bytes is not None and m.memory_total_bytes
        else None
    )
    throttled = None if r.throttle_reasons is None else bool(r.throttle_reasons & THROTTLING)
    return GpuPoint(
        t,
        None,
        None if p is None else p.sm_active_ratio,
        None if p is None else p.tensor_active_ratio,
        None if p is None else p.dram_active_ratio,
        used,
        None,
        None,
        None,
        None,
        None,
        None,
        throttled,
    )


def mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _counter_rate(points: Sequence[GpuPoint], attr: str) -> float | None:
    known = [(p.t, getattr(p, attr)) for p in points if getattr(p, attr) is not None]
    if len(known) < 2 or known[-1][0] <= known[0][0] or known[-1][1] < known[0][1]:
        return None  # one point, or a counter that reset (driver reload) inside the window
    return (known[-1][1] - known[0][1]) / (known[-1][0] - known[0][0])


class GpuHistory:
    """Per-GPU points from successive snapshots. Thread-safe; observing the same snapshot twice is free."""

    def __init__(self) -> None:
        self._points: dict[str, deque[GpuPoint]] = {}
        self._seen = -1
        self._lock = threading.Lock()

    def observe(self, snap: Snapshot | None, window: float) -> None:
        if snap is None or snap.sweep == self._seen:
            return
        window += KEEP_AFTER  # a finished rank's window ends up to KEEP_AFTER seconds ago
        with self._lock:
            if snap.sweep == self._seen:
                return
            self._seen = snap.sweep
            live = set()
            for st in snap.gpus:
                r = st.reading
                if r is None:  # down: its last good samples must not stand in for it
                    continue
                live.add(st.info.uuid)
                self._add(st.info.uuid, _point(r.timestamp, r), snap.timestamp - window)
                for m in r.mig or ():
                    live.add(m.uuid)
                    self._add(m.uuid, _mig_point(r.timestamp, r, m), snap.timestamp - window)
            for uuid in set(self._points) - live:  # down, gone, or a MIG device destroyed
                del self._points[uuid]

    def _add(self, key: str, point: GpuPoint, horizon: float) -> None:
        points = self._points.setdefault(key, deque(maxlen=MAX_HISTORY))
        points.append(point)
        while len(points) > 2 and points[1].t < horizon:
            points.popleft()

    def window(self, st: GpuStatus, now: float, window: float, mig: MigReading | None = None) -> GpuWindow:
        key = st.info.uuid if mig is None else mig.uuid
        with self._lock:
            # a window that ended earlier (a finished rank's) leaves out what came after it
            points = [p for p in self._points.get(key, ()) if now - window <= p.t <= now]
        r = st.reading
        used_bytes = None if r is None else r.memory_used_bytes
        total_bytes = None if r is None else r.memory_total_bytes
        if mig is not None:
            used_bytes, total_bytes = mig.memory_used_bytes, mig.memory_total_bytes
        energy_rate = _counter_rate(points, "energy")
        nvl = mean([p.nvlink_rate for p in points])
        if nvl is None:
            nvl = _counter_rate(points, "nvlink_bytes")
        pcie = [p.pcie_rate / p.pcie_capacity for p in points if p.pcie_rate is not None and p.pcie_capacity]
        throttled = [p.throttled for p in points if p.throttled is not None]
        recent = [p for p in points if p.t >= now - NOW_SECONDS] or points[-1:]
        per_pid: dict[int, list[float]] = {}
        for p in points:
            for pid, use in p.procs:
                if use is not None:
                    per_pid.setdefault(pid, []).append(use)
        return GpuWindow(
            index=st.info.index,
            uuid=st.info.uuid,
            name=st.info.name,
            up=st.up,
            down_reason=st.down_reason,
            mig_uuid=None if mig is None else mig.uuid,
            mig_profile=None if mig is None else mig.profile,
            points=len(points),
            utilization=mean([p.utilization for p in points]),
            sm_active=mean([p.sm_active for p in points]),
            tensor_active=mean([p.tensor_active for p in points]),
            dram_active=mean([p.dram_active for p in points]),
            # the window's peak: pressure that came and went within it still mattered
            memory_used_ratio=max(
                (p.memory_used_ratio for p in points if p.memory_used_ratio is not None), default=None
            ),
            memory_used_bytes=used_bytes,
            memory_total_bytes=total_bytes,
            power_watts=energy_rate if energy_rate is not None else mean([p.power for p in points]),
            nvlink_bytes_per_second=nvl,
            pcie_utilization=sum(pcie) / len(pcie) if pcie else None,
            throttled_share=sum(throttled) / len(throttled) if throttled else None,
            utilization_now=mean([p.utilization for p in recent]),
            pids_now=tuple(pid for pid, _ in points[-1].procs) if points else (),
            process_utilization={pid: sum(v) / len(v) for pid, v in per_pid.items()},
        )


def _by_prefix(device: str, by_uuid: dict[str, GpuStatus]) -> GpuStatus | None:
    """CUDA_VISIBLE_DEVICES may name a GPU by a unique prefix of its UUID ("GPU-8932f937"), and so does the
    SDK when it passes that variable's entries on."""
    if not device.startswith("GPU-"):
        return None
    found = [st for uuid, st in by_uuid.items() if uuid.startswith(device)]
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True, slots=True)
class Found:
    """A GPU a rank uses, how we know, and the MIG device when it runs on one."""

    status: GpuStatus
    via: str  # device, mig or process
    mig: MigReading | None = None

    @property
    def key(self) -> str:
        return self.mig.uuid if self.mig is not None else self.status.info.uuid


def _mig(snap: Snapshot, uuid: str) -> tuple[GpuStatus, MigReading] | None:
    for st in snap.gpus:
        for m in (st.reading.mig if st.reading is not None else None) or ():
            if m.uuid == uuid:
                return st, m
    return None


def resolve(devices: Sequence[str], pid: int, snap: Snapshot | None) -> list[Found]:
    """The GPUs a rank uses, once each.

    ``device``: the rank said so (an NVML index or UUID, or a unique UUID prefix); ``mig``: it named a MIG
    device; ``process``: NVML lists its pid as a compute process (bare metal and hostPID pods; a
    containerised pid namespace hides it), on a MIG device where NVML says which instance.
    """
    if snap is None:
        return []
    out: list[Found] = []
    by_index = {str(st.info.index): st for st in snap.gpus}
    by_uuid = {st.info.uuid: st for st in snap.gpus}
    for d in devices:
        st = by_index.get(d) or by_uuid.get(d) or _by_prefix(d, by_uuid)
        if st is not None:
            out.append(Found(st, "device"))
        elif d.startswith("MIG-") and (hit := _mig(snap, d)) is not None:
            out.append(Found(hit[0], "mig", hit[1]))
    if not out:
        for st in snap.gpus:
            r = st.reading
            if r is None:
                continue
            for p in r.processes or ():
                if p.pid == pid:
                    where = (p.gpu_instance_id, p.compute_instance_id)
                    mig = next(
                        (m for m in r.mig or () if (m.gpu_instance_id, m.compute_instance_id) == where), None
                    )
                    out.append(Found(st, "process", mig))
    unique: dict[str, Found] = {}
    for found in out:
        unique.setdefault(found.key, found)
    return list(unique.values())
