"""Compute processes on one GPU: their GPU memory and, where the driver keeps samples, SM and memory use.

``nvmlDeviceGetProcessUtilization`` returns the driver's per-process samples newer than a timestamp we
pass; each read asks for those since the newest one it has seen, so a process's figures are the mean
over the interval. NOT_FOUND means no process ran any kernel since then: no samples, not an error.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from gpumon.gpu.nvml.calls import Calls
from gpumon.gpu.types import ProcessReading

log = logging.getLogger("gpumon.nvml")

NO_INSTANCE = 0xFFFFFFFF
PID_MAX = 4194304  # the kernel's ceiling (pid_max on 64-bit): anything above is a garbled struct


def read(c: Calls, utilization: bool = True) -> tuple[ProcessReading, ...] | None:
    """The GPU's compute processes; with ``utilization`` also each one's SM and memory use (one more call).

    A GPU that runs more than one process has its per-process use read whatever ``utilization`` says: the
    diagnosis needs it to tell one job's activity from another's there (only their export is opt-in)."""
    dev = c.dev
    procs = c.call("processes", "nvmlDeviceGetComputeRunningProcesses", dev.handle)
    if procs is None:
        return None
    shared = len({int(p.pid) for p in procs}) > 1
    util = _utilization(c) if procs and (utilization or shared) else {}
    out: dict[int, ProcessReading] = {}
    for p in procs:
        pid = int(p.pid)
        if not 0 < pid <= PID_MAX:  # some driver/binding pairs return garbage entries
            log.debug("GPU %d: ignoring process entry with pid %d", dev.info.index, pid)
            continue
        mem = getattr(p, "usedGpuMemory", None)
        gi = getattr(p, "gpuInstanceId", NO_INSTANCE)
        ci = getattr(p, "computeInstanceId", NO_INSTANCE)
        sm, mem_util, seen = util.get(pid, (None, None, None))
        # the same pid on two MIG instances of one GPU would be two entries; keep the first
        out.setdefault(
            pid,
            ProcessReading(
                pid=pid,
                used_memory_bytes=None if mem is None else float(mem),
                gpu_instance_id=None if gi is None or gi >= NO_INSTANCE else int(gi),
                compute_instance_id=None if ci is None or ci >= NO_INSTANCE else int(ci),
                sm_utilization_ratio=sm,
                memory_utilization_ratio=mem_util,
                last_seen=seen,
            ),
        )
    return tuple(out[pid] for pid in sorted(out))


def _utilization(c: Calls) -> dict[int, tuple[float, float, float]]:
    """pid → (SM ratio, memory ratio, unix time of the newest sample) over the samples since last read."""
    dev = c.dev
    samples = c.call(
        "process_utilization",
        "nvmlDeviceGetProcessUtilization",
        dev.handle,
        dev.process_samples_seen,
        empty=("NotFound",),  # no process ran a kernel since then
    )
    if samples is None:
        return {}
    acc: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])  # sm, mem, n, newest
    for s in samples:
        a = acc[int(s.pid)]
        a[0] += s.smUtil
        a[1] += s.memUtil
        a[2] += 1
        a[3] = max(a[3], s.timeStamp)
        dev.process_samples_seen = max(dev.process_samples_seen, int(s.timeStamp))
    return {
        pid: (min(1.0, sm / n / 100.0), min(1.0, mem / n / 100.0), newest / 1e6)
        for pid, (sm, mem, n, newest) in acc.items()
    }
