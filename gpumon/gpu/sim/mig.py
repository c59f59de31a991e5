"""MIG for the simulator: a GPU whose model carries a ``mig_layout`` runs in MIG mode with the GPU and
compute instances the layout places (gpumon/gpu/sim/mig_layout.py), each MIG device with its own handle,
UUID, name and memory.

As on real boards, whole-GPU utilisation and row remapping answer NOT_SUPPORTED while MIG is on; memory,
power, clocks and the rest stay per physical GPU. The GPU's load runs in the layout's first GPU instance;
the others idle (as in the captures), and compute instances that share a GPU instance each report its
whole memory, as NVML does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pynvml

from gpumon.gpu.sim.device import SimGpu, SimMigDevice

MAX_MIG_DEVICES = 7


class SimMig:
    """The MIG half of SimNvml."""

    if TYPE_CHECKING:

        def _gpu(self, handle: Any, op: str) -> SimGpu: ...

    def _mig(self, handle: Any, op: str) -> SimMigDevice:
        if not isinstance(handle, SimMigDevice):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # a full GPU is not a MIG device
        self._gpu(handle.parent, op)  # faults on the parent GPU apply to its instances too
        return handle

    def nvmlDeviceGetMigMode(self, device: SimGpu) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetMigMode")
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: SimGpu) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetMaxMigDeviceCount")
        if not gpu.model.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: SimGpu, index: int) -> SimMigDevice:
        gpu = self._gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not gpu.model.mig or not 0 <= index < MAX_MIG_DEVICES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.mig):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu.mig[index]

    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> bool:
        return isinstance(device, SimMigDevice)

    def nvmlDeviceGetGpuInstanceId(self, device: SimMigDevice) -> int:
        return self._mig(device, "nvmlDeviceGetGpuInstanceId").gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: SimMigDevice) -> int:
        return self._mig(device, "nvmlDeviceGetComputeInstanceId").compute_instance_id

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: SimMigDevice) -> SimGpu:
        return self._mig(migDevice, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle").parent

    def _mig_share(self, gpu: SimGpu, instance: int) -> float:
        """The share of the GPU's load (memory in use, activity, traffic) GPU instance ``instance`` has:
        all of it in the busy instance, none elsewhere."""
        for d in gpu.mig:
            if d.gpu_instance_id == instance:
                return 1.0 if d.busy else 0.0
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def _mig_memory(self, device: SimMigDevice, version: int | None) -> Any:
        self._mig(device, "nvmlDeviceGetMemoryInfo")
        parent = device.parent
        share = self._mig_share(parent, device.gpu_instance_id)
        used = min(int(parent.state.memory_used * share), device.memory_bytes)
        mem = pynvml.c_nvmlMemory_v2_t() if version else pynvml.c_nvmlMemory_t()
        if version:
            mem.version = version
            mem.reserved = 0
        mem.total, mem.used, mem.free = device.memory_bytes, used, device.memory_bytes - used
        return mem
