"""The contract between the sampler and whatever reads GPUs (NVML, the simulator behind NVML, later DCGM)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from gpumon.gpu.types import DriverInfo, GpuInfo, ReadResult, Support


class Device:
    """One GPU as a backend sees it. Only the GPU's own sampler worker mutates it.

    ``current_op`` and ``op_started`` say which call is in flight, so that a call that hangs past its
    deadline can be named in the error counters and logs.
    """

    def __init__(self, info: GpuInfo) -> None:
        self.info = info
        self.support: dict[str, Support] = {}
        self.support_version = 0
        self.current_op: str | None = None
        self.op_started = 0.0

    def set_support(self, quantity: str, state: Support) -> bool:
        """Record what we learnt; True when it changed (callers log transitions, not every sample)."""
        if self.support.get(quantity) is state:
            return False
        self.support[quantity] = state
        self.support_version += 1
        return True

    def begin(self, op: str) -> None:
        self.op_started = time.monotonic()
        self.current_op = op

    def end(self) -> None:
        self.current_op = None

    def capabilities(self) -> Mapping[str, str]:
        support = dict(self.support)  # one C-level copy: safe while the GPU's worker updates it
        # "fold:…" says how a quantity is read (through the field-value batch), not whether it is
        return {q: s.value for q, s in sorted(support.items()) if not q.startswith("fold:")}


# backends whose numbers are not this node's GPUs, and how every output names them
NOT_HARDWARE = {"sim": "SIMULATED GPUs", "replay": "REPLAYED capture"}


def marked(backend: str) -> str:
    """``sim (SIMULATED GPUs)``: a backend's name as the CLI shows it, never silent about what it is."""
    return f"{backend} ({NOT_HARDWARE[backend]})" if backend in NOT_HARDWARE else backend


class Backend(Protocol):
    # "nvml", "sim" or "replay": shown in gpumon_build_info so simulated or replayed numbers are never silent
    name: str
    device_count: int  # GPUs the driver reports at the last discovery, identified or not

    def open(self) -> Sequence[Device]:
        """Start the library and identify every GPU that answers. Raises BackendUnavailable."""
        ...

    def discover(self, known_uuids: set[str]) -> tuple[Sequence[Device], int]:
        """GPUs not in ``known_uuids`` that can be identified now, and how many could not be."""
        ...

    def driver_info(self) -> DriverInfo: ...

    def read(self, device: Device, deadline: float) -> ReadResult:
        """Sample one GPU. Raises DeviceDown when the GPU cannot be read at all."""
        ...

    def reopen(self, device: Device) -> None:
        """Re-acquire a GPU after it went down (re-initialising the library if needed)."""
        ...

    def close(self) -> None: ...
