"""One simulated GPU and what hangs off it: its identity, its dynamics, its MIG devices and the processes a
test pins on it. The handles the simulated NVML hands out.

The halves of SimNvml (events, gpm, mig, processes, nvml) build on this module; it imports none of them.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import pynvml

from gpumon.gpu.sim.catalog import MiB, SimModel
from gpumon.gpu.sim.dynamics import DeviceState, TrainingDynamics, _mix
from gpumon.gpu.sim.mig_layout import MigSlot, place

_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
NO_INSTANCE = 0xFFFFFFFF  # NVML's instance id for a process or event outside any MIG instance


@dataclass
class SimProcess:
    pid: int
    used_memory: int  # bytes
    sm_util: float = 0.0  # ratio
    mem_util: float = 0.0
    name: str = "python"
    uid: int = field(default_factory=os.getuid)
    cgroup: str = "0::/user.slice\n"
    environ: dict[str, str] = field(default_factory=dict)
    start_ticks: int = 1000
    gpu_instance: int = NO_INSTANCE
    compute_instance: int = NO_INSTANCE
    # the Kubernetes pod it runs in, for the simulated kubelet: simulated Kubernetes jobs only (a real process
    # driving a GPU, driven.py, has none: its pod is the real kubelet's to say)
    pod: str | None = None


class SimMigDevice:
    """The handle NVML gives for one MIG device (a compute instance inside a GPU instance)."""

    def __init__(self, parent: SimGpu, slot: MigSlot, seed: int) -> None:
        self.parent = parent
        self.profile = slot.profile
        self.gpu_instance_id = slot.gpu_instance_id  # from the placement, as the driver numbers them
        self.compute_instance_id = slot.compute_instance_id
        self.memory_bytes = slot.memory_mib * MiB  # the GPU instance's: compute instances share it
        self.busy = slot.busy
        gi, ci = slot.gpu_instance_id, slot.compute_instance_id
        h = f"{_mix(seed, parent.index, gi, ci, 0x316):016x}{_mix(seed, parent.index, gi, ci, 0x317):016x}"
        self.uuid = f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def __repr__(self) -> str:
        where = f"{self.parent.index}/{self.gpu_instance_id}/{self.compute_instance_id}"
        return f"<SimMigDevice {where} {self.profile}>"


def mig_devices(gpu: SimGpu, seed: int) -> list[SimMigDevice]:
    m = gpu.model
    return (
        [SimMigDevice(gpu, s, seed) for s in place(m.key, m.memory_mib, m.mig_layout)] if m.mig_layout else []
    )


class StaticDynamics:
    """A GPU whose readings only change when a test changes them."""

    def __init__(self, model: SimModel) -> None:
        self.state = DeviceState(model)

    def advance_to(self, t: float) -> None:
        pass


class SimGpu:
    def __init__(
        self,
        index: int,
        model: SimModel,
        seed: int,
        dynamics: TrainingDynamics | StaticDynamics,
        unsupported: set[str | int],
    ) -> None:
        self.index = index
        self.model = model
        self.dynamics = dynamics
        h = f"{_mix(seed, index, 0x0DD):016x}{_mix(seed, index, 0xBEEF):016x}"
        self.uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        self.pci_bus_id = f"{index // 8:08X}:{_HGX_BUSES[index % 8]:02X}:00.0"
        self.serial = str(1650000000000 + _mix(seed, index, 7) % 10**9)
        self.persistence_mode = (
            pynvml.NVML_FEATURE_ENABLED if model.persistence else pynvml.NVML_FEATURE_DISABLED
        )
        self.unsupported = unsupported  # the calls and field ids its model lacks
        self.lock = threading.Lock()
        self.processes: list[SimProcess] | None = None  # a test's fixed process list; None: the job's
        self.mig: list[SimMigDevice] = mig_devices(self, seed)

    @property
    def state(self) -> DeviceState:
        return self.dynamics.state

    def __repr__(self) -> str:
        return f"<SimGpu {self.index} {self.model.key}>"
