"""The goodput ledger: where every second of a training rank's wall-clock went, across its restarts.

A rank's wall-clock runs from the start of its first process (the OS's start time, else the Reporter's) to
its latest report. Each report moves the ledger from the point it had reached to the report's time, and
every second of that interval lands in exactly one bucket. Which bucket, when several could apply:

1. Before a process's first step: ``restart`` when an earlier process of the rank came before it (from that
   process's final report, or its last step when it was killed, to this one's first step), else
   ``startup`` (from process start to the first step). Phase time that arrives in the report with the
   first step is start-up's as far as the time before that step holds it, but for what the report places
   after it: a running phase's time since the first step, and the data waits of the later steps.
2. After it, the badput phases the SDK timed claim their seconds, running ones included (``open_phases``):
   ``checkpoint`` first, then ``evaluation``, then ``data_wait``.
3. What is left waits for the next step. A step that lands takes it: ``lost_progress`` for a step at or
   below the rank's high-water global step (redone after resuming from an older checkpoint), else
   ``goodput``, less ``slow_steps``: the excess over the job's baseline step time, when it has one.
   No step, beyond the phases, for longer than STALL_STEPS recent mean step times (at least STALL_FLOOR
   seconds): ``stall``, from the last step on, less the own length of the step that ends it (and of the
   steps after it in that report: the recent mean each), which is the step's. The recent mean follows the
   step times of the last minute or so (an exponential average).
A process whose report names a predecessor this ledger never saw (the SDK's state file: the rank's previous
process ran on another node, whose daemon booked its time up to its last step) follows it from there: the
gap from that last step to this process's start is ``restart``'s (``carried``, so the exporter can publish it
once the rank's series exist), the steps up to its high-water step are redone, and the rank counts one more
restart (``moves``).

4. After a process's last step: a final report (a clean end) ends the wait as a step would. What its
   phases and a stall did not take is goodput: a pause shorter than the threshold, as before a step (a
   run's wind-down is seconds; its final save and evaluation are phases). A process killed (no final
   report) died in a step: its time after the last step is held, and is ``restart``'s with the gap when
   its successor comes; if none comes, it stays held (``pending``).

Counters only grow: a stall is recognised late, so time waiting for a step is held (``pending``) and
classified when the step lands or the stall is recognised. A stall no report saw (reports far apart, a
process frozen whole) is found when the step lands, in the step histogram's buckets above the threshold;
the long steps keep their own length (the mean) as the step that ends a seen stall does. Phase time
reported after the fact (``add_phase`` once a save ended) takes back held time, not the next step's. A rank
first seen after its first reports (the daemon started later) is accounted from then on. Not thread-safe:
the job store calls it under its lock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpumon.client.protocol import BUCKETS, MAX_RESTART_GAP
from gpumon.jobs.report import Report

CAUSES = (
    "startup",
    "restart",
    "checkpoint",
    "evaluation",
    "data_wait",
    "stall",
    "lost_progress",
    "slow_steps",
)
CLAIMING_PHASES = ("checkpoint", "evaluation", "data_wait")  # in the order they win
# as a rank's "progressing" (window.py): no step for this many recent mean step times is a stall
STALL_STEPS = 4.0
STALL_FLOOR = 10.0
MEAN_SECONDS = 60.0  # the time constant of the recent mean step time
# a process first seen with a report numbered below this was seen from its start (the SDK sends seq 0 as
# the Reporter is made); later, the daemon started after it, and its past is not guessed
SEEN_FROM_START = 3
# before a process has a mean step time (its second step), only a gap this long is a stall
STALL_UNKNOWN = 60.0
CLOCK_SKEW = (
    5.0  # seconds a predecessor's last step may lie after its successor's start (another node's clock)
)


@dataclass(frozen=True, slots=True)
class LedgerView:
    """A copy of one rank's ledger for analysis and export."""

    since: float | None  # start of the rank's wall-clock (unix seconds)
    until: float | None  # the point the ledger has reached
    goodput: float
    badput: Mapping[str, float]  # every cause in CAUSES
    pending: float  # seconds since the last step not yet classified
    steps_redone: float
    high_step: float  # the rank's high-water global step
    # of badput["restart"], the gaps since predecessors on other nodes, and how many such restarts
    carried: float = 0.0
    moves: int = 0

    @property
    def total(self) -> float:
        return self.goodput + sum(self.badput.values())


class Ledger:
    # slots: a gone rank keeps its ledger for an hour (with its offsets), up to 4 x --max-ranks of them
    __slots__ = (
        "_base", "_claimed", "_follows", "_high", "_hist", "_incarnation", "_mean", "_pending", "_seen",
        "_stalled", "_stepped", "_steps", "_to", "badput", "carried", "goodput", "moves", "since",
        "steps_redone",
    )  # fmt: skip

    def __init__(self) -> None:
        self.goodput = 0.0
        self.badput = dict.fromkeys(CAUSES, 0.0)
        self.steps_redone = 0.0
        self.since: float | None = None
        self._to: float | None = None  # accounted up to, on the reports' clock
        self._pending = 0.0
        self._stalled = False  # the pending time is a stall already recognised
        self._incarnation: str | None = None
        self._follows = False  # this process follows an earlier one of the rank
        self._stepped = False  # this process made its first step
        self._steps = 0.0  # its steps accounted so far
        self._seen: dict[str, float] = {}  # its claiming phases' seconds accounted so far
        self._high = 0.0  # the rank's high-water global step
        self._base = 0.0  # the global step this process started from
        self._hist: tuple[tuple[float, ...], float] = ((), 0.0)  # its step histogram at the last report
        # phase seconds claimed since its last step: (checkpoint and evaluation, data wait)
        self._claimed = (0.0, 0.0)
        self._mean: float | None = None  # its recent mean step time
        self.carried = 0.0  # restart seconds since predecessors another daemon saw
        self.moves = 0

    def view(self) -> LedgerView:
        return LedgerView(
            self.since,
            self._to,
            self.goodput,
            dict(self.badput),
            self._pending,
            self.steps_redone,
            self._high,
            self.carried,
            self.moves,
        )

    def observe(self, r: Report, baseline_step: float | None) -> None:
        """Account from the point reached to ``r.time``; ``baseline_step``: the job's baseline step time."""
        if r.kind != "train":
            return
        if r.incarnation != self._incarnation:
            if self._start(r):
                return
        elif not self._stepped and r.resumed_step is not None:
            self._base = float(r.resumed_step)  # resume() called after the Reporter was made
        assert self._to is not None
        left = r.time - self._to
        if left <= 0.0:
            return
        if not self._stepped:
            if r.anchor_time is None or r.anchor is None:
                self._add("restart" if self._follows else "startup", left)
                self._seen = _claimable(r)
                self._hist = _histogram(r)
                self._to = r.time
                return
            before = min(left, max(0.0, r.anchor_time - self._to))
            self._add("restart" if self._follows else "startup", before)
            self._stepped = True
            self._steps = r.anchor.steps
            # the first step's time is the restart's or start-up's, but a redone first step is still redone
            self.steps_redone += min(self._steps, max(0.0, self._high - self._base))
            self._high = max(self._high, self._base + self._steps)
            left -= before
            self._absorb_before_first_step(r, before, r.anchor_time)
        for phase in CLAIMING_PHASES:
            left -= self._claim(phase, r, left)
        self._after_claims(r, left, baseline_step)
        if r.final:
            self._end(r)
        self._learn_mean(r)  # after the stall tests, which hold a step to the mean from before it
        self._hist = _histogram(r)
        self._to = r.time

    def _absorb_before_first_step(self, r: Report, before: float, first: float) -> None:
        """Phase time that arrives with the first step may be from before it, start-up's already: as much
        as the ``before`` seconds hold, but never what the report places after the first step. That is a
        running phase's time since the first step, and the data waits of the steps after it (one wait per
        step, evenly, as everywhere in the ledger: only the first step's came before it)."""
        since_first = max(0.0, r.time - first)
        steps = max(1.0, r.totals.steps)
        budget = before
        for phase, seconds in _claimable(r).items():
            grown = max(0.0, seconds - self._seen.get(phase, 0.0))
            after = min(grown, r.open_phases.get(phase, 0.0), since_first)
            if phase == "data_wait":
                after += (grown - after) * (steps - 1.0) / steps
            absorbed = min(budget, grown - after)
            self._seen[phase] = self._seen.get(phase, 0.0) + absorbed
            budget -= absorbed

    def _end(self, r: Report) -> None:
        """A final report: the process ended cleanly, and its time after its last step is its own. Its
        phases claimed theirs already; the rest is a stall when it was longer than the threshold (a final
        report long after a last step no report saw), else goodput, like a pause shorter than the threshold
        before a step (the wind-down of a run is seconds: its final save and evaluation are phases)."""
        if self._pending <= 0.0:
            return
        last = r.updated if r.updated is not None else r.time
        big, wait = self._claimed
        self._add("stall" if r.time - last - big - wait > self._stall_after() else "goodput", self._pending)
        self._pending = 0.0
        self._stalled = False

    def _start(self, r: Report) -> bool:
        """A new process of the rank; True when there is nothing to account yet (first seen mid-run)."""
        first = self._incarnation is None
        known = self._incarnation
        self._incarnation = r.incarnation
        self._stepped = False
        self._steps = 0.0
        self._seen = {}
        self._hist = ((), 0.0)
        self._claimed = (0.0, 0.0)
        self._mean = None
        p = r.predecessor
        if p is not None and p.incarnation != known and r.seq < SEEN_FROM_START and _recent(r, p.last_step):
            self._follow(r, p.step, p.last_step, first)
            return False
        self._base = self._high if r.resumed_step is None else float(r.resumed_step)
        if not first:
            # the predecessor's time after its last step, and the gap until this process, is the restart's
            self._add("restart", self._pending)
            self._pending = 0.0
            self._stalled = False
            self._follows = True
            return False
        if r.seq >= SEEN_FROM_START:
            # the daemon started after this process (or missed its first reports): its past, start-up
            # included, may be another daemon's count already, so it is accounted from now on
            self.since = self._to = r.time
            self._seen = _claimable(r)
            self._hist = _histogram(r)
            if r.anchor is not None:
                self._stepped = True
                self._steps = r.totals.steps
                self._high = self._base + self._steps
            return True
        self.since = self._to = min(r.process_started or r.started, r.started, r.time)
        return False

    def _follow(self, r: Report, step: int, last_step: float, first: bool) -> None:
        """This process follows one another daemon accounted up to its last step (at ``last_step``, global
        step ``step``): the gap since is the restart's. What this ledger still held of an older process of
        the rank (here before the rank moved away) was booked by the daemon that saw its successor."""
        start = min(r.process_started or r.started, r.started, r.time)
        self._high = max(self._high, float(step))
        self._base = self._high if r.resumed_step is None else float(r.resumed_step)
        self._pending = 0.0
        self._stalled = False
        self._follows = True
        if first or self._to is None:
            # the rank's restart counter here starts with this process; a node that saw an earlier one of
            # the rank counts this restart already (a new incarnation), so it is not counted twice
            self.moves += 1
            self.since = last_step
        gap = max(0.0, start - max(last_step, self._to if self._to is not None else last_step))
        self._add("restart", gap)
        self.carried += gap
        self._to = max(start, self._to if self._to is not None else start)

    def _claim(self, phase: str, r: Report, left: float) -> float:
        now = _phase_seconds(r, phase)
        seen = self._seen.get(phase, 0.0)
        if now <= seen:
            return 0.0  # a running phase's reading lags by a report when it ends
        self._seen[phase] = now
        grown = now - seen
        taken = min(grown, max(0.0, left))
        # time reported after the fact (add_phase once a save ended) may be older than this interval: it
        # takes back what still waits for a step; what a stall took already is gone with it
        late = min(grown - taken, self._pending)
        self._pending -= late
        self._add(phase, taken + late)
        big, wait = self._claimed
        if phase == "data_wait":
            self._claimed = (big, wait + taken + late)
        else:
            self._claimed = (big + taken + late, wait)
        return taken

    def _stall_after(self) -> float:
        if self._mean is None:
            return STALL_UNKNOWN
        return max(STALL_FLOOR, STALL_STEPS * self._mean)

    def _after_claims(self, r: Report, left: float, baseline_step: float | None) -> None:
        left = max(0.0, left)
        steps = r.totals.steps - self._steps
        last = r.updated if r.updated is not None else r.time
        big, wait = self._claimed
        if steps <= 0:
            self._pending += left
            # the phases since the last step are not waiting for one: a long save is not a stall
            if self._stalled or r.time - last - big - wait > self._stall_after():
                self._stalled = True
                self._add("stall", self._pending)
                self._pending = 0.0
            return
        tail = min(left, max(0.0, r.time - last))  # waiting for the next step already
        work = self._pending + left - tail
        self._pending = tail
        self._claimed = (0.0, 0.0)
        if self._stalled:
            self._stalled = False
            if self._mean is not None:
                # the step that ended the stall took its own length besides the hang, and the steps after
                # it theirs: the recent mean each (a step's data wait is in it, booked already)
                stall = max(0.0, work - max(0.0, steps * self._mean - wait))
            else:  # before the process has a mean step time: the ending step's even share of the interval
                stall = min(work, (left - tail) / max(1.0, steps))
            self._add("stall", stall)
            work -= stall
        else:
            # a stall no report saw (reports far apart, or the whole process frozen): the step histogram
            # still has the long steps
            long_steps, long_time, grown = self._long_steps(r)
            # checkpoints and evaluations are why a step runs long; data waits are every step's, evenly
            each_wait = wait / grown if grown > 0 else 0.0
            unexplained = long_time - big - long_steps * each_wait
            if long_steps > 0 and unexplained > long_steps * self._stall_after():
                # the long steps keep their own length, as the step that ends a seen stall does; before the
                # process has a mean step time that is unknown, and they are the stall's whole
                own = 0.0 if self._mean is None else long_steps * max(0.0, self._mean - each_wait)
                stall = min(work, unexplained - own)
                self._add("stall", stall)
                work -= stall
                if self._mean is None:
                    steps -= long_steps
                    self._steps += long_steps
                if steps <= 0:
                    self._add("stall", work)
                    self._steps = r.totals.steps
                    self._high = max(self._high, self._base + self._steps)
                    return
        self._classify(r, work, steps, baseline_step)

    def _classify(self, r: Report, work: float, steps: float, baseline_step: float | None) -> None:
        """``work`` seconds of ``steps`` steps that landed: redone, slow or goodput."""
        before = self._base + self._steps
        redone = min(steps, max(0.0, self._high - before))
        lost = work * redone / steps
        self._add("lost_progress", lost)
        self.steps_redone += redone
        good = work - lost
        kept = steps - redone
        if baseline_step is not None and kept > 0:
            slow = min(good, max(0.0, good - kept * baseline_step))
            self._add("slow_steps", slow)
            good -= slow
        self.goodput += good
        self._steps = r.totals.steps
        self._high = max(self._high, self._base + self._steps)

    def _learn_mean(self, r: Report) -> None:
        """The recent mean step time, from the histogram's growth since the last report: an exponential
        average over about MEAN_SECONDS of steps, where one report weighs at most half and a step counts
        as at most the stall threshold. So a stall raises it a little, and a lasting change of step time (a
        longer sequence) costs a step or two counted as stall before the mean follows."""
        counts, total = self._hist
        h = r.step_seconds
        grown = h.count - (sum(counts) if counts else 0.0)
        if grown <= 0:
            return
        # a stall counts as the threshold it crossed: it raises the mean, but one hang cannot blind the
        # ledger to the next one
        mean = min(max(0.0, h.sum - total) / grown, self._stall_after())
        if self._mean is None:
            self._mean = mean
            return
        # weighed by the step time observed, not the report interval: 12 s steps are learnt in a few steps
        weight = min(0.5, 1.0 - math.exp(-max(0.0, h.sum - total) / MEAN_SECONDS))
        self._mean += weight * (mean - self._mean)

    def _long_steps(self, r: Report) -> tuple[float, float, float]:
        """Steps since the last report that took longer than the stall threshold, by the histogram's buckets
        (only buckets wholly above it); their seconds (the histogram's growth less the other steps' recent
        mean, or at least their buckets' lower bounds); and how many steps the histogram grew by."""
        counts, total = self._hist
        h = r.step_seconds
        if not counts:
            return 0.0, 0.0, 0.0
        threshold = self._stall_after()
        grown = [b - a for a, b in zip(counts, h.counts, strict=True)]
        # bucket i holds (BUCKETS[i-1], BUCKETS[i]]: it is wholly above the threshold from its lower bound
        long = [
            (BUCKETS[i - 1], n)
            for i, n in enumerate(grown)
            if i > 0 and n > 0 and BUCKETS[i - 1] >= threshold
        ]
        long_steps = sum(n for _, n in long)
        if long_steps <= 0:
            return 0.0, 0.0, sum(grown)
        floor = sum(bound * n for bound, n in long)
        short = sum(grown) - long_steps
        if self._mean is not None:
            others = short * self._mean
        else:  # no mean yet: the other steps at their buckets' upper bounds, the least the long ones took
            others = sum(
                BUCKETS[i] * n for i, n in enumerate(grown[: len(BUCKETS)]) if BUCKETS[i] < threshold
            )
        return long_steps, max(floor, (h.sum - total) - others), sum(grown)

    def _add(self, cause: str, seconds: float) -> None:
        if seconds <= 0.0:
            return
        if cause == "goodput":
            self.goodput += seconds
        else:
            self.badput[cause] += seconds


def _recent(r: Report, last_step: float) -> bool:
    """A predecessor this process can follow: its last step before this process started (a few seconds of
    clock skew between nodes allowed) and within MAX_RESTART_GAP, as long as a gone rank's ledger is kept
    on one node. An older one (a stale state file, a run from days ago) is not this rank's restart."""
    start = min(r.process_started or r.started, r.started)
    return start - MAX_RESTART_GAP <= last_step <= start + CLOCK_SKEW


def _histogram(r: Report) -> tuple[tuple[float, ...], float]:
    return tuple(r.step_seconds.counts), r.step_seconds.sum


def _phase_seconds(r: Report, phase: str) -> float:
    """A phase's seconds so far, a running one's included."""
    return r.phases.get(phase, 0.0) + r.open_phases.get(phase, 0.0)


def _claimable(r: Report) -> dict[str, float]:
    return {p: _phase_seconds(r, p) for p in CLAIMING_PHASES}
