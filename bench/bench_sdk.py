"""Microbenchmark: the SDK's hot path against a bare prometheus_client Counter.inc(), side by side in one run.

    python bench/bench_sdk.py [--calls 1000000] [--repeats 7]

The Reporter points at a port nothing listens on, so its thread sends nothing; it backs off and is idle.
Prints nanoseconds per call (best of the repeats) and the ratio step()/inc(); the target is <= 2.

Then the sender thread's side, per report: building a report, and the allocator read it adds in a process
that uses CUDA (target: tens of µs). Without a GPU, torch.cuda is a stand-in whose
memory_stats_as_nested_dict() returns a dict shaped and sized like real PyTorch's (9 statistics x 3 pools x
4 kinds, plus the counters); with torch installed, torch's own memory_stats() flattening of that dict is timed
beside it, as the cost the SDK avoids by reading the nested form.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import timeit
import types
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from gpumon.client import Reporter
from gpumon.client.process.allocator import AllocatorReader

INC = "prometheus_client Counter.inc()"
STEP = "reporter.step(tokens=4096, samples=8)"
PHASE = 'with reporter.phase("data_wait"): pass'


def dead_port() -> int:
    """A loopback port nobody listens on: bound and closed again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def best_ns(statement: str, namespace: dict[str, object], calls: int, repeats: int) -> float:
    return min(timeit.repeat(statement, globals=namespace, number=calls, repeat=repeats)) / calls * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    logging.getLogger("gpumon.client").setLevel(logging.ERROR)  # the dead daemon's warning is expected

    counter = Counter("bench_total", "bench", registry=CollectorRegistry())
    reporter = Reporter(url=f"http://127.0.0.1:{dead_port()}", job="bench", interval=1.0)
    disabled = Reporter(enabled=False)
    namespace: dict[str, object] = {"counter": counter, "reporter": reporter, "disabled": disabled}
    cases = {
        "empty loop": "pass",
        INC: "counter.inc()",
        STEP: STEP,
        PHASE: PHASE,
        "with reporter.data_wait(): pass": "with reporter.data_wait(): pass",
        "reporter.add_phase('communication', 0.001)": "reporter.add_phase('communication', 0.001)",
        "disabled reporter.step(tokens=4096, samples=8)": "disabled.step(tokens=4096, samples=8)",
    }
    # interleave the cases across rounds so a noisy neighbour hurts all of them alike
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(3):
        for label, statement in cases.items():
            best[label] = min(best[label], best_ns(statement, namespace, args.calls, args.repeats))
    reporter.close(timeout=0.5)

    print(f"Python {sys.version.split()[0]}, {args.calls} calls, best of {3 * args.repeats} repeats")
    for label, ns in best.items():
        print(f"  {label:<50} {ns:8.1f} ns/call")
    print(f"ratio step/inc:  {best[STEP] / best[INC]:.2f}  (target <= 2)")
    print(f"ratio phase/inc: {best[PHASE] / best[INC]:.2f}")


def nested_stats() -> dict[str, Any]:
    """What torch._C._cuda_memoryStats returns on a training process, in shape and size."""
    stats: dict[str, Any] = {
        stat: {pool: dict.fromkeys(("current", "peak", "allocated", "freed"), 123_456_789) for pool in
               ("all", "large_pool", "small_pool")}
        for stat in ("active", "active_bytes", "allocated_bytes", "allocation", "inactive_split",
                     "inactive_split_bytes", "requested_bytes", "reserved_bytes", "segment")
    }  # fmt: skip
    stats.update(num_alloc_retries=3, num_ooms=0, num_device_alloc=40, num_device_free=2, max_split_size=-1)
    stats.update(
        num_sync_all_streams=0, oversize_allocations={"current": 0}, oversize_segments={"current": 0}
    )
    return stats


def bench_reports(repeats: int) -> None:
    calls = 20_000
    nested = nested_stats()
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True, device_count=lambda: 8, memory_stats_as_nested_dict=lambda device: nested
    )
    reporter = Reporter(url=f"http://127.0.0.1:{dead_port()}", job="bench", interval=3600.0, device=0)
    for _ in range(100):
        reporter.step(tokens=4096, samples=8)
        with reporter.data_wait():
            pass
    namespace: dict[str, object] = {"reporter": reporter, "allocator": AllocatorReader(0, None)}
    cases = {"build a report (no torch)": "reporter._report(False)"}
    saved = sys.modules.get("torch")
    sys.modules["torch"] = types.SimpleNamespace(cuda=cuda)  # type: ignore[assignment]
    try:
        cases["allocator read (stand-in torch.cuda)"] = "allocator.read()"
        best = {label: best_ns(statement, namespace, calls, repeats) for label, statement in cases.items()}
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved
    reporter.close(timeout=0.1)
    try:
        import torch.cuda.memory as torch_memory
    except ImportError:
        torch_memory = None
    if torch_memory is not None:  # torch's own flattening, over the same dict
        real = torch_memory.memory_stats_as_nested_dict
        torch_memory.memory_stats_as_nested_dict = lambda device=None: nested  # type: ignore[assignment]
        try:
            label = "torch.cuda.memory_stats() flattening (avoided)"
            best[label] = best_ns(
                "memory_stats(0)", {"memory_stats": torch_memory.memory_stats}, calls, repeats
            )
        finally:
            torch_memory.memory_stats_as_nested_dict = real  # type: ignore[assignment]
    print(f"per report, on the sender thread ({calls} calls, best of {repeats} repeats)")
    for label, ns in best.items():
        print(f"  {label:<50} {ns / 1000:8.2f} µs")


if __name__ == "__main__":
    main()
    bench_reports(7)
