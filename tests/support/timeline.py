"""A training process's timeline, step by step and phase by phase, turned into the reports the SDK would
send at given times: for ledger tests that need a realistic step histogram and running phases."""

from __future__ import annotations

import bisect
from typing import Any

from gpumon.client import protocol as P


class Process:
    """One SDK incarnation: call step(t), enter/leave(phase, t) in time order, report(t) whenever."""

    def __init__(self, incarnation: str, started: float, process_started: float | None = None) -> None:
        self.incarnation = incarnation
        self.started = started
        self.process_started = process_started
        self.steps = 0
        self.last: float | None = None
        self.anchor: float | None = None
        self.counts = [0] * (len(P.BUCKETS) + 1)
        self.sum = 0.0
        self.phases: dict[str, float] = {}
        self.open: dict[str, float] = {}
        self.seq = -1

    def step(self, t: float) -> None:
        if self.last is not None:
            self.counts[bisect.bisect_left(P.BUCKETS, t - self.last)] += 1
            self.sum += t - self.last
        elif self.anchor is None:
            self.anchor = t
        self.steps += 1
        self.last = t

    def steps_every(self, start: float, seconds: float, n: int) -> float:
        """``n`` steps ``seconds`` apart from ``start``, no report in between; the time of the last."""
        for k in range(n):
            self.step(start + k * seconds)
        return start + (n - 1) * seconds

    def train(
        self, start: float, seconds: float, n: int, every: float = 1.0
    ) -> tuple[float, list[dict[str, Any]]]:
        """``n`` steps ``seconds`` apart from ``start``, with a report every ``every`` seconds in between,
        as the sender thread sends them; the time of the last step and the reports."""
        out = []
        t, due = start, start + every
        for k in range(n):
            t = start + k * seconds
            while due < t:
                out.append(self.report(due))
                due += every
            self.step(t)
        return t, out

    def enter(self, phase: str, t: float) -> None:
        self.open[phase] = t

    def leave(self, phase: str, t: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + t - self.open.pop(phase)

    def report(self, t: float) -> dict[str, Any]:
        self.seq += 1
        first = None if self.anchor is None else {"time": self.anchor, "steps": 1, "tokens": 1, "samples": 1}
        body: dict[str, Any] = {
            "v": 1, "job": "llm", "rank": 0, "world_size": 1, "local_rank": 0, "kind": "train",
            "workload": None, "incarnation": self.incarnation, "pid": 4242, "seq": self.seq, "time": t,
            "started": self.started, "devices": ["0"], "dtype": "bf16", "flops_per_token": 6e9,
            "flops_convention": "palm", "peak_flops": None,
            "totals": {"steps": self.steps, "tokens": self.steps, "samples": self.steps, "requests": 0},
            "updated": self.last, "anchor": first,
            "step_seconds": {"counts": list(self.counts), "sum": self.sum}, "request_seconds": None,
            "phases": dict(self.phases), "final": False,
        }  # fmt: skip
        if self.process_started is not None:
            body["process_started"] = self.process_started
        running = {name: t - since for name, since in self.open.items() if t > since}
        if running:
            body["open_phases"] = running
        return body

    def reports(self, start: float, end: float, every: float = 1.0) -> list[dict[str, Any]]:
        """Reports every ``every`` seconds from ``start`` to ``end``, as the sender thread sends them while
        nothing else happens (a hang, a long save)."""
        out = []
        t = start
        while t <= end + 1e-9:
            out.append(self.report(t))
            t += every
        return out
