"""Microbenchmark: the SDK's hot path against a bare prometheus_client Counter.inc(), side by side in one run.

    python bench/bench_sdk.py [--calls 1000000] [--repeats 7]

The Reporter points at a port nothing listens on, so its thread sends nothing; it backs off and is idle.
Prints nanoseconds per call (best of the repeats) and the ratio step()/inc(); the target is <= 2.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import timeit

from prometheus_client import CollectorRegistry, Counter

from gpumon.client import Reporter

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


if __name__ == "__main__":
    main()
