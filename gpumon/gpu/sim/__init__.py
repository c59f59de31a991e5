"""Simulated GPUs behind a pynvml-shaped module (see ``nvml.SimNvml``)."""

from gpumon.gpu.sim.catalog import MODELS, SpecError, parse_spec
from gpumon.gpu.sim.faults import Fault, FaultSpecError
from gpumon.gpu.sim.nvml import SimNvml, is_simulated

__all__ = ["MODELS", "Fault", "FaultSpecError", "SimNvml", "SpecError", "is_simulated", "parse_spec"]
