"""One training (or inference) loop for the diagnosis scenarios (tests/support/scenarios.py).

A real process with the real SDK: a ``gpumon.client.Reporter`` with ``device=N`` on a simulated GPU of a real
``gpumon serve --simulate`` daemon, so the daemon drives that GPU by the phases this loop reports
(gpumon/gpu/sim/driven.py). The loop does no work: it sleeps through each phase for its share of the step.
Every option that names a moment takes seconds since the suite's start (``--t0``, a wall-clock epoch), so
the scenarios are written on one time line. The loop always ends by itself: at ``--until`` it closes its
Reporter (the final report) and exits 0.

Standard library and gpumon.client only (what a training process has).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from typing import Any

from gpumon.client import Reporter

H100_BF16 = 989.5e12  # dense bf16 peak of the simulated H100 SXM (gpumon/jobs/peaks.py)
HW_SLOWDOWN = 0x8  # nvmlClocksEventReasonHwSlowdown, raised by the simulator's slowdown fault
GIB = 1 << 30


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True, help="the daemon, http://127.0.0.1:PORT")
    p.add_argument("--t0", type=float, required=True, help="the suite's start, a wall-clock epoch")
    p.add_argument("--until", type=float, required=True, help="stop (final report) at t0 + this")
    p.add_argument("--job", required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--device", required=True, help="NVML index of the simulated GPU")
    p.add_argument("--kind", choices=("train", "inference"), default="train")
    p.add_argument("--step", type=float, default=0.5, help="seconds per step (per request: inference)")
    p.add_argument(
        "--phase", action="append", default=[], metavar="NAME=SHARE", help="share of each step in a phase"
    )
    p.add_argument("--flops-per-token", type=float, default=4.8e10, help="the model's true FLOPs per token")
    p.add_argument("--mfu", type=float, default=0.45, help="MFU of the compute part of a step (sets tokens)")
    p.add_argument("--declare-fpt-factor", type=float, default=1.0, help="report FLOPs/token x this")
    p.add_argument(
        "--every", action="append", default=[], metavar="N:PHASE:SECONDS", help="after every N steps"
    )
    p.add_argument("--hang-at", type=float, help="at t0 + this, hang inside forward_backward until --until")
    p.add_argument("--idle", action="store_true", help="report, never step; wait in data_wait (GPU idle)")
    p.add_argument(
        "--slow-when-throttled",
        type=float,
        default=1.0,
        help="steps take this many times longer while the daemon shows this GPU's HW slowdown",
    )
    p.add_argument("--memory", metavar="RESERVED_GIB:RETRIES_PER_STEP", help="allocator readings to report")
    return p.parse_args()


class Throttle:
    """Whether the daemon shows this loop's GPU in a hardware slowdown (the simulator's ``slowdown``
    fault): the loop asks GET /v1/gpus once a second, as a loop that slows with its GPU would feel it."""

    def __init__(self, url: str, index: int, stop: threading.Event) -> None:
        self.url = url
        self.index = index
        self.active = False
        self._stop = stop
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                with urllib.request.urlopen(self.url + "/v1/gpus", timeout=2.0) as resp:
                    doc = json.load(resp)
                for g in doc.get("gpus", []):
                    if g.get("index") == self.index:
                        reasons = (g.get("reading") or {}).get("throttle_reasons") or 0
                        self.active = bool(int(reasons) & HW_SLOWDOWN)
            except (OSError, ValueError):
                pass


class Allocator:
    """What torch.cuda.memory_stats() would say of a caching allocator near the HBM limit that keeps
    retrying: handed to the SDK as ``Reporter.memory_source`` (the hook the SDK reads allocator figures
    through; on CPU there is no torch.cuda for its own reader)."""

    def __init__(self, reserved_gib: float, retries_per_step: int) -> None:
        self.reserved = int(reserved_gib * GIB)
        self.per_step = retries_per_step
        self.retries = 0

    def step(self) -> None:
        self.retries += self.per_step

    def read(self) -> dict[str, Any]:
        allocated = int(0.9 * self.reserved)
        return {
            "device": 0, "allocated_bytes": allocated, "allocated_peak_bytes": allocated,
            "reserved_bytes": self.reserved, "reserved_peak_bytes": self.reserved, "active_bytes": allocated,
            "active_peak_bytes": allocated, "inactive_split_bytes": int(0.05 * self.reserved),
            "alloc_retries": self.retries, "ooms": 0,
        }  # fmt: skip


def _sleep_until(deadline: float) -> bool:
    """Sleep until ``deadline`` (epoch); False if it had already passed."""
    left = deadline - time.time()
    if left <= 0:
        return False
    time.sleep(left)
    return True


def main() -> int:
    a = _parse()
    until = a.t0 + a.until
    phases = []
    for item in a.phase:
        name, _, share = item.partition("=")
        phases.append((name, float(share)))
    compute_share = max(
        0.0, 1.0 - sum(s for n, s in phases if n in ("data_wait", "communication", "checkpoint"))
    )
    tokens = max(1, round(a.mfu * compute_share * H100_BF16 * a.step / a.flops_per_token))
    every = []
    for item in a.every:
        n, name, seconds = item.split(":")
        every.append((int(n), name, float(seconds)))
    reporter = Reporter(
        job=a.job, rank=a.rank, world_size=a.world_size, local_rank=0, device=a.device, kind=a.kind,
        workload=a.job, dtype="bf16", flops_per_token=a.flops_per_token * a.declare_fpt_factor,
        url=a.url, interval=1.0, enabled=True,
    )  # fmt: skip
    allocator = None
    if a.memory:
        reserved, _, retries = a.memory.partition(":")
        allocator = Allocator(float(reserved), int(retries or 0))
        reporter.memory_source = allocator.read
    stop = threading.Event()
    throttle = Throttle(a.url, int(a.device), stop) if a.slow_when_throttled != 1.0 else None
    hang_at = None if a.hang_at is None else a.t0 + a.hang_at
    try:
        if a.idle:
            with reporter.data_wait():
                _sleep_until(until)
            return 0
        n = 0
        while time.time() < until:
            if hang_at is not None and time.time() >= hang_at:
                with reporter.forward_backward():  # a hung collective inside the step: no step lands
                    _sleep_until(until)
                break
            slow = a.slow_when_throttled if throttle is not None and throttle.active else 1.0
            seconds = a.step * slow
            t_start = time.monotonic()
            if a.kind == "inference":
                time.sleep(seconds)
                reporter.request(tokens=tokens, latency=time.monotonic() - t_start)
                continue
            for name, share in phases:
                with reporter.phase(name):
                    time.sleep(seconds * share)
            rest = seconds - (time.monotonic() - t_start)
            with reporter.forward_backward():
                time.sleep(max(0.0, rest))
            if allocator is not None:
                allocator.step()
            reporter.step(tokens=tokens, samples=1)
            n += 1
            for k, name, extra in every:
                if n % k == 0 and time.time() < until:
                    with reporter.phase(name):
                        time.sleep(min(extra, max(0.0, until - time.time())))
        return 0
    finally:
        stop.set()
        reporter.close()


if __name__ == "__main__":
    raise SystemExit(main())
