"""Sliding-window rates over a rank's report points: tokens/s, samples/s, step time, phase shares.

Rates are measured between two *progress* points — the times of the step() (or request()) calls that
last changed the totals, as the training process itself timed them — so transport delays and the report
interval do not bend them. The anchor (the first step of the incarnation) is a point too, so a run shorter
than the window is measured from its first step to its last, exactly as the training loop would measure
itself.

A rank stops "progressing" once no step has landed for STALL_STEPS mean step times (at least STALL_FLOOR
seconds); its rates are then 0, so a stuck job does not keep showing its old speed for a whole window.
Ages are measured on the training process's own clock (the report's ``time`` plus the time since it arrived),
so a wall-clock step on either side cannot freeze a rank as progressing or idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpumon.jobs.goodput.ledger import SEEN_FROM_START
from gpumon.jobs.store import Point, RankView

STALL_STEPS = 4.0
STALL_FLOOR = 10.0
# phases that slower clocks do not lengthen, or whose number in a window varies (a checkpoint every N
# steps, an evaluation every M): a step's busy time leaves them out, or one window holding an extra
# evaluation reads as throttling
SIDE_PHASES = ("data_wait", "communication", "checkpoint", "evaluation")
MIN_BUSY = 0.05  # of the step: a loop reporting nearly all its time in side phases is still busy a little


@dataclass(frozen=True, slots=True)
class Span:
    """The two progress points a rate was measured between."""

    start: float
    end: float
    steps: float
    tokens: float
    samples: float
    requests: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Rates:
    progressing: bool  # a step or request landed inside the window
    span: Span | None  # None: fewer than two progress points (a rate is not yet measurable)
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    steps_per_second: float | None = None
    requests_per_second: float | None = None
    step_time_seconds: float | None = None
    phase_ratios: dict[str, float] = field(default_factory=dict)
    # the mean step less its side phases, both counted over the steps completed in the window
    busy_step_seconds: float | None = None
    # the allocator's retries and OOMs within the window; None when the rank does not report them
    alloc_retries: float | None = None
    ooms: float | None = None
    finished: bool = False  # the rank sent its final report


def measure(view: RankView, now: float, window: float) -> Rates:
    """``now`` on the daemon's clock; everything else on the rank's."""
    clock = view.report.time + max(0.0, now - view.received)
    horizon = clock - window
    progress = [p for p in ((view.anchor,) if view.anchor else ()) + view.points if p.updated is not None]
    span = _span(progress, horizon)
    step_time, busy, ratios = _phases(view.points, horizon)
    # a rank first seen mid-run (a daemon restart, a revival): its counts so far are not the window's
    retries, ooms = _allocator(view.points, horizon, view.report.seq < SEEN_FROM_START)
    last = max((p.updated or 0.0 for p in progress), default=None)
    stall_after = max(STALL_FLOOR, STALL_STEPS * (step_time or 0.0))
    progressing = last is not None and clock - last <= stall_after
    final = view.report.final
    if span is None:
        return Rates(
            progressing,
            None,
            step_time_seconds=step_time,
            phase_ratios=ratios,
            busy_step_seconds=busy,
            alloc_retries=retries,
            ooms=ooms,
            finished=final,
        )
    if not progressing:
        return Rates(False, span, 0.0, 0.0, 0.0, 0.0, step_time, ratios, busy, retries, ooms, final)
    s = span.seconds
    return Rates(
        True,
        span,
        span.tokens / s,
        span.samples / s,
        span.steps / s,
        span.requests / s,
        step_time,
        ratios,
        busy,
        retries,
        ooms,
        final,
    )


def _allocator(points: Sequence[Point], horizon: float, fresh: bool) -> tuple[float | None, float | None]:
    """Allocation retries and OOMs between the oldest report in the window and the newest. A process that
    reset its counters (torch.cuda.reset_accumulated_memory_stats) counts from the reset."""
    if not points or points[-1].alloc_retries is None:
        return None, None
    newest = points[-1]
    older = points[:-1]
    inside = [p for p in older if p.reported >= horizon]
    # a single report so far: everything it counts happened since its process started, moments ago
    base = inside[0] if inside else (older[-1] if older else None)
    if base is None or base.alloc_retries is None:
        if not fresh:
            return 0.0, 0.0
        return newest.alloc_retries, newest.ooms
    out = []
    for a, b in ((base.alloc_retries, newest.alloc_retries), (base.ooms, newest.ooms)):
        out.append(None if b is None else (b - (a or 0.0) if b >= (a or 0.0) else b))
    return out[0], out[1]


def _span(progress: Sequence[Point], horizon: float) -> Span | None:
    if not progress:
        return None
    newest = max(progress, key=lambda p: p.updated or 0.0)
    end = newest.updated or 0.0
    older = [p for p in progress if p.updated is not None and p.updated < end]
    if not older:
        return None
    inside = [p for p in older if (p.updated or 0.0) >= horizon]
    # the oldest point in the window; if the newest is the only one in it (a step longer than the window,
    # say), the last one before it
    base = (
        min(inside, key=lambda p: p.updated or 0.0) if inside else max(older, key=lambda p: p.updated or 0.0)
    )
    start = base.updated or 0.0
    return Span(
        start,
        end,
        newest.steps - base.steps,
        newest.tokens - base.tokens,
        newest.samples - base.samples,
        newest.requests - base.requests,
    )


def _phases(points: Sequence[Point], horizon: float) -> tuple[float | None, float | None, dict[str, float]]:
    """Mean step time, mean busy time per step and each phase's share of wall time, between report points
    in the window."""
    if len(points) < 2:
        return None, None, {}
    newest = points[-1]
    at = next((i for i, p in enumerate(points[:-1]) if p.reported >= horizon), len(points) - 2)
    base = points[at]
    elapsed = newest.reported - base.reported
    steps = newest.step_count - base.step_count
    step_time = (newest.step_sum - base.step_sum) / steps if steps > 0 else None
    busy = _busy(points, at)
    if elapsed <= 0:
        return step_time, busy, {}
    ratios = {
        name: min(1.0, max(0.0, (seconds - base.phases.get(name, 0.0)) / elapsed))
        for name, seconds in newest.phases.items()
    }
    return step_time, busy, ratios


def _busy(points: Sequence[Point], at: int) -> float | None:
    """Mean busy seconds per step between the first report after a step at or past ``at`` and the first
    report of the newest step. The step sum holds completed steps only, so the side seconds beside it must
    be those of phases closed by each end's last step: an evaluation under way, or one that ended while
    its step has not, counts in neither, and the window's count of evaluations (seconds long each) cannot
    move the busy time. A phase that closed between a step and the next report still counts: at most one
    step's side time at each end."""
    end = len(points) - 1
    while end > at and points[end - 1].step_count == points[end].step_count:
        end -= 1
    start = at
    while start < end and (start == 0 or points[start - 1].step_count == points[start].step_count):
        start += 1
    if start >= end:  # no step between two aligned reports: the window's ends as they are
        start, end = at, len(points) - 1
    a, b = points[start], points[end]
    steps = b.step_count - a.step_count
    if steps <= 0:
        return None
    step_sum = b.step_sum - a.step_sum
    return max(MIN_BUSY * step_sum, step_sum - (_side(b) - _side(a))) / steps


def _side(p: Point) -> float:
    return sum(p.phases.get(n, 0.0) - p.running.get(n, 0.0) for n in SIDE_PHASES)
