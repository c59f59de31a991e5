"""One node's ranks of a synchronous data-parallel job, for the fleet test (tests/e2e/test_fleet.py).

A real process with the real SDK: one thread per rank, each a ``gpumon.client.Reporter`` with ``device=N`` on
a simulated GPU of its node's ``gpumon serve --simulate`` daemon, which then drives that GPU by the phases the
rank reports (gpumon/gpu/sim/driven.py). Several Reporters of different ranks in one process are what the SDK
supports (docs/sdk.md); killing this process is its node's ranks dying together.

Each step a rank computes (sleeps inside ``forward_backward``) for ``--compute`` seconds times its node's
factor, then enters ``communication`` and waits at the job's barrier (a TCP server the test runs) until
every connected rank has arrived, then spends ``--comm`` more seconds there (the all-reduce itself), then
calls ``step()``. So a slow node makes every other rank wait in communication, as in synchronous training.

The node's factor comes from the ``--control`` file (JSON ``{"factors": {"node-1": 1.4}}``), re-read when it
changes, so the test drives every node's speed over time. Every step is logged as one JSON line (rank, global
step, wall-clock time of ``step()``, busy and communication seconds) to ``--log``: the truth the test checks
the daemons' and Prometheus' figures against. The ranks end when the barrier closes (the test is done): they
close their Reporters (final reports) and the process exits 0.

Standard library and gpumon.client only (what a training process has).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time
from typing import Any, TextIO

from gpumon.client import Reporter

H100_BF16 = 989.5e12  # dense bf16 peak of the simulated H100 SXM (gpumon/jobs/peaks.py)


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True, help="the node's daemon, http://127.0.0.1:PORT")
    p.add_argument("--barrier", type=int, required=True, help="the job barrier's port on 127.0.0.1")
    p.add_argument("--control", required=True, help="JSON file with each node's compute factor")
    p.add_argument("--node", required=True, help="this node's name in the control file")
    p.add_argument("--log", required=True, help="JSON-lines file: one line per step of every rank")
    p.add_argument("--job", required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument(
        "--rank",
        action="append",
        required=True,
        metavar="RANK:GPU",
        help="a rank and its GPU (its local rank)",
    )
    p.add_argument("--resumed-step", type=int, help="the global step the ranks resume from (a checkpoint)")
    p.add_argument("--compute", type=float, required=True, help="seconds of compute per step at factor 1")
    p.add_argument("--comm", type=float, required=True, help="seconds of the collective itself per step")
    p.add_argument("--flops-per-token", type=float, required=True)
    p.add_argument("--mfu", type=float, default=0.45, help="MFU of the compute part of a step (sets tokens)")
    p.add_argument(
        "--load", type=float, default=0.0, help="seconds between the Reporters' start and the first step"
    )
    return p.parse_args()


class Control:
    """Each node's compute factor, from a file the test replaces atomically; re-read when it changed."""

    def __init__(self, path: str, node: str) -> None:
        self.path, self.node = path, node
        self._lock = threading.Lock()
        self._stamp = -1
        self._factor = 1.0

    def factor(self) -> float:
        with self._lock:
            try:
                stamp = os.stat(self.path).st_mtime_ns
                if stamp != self._stamp:
                    with open(self.path) as fh:
                        self._factor = float(json.load(fh).get("factors", {}).get(self.node, 1.0))
                    self._stamp = stamp
            except (OSError, ValueError):
                pass  # keep the last factor: a control file is replaced whole, never half-written
            return self._factor


class Collective:
    """This rank's connection to the job's barrier: ``wait()`` returns once every connected rank arrived,
    False when the barrier is gone (the job is over)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def wait(self) -> bool:
        try:
            self.sock.sendall(b"arrive\n")
            return self.reader.readline().startswith(b"go")
        except OSError:
            return False

    def close(self) -> None:
        self.sock.close()


class StepLog:
    def __init__(self, fh: TextIO) -> None:
        self.fh = fh
        self.lock = threading.Lock()

    def write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry) + "\n"
        with self.lock:
            self.fh.write(line)
            self.fh.flush()  # a SIGKILL must not take logged steps with it


def run_rank(reporter: Reporter, rank: int, control: Control, log: StepLog, a: argparse.Namespace) -> None:
    tokens = max(1, round(a.mfu * H100_BF16 * a.compute / a.flops_per_token))
    # a rank joins the collective once it is ready (NCCL's init after the model loaded): until then the
    # others go on without it
    collective = Collective(a.barrier)
    step = a.resumed_step or 0
    top = time.perf_counter()
    try:
        while True:
            with reporter.forward_backward():
                time.sleep(a.compute * control.factor())
            entered = time.perf_counter()
            with reporter.communication():
                if not collective.wait():
                    return
                time.sleep(a.comm)
            left = time.perf_counter()
            reporter.step(tokens=tokens, samples=1)
            step += 1
            # busy: the step's wall time outside the collective, as the rules compute it from the counters
            log.write(
                {"rank": rank, "step": step, "t": time.time(), "busy": entered - top, "comm": left - entered}
            )
            top = left
    finally:
        collective.close()


def main() -> int:
    a = _parse()
    control = Control(a.control, a.node)
    ranks = [tuple(int(x) for x in item.split(":")) for item in a.rank]
    # made on the main thread, so the first one installs the SDK's SIGTERM handler (final reports)
    reporters = [
        Reporter(
            job=a.job,
            rank=rank,
            world_size=a.world_size,
            local_rank=gpu,
            device=gpu,
            workload=a.job,
            dtype="bf16",
            flops_per_token=a.flops_per_token,
            url=a.url,
            interval=1.0,
            enabled=True,
            resumed_step=a.resumed_step,
        )
        for rank, gpu in ranks
    ]
    # start-up after the Reporters exist, as in a training script: building the model, loading the
    # checkpoint. The daemons know the ranks, their pids and GPUs meanwhile, before any step
    time.sleep(a.load)
    with open(a.log, "a", encoding="utf-8") as fh:
        log = StepLog(fh)
        threads = [
            threading.Thread(target=run_rank, args=(rep, rank, control, log, a), name=f"rank-{rank}")
            for rep, (rank, _) in zip(reporters, ranks, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for rep in reporters:
        rep.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
