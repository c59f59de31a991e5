"""MIG: the MIG devices of a GPU in MIG mode, their memory and, with GPM, their profiling counters.

The layout (which GPU and compute instances exist) changes only when an operator reconfigures the GPU, so it
and the MIG mode are read on the first read and every ``every`` reads after; memory is read each
time. Whole-GPU
utilisation is NOT_SUPPORTED under MIG: the per-instance GPM activity is what shows how busy each slice is.
"""

from __future__ import annotations

import pynvml

from gpumon.gpu.nvml import gpm
from gpumon.gpu.nvml.calls import SKIP, Calls
from gpumon.gpu.nvml.device import MigDevice
from gpumon.gpu.types import MigReading


def read(c: Calls, now: float, *, profiling: bool, every: int = 10) -> tuple[MigReading, ...] | None:
    dev = c.dev
    if dev.support.get("mig") in SKIP:
        return None
    # the mode changes only with a GPU reset (which reopen() notices), so it is asked now and then too
    if dev.mig_enabled is None or dev.reads % every == 0:
        mode = c.call("mig", "nvmlDeviceGetMigMode", dev.handle)
        dev.mig_enabled = None if mode is None else mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    if not dev.mig_enabled:
        dev.mig_devices = None
        return None
    if dev.mig_devices is None or dev.reads % every == 0:
        dev.mig_devices = _enumerate(c)
    out = []
    for m in dev.mig_devices:
        mem = c.call("mig_memory", "nvmlDeviceGetMemoryInfo", m.handle)
        prof = gpm.read(c, now, instance=m.gpu_instance_id) if profiling else None
        out.append(
            MigReading(
                uuid=m.uuid,
                gpu_instance_id=m.gpu_instance_id,
                compute_instance_id=m.compute_instance_id,
                profile=m.profile,
                memory_total_bytes=None if mem is None else float(mem.total),
                memory_used_bytes=None if mem is None else float(mem.used),
                profiling=prof,
            )
        )
    return tuple(out)


def _enumerate(c: Calls) -> list[MigDevice]:
    dev = c.dev
    count = c.call("mig", "nvmlDeviceGetMaxMigDeviceCount", dev.handle) or 0
    found = []
    for index in range(count):
        # NOT_FOUND: an empty slot, the normal case
        handle = c.call("mig", "nvmlDeviceGetMigDeviceHandleByIndex", dev.handle, index, empty=("NotFound",))
        if handle is None:
            continue
        uuid = c.call("mig", "nvmlDeviceGetUUID", handle)
        gi = c.call("mig", "nvmlDeviceGetGpuInstanceId", handle)
        ci = c.call("mig", "nvmlDeviceGetComputeInstanceId", handle)
        name = c.call("mig", "nvmlDeviceGetName", handle)
        if uuid is None or gi is None or ci is None:
            continue
        profile = str(name).rsplit(" MIG ", 1)[-1] if name and " MIG " in str(name) else ""
        found.append(MigDevice(handle, str(uuid), int(gi), int(ci), profile))
    return found
