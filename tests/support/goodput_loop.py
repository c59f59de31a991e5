"""A training loop with the real SDK for the goodput ledger's end-to-end test, run as its own process.

It sleeps where a real loop would work, and logs every event with its wall-clock time to a JSON-lines file
the test reads, so each ledger bucket can be checked against what was injected:

    python goodput_loop.py URL LOG --steps 40 [--resume 20] [--load 1.0] [--checkpoint-at 20 ...]
        [--evaluate-at 30 ...] [--stall-at 45 --stall 12] [--hang-after]

Each step: data wait (0.02 s in data_wait), compute (0.08 s), step(). After step N: a checkpoint (0.5 s) when
N is in --checkpoint-at, an evaluation (0.7 s) when in --evaluate-at, a stall (--stall s, no phase) when N is
--stall-at. --hang-after: after the last step, sleep until killed.
"""

from __future__ import annotations

import argparse
import json
import time

from gpumon.client import Reporter

DATA_WAIT, COMPUTE, CHECKPOINT, EVALUATION = 0.02, 0.08, 0.5, 0.7
REPORT_INTERVAL = 0.1  # the Reporter's: the test's tolerance per bucket is at least this


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("log")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--resume", type=int, default=0)
    p.add_argument("--load", type=float, default=0.0)
    p.add_argument("--checkpoint-at", type=int, action="append", default=[])
    p.add_argument("--evaluate-at", type=int, action="append", default=[])
    p.add_argument("--stall-at", type=int)
    p.add_argument("--stall", type=float, default=0.0)
    p.add_argument("--hang-after", action="store_true")
    a = p.parse_args()
    with open(a.log, "a") as log:

        def event(kind: str, **fields: float) -> None:
            log.write(json.dumps({"event": kind, "time": time.time(), **fields}) + "\n")
            log.flush()

        time.sleep(a.load)  # building the model, loading the checkpoint
        r = Reporter(job="goodput-e2e", url=a.url, interval=REPORT_INTERVAL, resumed_step=a.resume or None)
        for step in range(a.resume + 1, a.steps + 1):
            t = time.time()
            with r.data_wait():
                time.sleep(DATA_WAIT)
            # measured, as the SDK measures it: a loaded machine's sleeps overrun, and 70 of them add up
            event("data_wait", seconds=time.time() - t, step=step)
            t = time.time()
            time.sleep(COMPUTE)
            event("compute", seconds=time.time() - t, step=step)
            r.step(tokens=1000, samples=1)
            event("step", step=step)
            for at, kind, phase, seconds in (
                (a.checkpoint_at, "checkpoint", r.checkpoint, CHECKPOINT),
                (a.evaluate_at, "evaluation", r.evaluation, EVALUATION),
            ):
                if step in at:
                    t = time.time()
                    with phase():
                        time.sleep(seconds)
                    event(kind, seconds=time.time() - t, step=step)
            if step == a.stall_at:
                t = time.time()
                time.sleep(a.stall)  # a hung collective that recovers
                event("stall", seconds=time.time() - t, step=step)
        if a.hang_after:
            event("hang")
            time.sleep(3600)
        r.close()


if __name__ == "__main__":
    main()
