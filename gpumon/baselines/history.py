"""A short memory of each job on this node, for ``gpumon baseline record``: cumulative totals every 10 s.

Sampled on the sampler's thread (a snapshot listener), not on reports or scrapes, so the spacing is even
whatever the traffic. Samples are cumulative (tokens, steps) plus the instantaneous context that turns a
difference of two samples into tokens/s per GPU, step time, MFU and tokens per joule; the statistics over
them live in ``steady.py``. Bounded: at most KEEP seconds per job, and only the jobs the store tracks.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from gpumon.baselines.jobfigures import job_figures
from gpumon.baselines.library import Key
from gpumon.jobs.analysis import JobResult

INTERVAL = 10.0
KEEP = 3600.0


@dataclass(frozen=True, slots=True)
class Sample:
    time: float  # daemon clock
    # mean over the ranks of the time of the step() call that last changed their totals: the totals below
    # are exact at that instant, so differences of samples are measured step boundary to step boundary
    progress: float | None  # None while a rank has not stepped yet
    tokens: float  # summed over the job's ranks on this node, across restarts
    steps: float  # mean over the ranks (a synchronous job's ranks step together)
    ranks: int
    gpus: int
    restarts: int  # summed: a change means a rank came back, so the interval around it is not steady
    progressing: bool
    power_watts: float | None
    flops_per_token: float | None
    peak_flops: float | None


@dataclass(frozen=True, slots=True)
class Context:
    key: Key | None
    why_no_key: str | None
    world_size: int


class JobHistory:
    def __init__(self, interval: float = INTERVAL, keep: float = KEEP, node: str = "") -> None:
        self.interval = interval
        self.keep = keep
        self.node = node  # named in the document, so a baseline says which node it was recorded on
        self._samples: dict[str, deque[Sample]] = {}
        self._context: dict[str, Context] = {}
        self._last = float("-inf")  # monotonic: a wall-clock step must not stop (or flood) the sampling
        self._lock = threading.Lock()

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval

    def record(self, jobs: list[JobResult], now: float) -> None:
        with self._lock:
            self._last = time.monotonic()
            live = set()
            for j in jobs:
                live.add(j.job)
                fig = job_figures(j)
                totals = [r.view.totals() for r in j.ranks]
                updated = [r.view.report.updated for r in j.ranks]
                s = Sample(
                    now,
                    None if None in updated else sum(u for u in updated if u is not None) / len(updated),
                    sum(t["tokens"] for t in totals),
                    sum(t["steps"] for t in totals) / len(totals),
                    len(j.ranks),
                    fig.gpus_on_node,
                    sum(r.view.restarts for r in j.ranks),
                    bool(j.signals.progressing),
                    fig.power_watts,
                    fig.flops_per_token,
                    fig.peak_flops,
                )
                q = self._samples.setdefault(j.job, deque(maxlen=int(self.keep / self.interval) + 2))
                q.append(s)
                world = j.ranks[0].view.report.world_size
                self._context[j.job] = Context(fig.key, fig.why_no_key, world)
            for gone in set(self._samples) - live:  # the store expired it: so does its history
                del self._samples[gone]
                del self._context[gone]

    def samples(self, job: str) -> list[Sample]:
        with self._lock:
            return list(self._samples.get(job, ()))

    def json(self, job: str, window: float | None = None) -> dict[str, Any] | None:
        with self._lock:
            samples = list(self._samples.get(job, ()))
            ctx = self._context.get(job)
        if ctx is None:
            return None
        if window is not None and samples:
            samples = [s for s in samples if s.time >= samples[-1].time - window]
        return {
            "job": job,
            "node": self.node,
            "interval_seconds": self.interval,
            "key": None if ctx.key is None else asdict(ctx.key),
            "why_no_key": ctx.why_no_key,
            "world_size": ctx.world_size,
            "samples": [asdict(s) for s in samples],
        }
