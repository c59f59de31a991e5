"""What a rank's wall time allows it to have done: bounds on a report's growth, and on its start.

The counters a report carries are cumulative and exported as they are; a report that adds more than any
process could in the time it claims (2^53 tokens in a second, a year of phase time) would sit in Prometheus
for good, and every later honest report of the rank would look like a counter going back. The bounds are
far above any real rank's rates, so that an honest process is never refused; they stop the impossible.
"""

from __future__ import annotations

from gpumon.client import protocol as P
from gpumon.jobs.report import Report

SLACK = 5.0  # seconds: a report's own clock reads and the daemon's may disagree this much
# per second of wall time. Tokens: a 10 M-parameter model at 16 GPUs' dense peak trains ~1e9 tokens/s. Not
# tied to the report's own FLOPs and peak: a peak given in the wrong unit would then refuse an honest rank
# for good, where today it shows an MFU anyone can see is wrong. Steps, samples and requests: a step is at
# least one Python call
MAX_RATE = {"tokens": 1e11, "samples": 1e9, "steps": 1e8, "requests": 1e9}
# seconds of a phase or of steps per second of wall time: the loop's thread, plus threads that time
# themselves and call add_phase() (data-loader workers); requests overlap without such a limit
MAX_THREADS = 256
MAX_CONCURRENT_REQUESTS = 1 << 20


def check_growth(old: Report | None, new: Report) -> None:
    """Raise ValueError when ``new`` grew more than its wall time allows since ``old`` (the same
    incarnation's last accepted report), or since its start when it is the first."""
    if old is None:
        elapsed = max(0.0, new.time - min(new.started, new.process_started or new.started))
    else:
        elapsed = max(0.0, new.time - old.time)
    span = elapsed + SLACK
    for name, grew, rate in _growth(old, new):
        if grew > rate * span:
            since = "since the process started" if old is None else "since the last report"
            raise ValueError(
                f"{name}: grew by {grew:.4g} in {elapsed:.0f} s {since}, more than any process could (at "
                f"most {rate * span:.4g}); counts and times are cumulative, per process"
            )


def _growth(old: Report | None, new: Report) -> list[tuple[str, float, float]]:
    """(quantity, how much it grew, the most it can grow per second of wall time)."""
    out = [
        (f"totals.{n}", getattr(new.totals, n) - (getattr(old.totals, n) if old else 0.0), MAX_RATE[n])
        for n in P.TOTALS
    ]
    step_sum = new.step_seconds.sum - (old.step_seconds.sum if old else 0.0)
    out.append(("step_seconds.sum", step_sum, MAX_THREADS))
    before = old.phases if old else {}
    out += [(f"phases.{n}", s - before.get(n, 0.0), MAX_THREADS) for n, s in new.phases.items()]
    req, was = new.request_seconds, None if old is None else old.request_seconds
    if req is not None:
        out.append(("request_seconds.sum", req.sum - (was.sum if was else 0.0), MAX_CONCURRENT_REQUESTS))
    return out


def check_start(r: Report, boot: float) -> None:
    """A report from this node speaks of this boot: its process cannot have started, nor the report have
    been written, before the node booted (an invented start would book years of start-up as badput)."""
    for which, stamp in (("started", r.started), ("process_started", r.process_started), ("time", r.time)):
        if stamp is not None and stamp < boot - SLACK:
            raise ValueError(
                f"{which}: {boot - stamp:.0f} s before this node booted; a process on this node started "
                "after its boot (is the clock set?)"
            )
