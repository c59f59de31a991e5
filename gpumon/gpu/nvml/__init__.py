"""The NVML backend: the only code that calls nvidia-ml-py (or the simulator that mirrors it).

device.py     one GPU's handle and the state its readers keep between sweeps
pool.py       daemon threads for calls that may hang in the driver
calls.py      how one NVML call's answer is classified (value, absent quantity, error, GPU down)
fieldvalues.py the one batched nvmlDeviceGetFieldValues call per GPU, NVLink per link and in total
pcie.py       the 20 ms PCIe throughput fallback, sampled off the GPU's own thread
gpm.py, mig.py Hopper profiling counters (GPM sample pairs) and MIG instances
processes.py  per-process memory and utilisation
backend.py    NvmlBackend: init, discovery, identification, re-acquiring lost GPUs, one read
"""

from gpumon.gpu.nvml.backend import NvmlBackend
from gpumon.gpu.nvml.calls import error_kind
from gpumon.gpu.nvml.device import NvmlDevice

__all__ = ["NvmlBackend", "NvmlDevice", "error_kind"]
