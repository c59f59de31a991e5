"""Simulated GPUs behind a pynvml-shaped module (see ``nvml.SimNvml``), and simulated training jobs.

``catalog`` (the boards), ``device`` (one simulated GPU, its MIG devices and processes), ``dynamics`` (its
readings over time), ``faults`` (--sim-fault), the halves of SimNvml (``nvml``, ``events``, ``gpm``, ``mig``,
``processes``), ``jobs`` (--sim-job timing on the simulated clock) and ``ranks`` (the jobs' ranks, reporting
through the real SDK).
"""

from gpumon.gpu.sim.catalog import MODELS, SpecError, parse_spec
from gpumon.gpu.sim.faults import Fault, FaultSpecError
from gpumon.gpu.sim.nvml import SimNvml

__all__ = ["MODELS", "Fault", "FaultSpecError", "SimNvml", "SpecError", "parse_spec"]
