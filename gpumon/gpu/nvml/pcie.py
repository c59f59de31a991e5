"""PCIe throughput where the cumulative byte counters (fields 197/198) are missing.

``nvmlDeviceGetPcieThroughput`` blocks for the 20 ms window it samples. Run serially, tx and rx cost 40 ms
per GPU per sweep; so both run side by side on the GPU's own small pool of daemon threads, overlapping the
GPU's other calls, and never serially across GPUs (each GPU has its own worker and pool).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable

import pynvml

from gpumon.gpu.nvml.calls import SKIP, Calls
from gpumon.gpu.nvml.device import NvmlDevice
from gpumon.gpu.nvml.pool import DaemonPool
from gpumon.gpu.types import ReadError, Support

OP = "nvmlDeviceGetPcieThroughput"
Pair = tuple[concurrent.futures.Future, concurrent.futures.Future]


def needed(dev: NvmlDevice) -> bool:
    return dev.support.get("pcie_bytes") in SKIP and dev.support.get("pcie_throughput") not in SKIP


def start(c: Calls) -> Pair | None:
    dev = c.dev
    if dev.pcie_pending is not None:  # the last pair is still stuck in the driver: do not pile up
        if not all(f.done() for f in dev.pcie_pending):
            return None
        dev.pcie_pending = None
    if dev.pcie_pool is None:
        dev.pcie_pool = DaemonPool(f"gpumon-pcie-{dev.info.index}", 2)
    fn: Callable[..., int] = getattr(c.nv, OP)
    pair = (
        dev.pcie_pool.submit(fn, dev.handle, pynvml.NVML_PCIE_UTIL_TX_BYTES),
        dev.pcie_pool.submit(fn, dev.handle, pynvml.NVML_PCIE_UTIL_RX_BYTES),
    )
    dev.pcie_pending = pair
    return pair


def finish(c: Calls, pair: Pair | None, deadline: float) -> tuple[float | None, float | None]:
    """(tx, rx) in bytes/s; a pair still running at the deadline is a Timeout, not a wait."""
    if pair is None:
        if c.dev.pcie_pending is not None:
            c.errors.append(ReadError(OP, "Timeout", "previous call still running"))
        return None, None
    rates: list[float | None] = []
    for fut in pair:
        try:
            kb_per_s = fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            c.errors.append(ReadError(OP, "Timeout", "past the sample deadline"))
            rates.append(None)
            continue
        except Exception as exc:  # classified like any call's failure
            c.failed("pcie_throughput", OP, exc)
            rates.append(None)
            continue
        c.ok += 1
        c.dev.set_support("pcie_throughput", Support.SUPPORTED)
        rates.append(kb_per_s * 1000.0)  # NVML reports KB/s
    if all(f.done() for f in pair):
        c.dev.pcie_pending = None
    return rates[0], rates[1]
