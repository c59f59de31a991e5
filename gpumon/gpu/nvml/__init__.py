"""The NVML backend: the only code that calls nvidia-ml-py (or the simulator that mirrors it).

calls.py      how one NVML call's answer is classified (value, absent quantity, error, GPU down)
fieldvalues.py the one batched nvmlDeviceGetFieldValues call per GPU, NVLink per link and in total
pcie.py       the 20 ms PCIe throughput fallback, sampled off the GPU's own thread
backend.py    NvmlBackend: init, discovery, identification, re-acquiring lost GPUs, one read
"""

from gpumon.gpu.nvml.backend import NvmlBackend
from gpumon.gpu.nvml.calls import NvmlDevice, error_kind

__all__ = ["NvmlBackend", "NvmlDevice", "error_kind"]
