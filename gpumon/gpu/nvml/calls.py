"""Every NVML call's answer becomes one of three outcomes.

A value; an absent quantity (NOT_SUPPORTED / NO_PERMISSION: remembered so it is not asked again, logged
once); or an error (counted, the value absent this sample). Errors that mean the GPU itself is gone raise
DeviceDown, and the sampler takes over with backoff.
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml

from gpumon.gpu.nvml.device import NvmlDevice
from gpumon.gpu.types import DeviceDown, ReadError, Support

log = logging.getLogger("gpumon.nvml")

# NVML errors after which nothing on that GPU can be read until it is re-acquired
DOWN_ERRORS = (
    "GpuIsLost",
    "Uninitialized",
    "DriverNotLoaded",
    "LibraryNotFound",
    "LibRmVersionMismatch",
    "ResetRequired",
)
# the quantity is absent on this GPU: remember it and stop asking
ABSENT_ERRORS = {
    "NotSupported": Support.NOT_SUPPORTED,
    "FunctionNotFound": Support.NOT_SUPPORTED,
    "ArgumentVersionMismatch": Support.NOT_SUPPORTED,
    "NoPermission": Support.NO_PERMISSION,
}
SKIP = (Support.NOT_SUPPORTED, Support.NO_PERMISSION)


def error_kind(exc: BaseException) -> str:
    """``NVMLError_GpuIsLost`` → ``GpuIsLost``; anything that is not an NVML error → ``exception``."""
    if isinstance(exc, pynvml.NVMLError):
        name = type(exc).__name__
        return name[len("NVMLError_") :] if name.startswith("NVMLError_") else f"Error{exc.value}"
    if isinstance(exc, AttributeError):  # an nvidia-ml-py too old to have this function
        return "FunctionNotFound"
    return "exception"


class Calls:
    """Runs one GPU's NVML calls for one read and classifies every failure."""

    __slots__ = ("dev", "errors", "nv", "ok")

    def __init__(self, nv: Any, dev: NvmlDevice) -> None:
        self.nv = nv
        self.dev = dev
        self.errors: list[ReadError] = []
        self.ok = 0

    def call(self, quantity: str, op: str, *args: Any, empty: tuple[str, ...] = ()) -> Any:
        """The call's value, or None. Error kinds in ``empty`` mean "nothing to report" for this call (an
        empty MIG slot, no process samples since the last read): None, and neither an error nor a success."""
        dev = self.dev
        if dev.support.get(quantity) in SKIP:
            return None
        dev.begin(op)
        try:
            value = getattr(self.nv, op)(*args)
        except Exception as exc:  # every failure is classified; none escapes to the sampler
            if not (empty and error_kind(exc) in empty):
                self.failed(quantity, op, exc)
            return None
        finally:
            dev.end()
        self.ok += 1
        if dev.support.get(quantity) is not Support.SUPPORTED:
            dev.set_support(quantity, Support.SUPPORTED)
        return value

    def failed(self, quantity: str, op: str, exc: BaseException) -> None:
        kind = error_kind(exc)
        if kind in DOWN_ERRORS:
            raise DeviceDown(op, kind, str(exc)) from exc
        absent = ABSENT_ERRORS.get(kind)
        if absent is not None:
            self.absent(quantity, op, absent)
            return
        self.dev.set_support(quantity, Support.ERROR)
        self.errors.append(ReadError(op, kind, str(exc)))

    def absent(self, quantity: str, op: str, state: Support) -> None:
        if self.dev.set_support(quantity, state):
            info = self.dev.info
            advice = " (run gpumon doctor for advice)" if state is Support.NO_PERMISSION else ""
            # debug: the sampler sums every GPU's absences up in one info line per group of GPUs
            log.debug(
                "GPU %d (%s): %s is %s via %s; its series are absent%s",
                info.index,
                info.uuid,
                quantity,
                state.value.replace("_", " "),
                op,
                advice,
            )


def scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def total(values: list[float | None]) -> float | None:
    """The sum, or None if any part is missing: a partial sum would make a counter jump back."""
    result = 0.0
    for v in values:
        if v is None:
            return None
        result += v
    return result
