"""Simulated GPUs behind a pynvml-shaped module (see ``nvml.SimNvml``)."""

from gpumon.gpu.sim.catalog import MODELS, SpecError, parse_spec
from gpumon.gpu.sim.faults import Fault, FaultSpecError
from gpumon.gpu.sim.nvml import SimNvml

__all__ = ["MODELS", "Fault", "FaultSpecError", "SimNvml", "SpecError", "parse_spec"]
