"""Reports per (job, rank): exported totals, a short history for windowed rates, restarts, limits, expiry.

Reports carry cumulative totals, so the store keeps the latest one per rank plus a bounded history of
points for the sliding-window rates. A new incarnation (the training process restarted) folds the old one's
final totals into offsets, so exported counters never go backwards while the daemon runs. All methods are
thread-safe: ingest runs on the server's threads while scrapes and /v1/jobs read.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from gpumon.client import protocol as P
from gpumon.jobs.goodput.ledger import Ledger, LedgerView
from gpumon.jobs.physics import check_growth
from gpumon.jobs.report import Report
from gpumon.web.peer import Peer

log = logging.getLogger("gpumon.jobs")
MAX_CARRIED_PHASES = 2 * P.MAX_PHASES  # phase names a rank exports, over all its processes
# the seconds of phase names past MAX_CARRIED_PHASES: a name no client can send (PHASE_PATTERN), so that a
# rank's phase series neither grow without end nor ever go back (a name dropped, then reported again at 1)
OTHER_PHASES = "_other"
_ALLOCATOR = ("alloc_retries", "ooms")
MAX_POINTS = 512  # per rank: 60 s of reports at 8/s; more only shortens the effective window
FINISHED_LINGER = 30.0  # seconds a rank stays after its final report, so a scrape sees its last totals
# a rank that went (finished, or silent past the TTL) keeps its counter offsets this long, so a process that
# comes back as the same (job, rank) continues its counters instead of resetting them
RETAIN_OFFSETS = 3600.0
LOST_RETAIN = (
    3600.0  # seconds a gone job's lost-ranks counter stays, so increase() over the alert's range sees it
)
# a replaced incarnation still reporting this long after its successor started is a second live process
CONFLICT_GRACE = 5.0
# how far a report's own time may run ahead of this daemon's clock. The SDK and the daemon mostly share one
# clock (the same node); a report from later than that would, as a new incarnation, make every report of the
# live process look older than it ("duplicate", for as long as the lie) and freeze its counters.
FUTURE_SKEW = 5.0
# how far seq may run ahead of the last report's: the SDK numbers every attempt, at most 100 a second (its
# shortest interval is 10 ms) plus flushes. A larger jump would make every later report of the live process
# look old ("duplicate") until its own seq caught up.
SEQ_BURST, SEQ_PER_SECOND = 1000, 200


class Point(NamedTuple):
    """One accepted report, reduced to what the windows need (incarnation-local values)."""

    reported: float  # the report's time
    updated: float | None  # when its totals last changed (a step or request)
    steps: float
    tokens: float
    samples: float
    requests: float
    step_sum: float
    step_count: float
    phases: Mapping[str, float]  # running phases included, as far as they have run
    # the allocator's cumulative counters (None: not reported), for retries and OOMs within the window
    alloc_retries: float | None = None
    ooms: float | None = None
    # the running phases' part of ``phases``: a step's busy time pairs the step sum with closed phases only
    running: Mapping[str, float] = {}


class LimitExceeded(Exception):
    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome  # "job_limit" or "rank_limit"


class Stale(Exception):
    """Not an error the client must fix: a report older than what the store already holds."""


class Conflict(Exception):
    """Two live processes report as the same (job, rank): the client must tell them apart."""


class Impostor(Exception):
    """A process reports for an incarnation another process holds (the kernel says who sent it)."""


_ZEROS = (0.0,) * (len(P.BUCKETS) + 1)
_NO_POINTS: deque[Point] = deque(maxlen=0)  # a gone rank's: shared, and never appended to


@dataclass(frozen=True, slots=True)
class Offsets:
    """What earlier incarnations of a rank contributed to its exported counters (replaced, never mutated),
    and the phase names the rank exports."""

    steps: float = 0.0
    tokens: float = 0.0
    samples: float = 0.0
    requests: float = 0.0
    phases: Mapping[str, float] = field(default_factory=dict)
    step_counts: tuple[float, ...] = _ZEROS
    step_sum: float = 0.0
    request_counts: tuple[float, ...] = _ZEROS
    request_sum: float = 0.0
    alloc_retries: float = 0.0
    ooms: float = 0.0
    # whether an earlier incarnation reported each allocator counter: its series then stays
    alloc_known: tuple[bool, bool] = (False, False)
    # the phase names exported on their own, in the order first reported (at most MAX_CARRIED_PHASES); the
    # seconds of any other name go to OTHER_PHASES, so no exported phase series ever goes back
    names: tuple[str, ...] = ()

    def plus(self, r: Report, alloc: tuple[float | None, float | None]) -> Offsets:
        """With the incarnation whose last report is ``r`` (its allocator counters last known as
        ``alloc``) folded in."""
        t = r.totals
        phases = dict(self.phases)
        rest = [seconds for name, seconds in r.phases.items() if name not in self.names]
        for name, seconds in r.phases.items():
            if name in self.names:
                phases[name] = phases.get(name, 0.0) + seconds
        if rest:
            # summed as RankView.phases sums them, in one go: added one by one, the carried total could
            # come out an ulp below what the last scrape showed, and Prometheus reads any drop as a reset
            phases[OTHER_PHASES] = phases.get(OTHER_PHASES, 0.0) + sum(rest)
        req = r.request_seconds
        return Offsets(
            self.steps + t.steps,
            self.tokens + t.tokens,
            self.samples + t.samples,
            self.requests + t.requests,
            phases,
            tuple(a + b for a, b in zip(self.step_counts, r.step_seconds.counts, strict=True)),
            self.step_sum + r.step_seconds.sum,
            self.request_counts
            if req is None
            else tuple(a + b for a, b in zip(self.request_counts, req.counts, strict=True)),
            self.request_sum + (0.0 if req is None else req.sum),
            self.alloc_retries + (alloc[0] or 0.0),
            self.ooms + (alloc[1] or 0.0),
            (self.alloc_known[0] or alloc[0] is not None, self.alloc_known[1] or alloc[1] is not None),
            self.names,
        )

    def naming(self, r: Report) -> Offsets:
        """With the phase names of ``r`` not yet exported admitted, while there is room."""
        new = sorted(n for n in r.phases if n not in self.names)
        room = MAX_CARRIED_PHASES - len(self.names)
        if not new or room <= 0:
            return self
        return replace(self, names=self.names + tuple(new[:room]))


def _track_allocator(
    offsets: Offsets, last: tuple[float | None, float | None], r: Report
) -> tuple[Offsets, tuple[float | None, float | None]]:
    """The allocator counters as last known, and the offsets with what a reset took away: a process that
    reset them (torch.cuda.reset_accumulated_memory_stats) keeps its exported counters from going back, and
    a report without them (``memory`` null, a field missing) forgets nothing."""
    if r.memory is None:
        return offsets, last
    known: list[float | None] = []
    for i, name in enumerate(_ALLOCATOR):
        value = getattr(r.memory, name)
        if value is None:
            known.append(last[i])
            continue
        before = last[i]
        if before is not None and float(value) < before:
            offsets = replace(offsets, **{name: getattr(offsets, name) + before})
        known.append(float(value))
    return offsets, (known[0], known[1])


@dataclass
class Rank:
    report: Report  # the latest accepted
    received: float  # daemon clock
    offsets: Offsets = field(default_factory=Offsets)
    restarts: int = 0
    points: deque[Point] = field(default_factory=lambda: deque(maxlen=MAX_POINTS))
    anchor: Point | None = None
    ledger: Ledger = field(default_factory=Ledger)
    alloc: tuple[float | None, float | None] = (None, None)  # this incarnation's, last known
    # the process that sent this incarnation's first report over the unix socket; None over TCP, where
    # nothing says which local process is speaking
    sender: Peer | None = None

    @property
    def key(self) -> tuple[str, int]:
        return self.report.job, self.report.rank


@dataclass(frozen=True, slots=True)
class RankView:
    """An immutable copy of one rank for analysis, taken under the store's lock."""

    report: Report
    received: float
    offsets: Offsets
    restarts: int
    points: tuple[Point, ...]
    anchor: Point | None
    ledger: LedgerView
    alloc: tuple[float | None, float | None] = (None, None)

    def totals(self) -> dict[str, float]:
        """The exported counters: earlier incarnations' offsets plus this one's totals."""
        return {name: getattr(self.offsets, name) + getattr(self.report.totals, name) for name in P.TOTALS}

    def phases(self) -> dict[str, float]:
        """Exported phase seconds: every name the rank exports, earlier incarnations' included, and the
        rest under OTHER_PHASES once there is any."""
        mine, before, names = self.report.phases, self.offsets.phases, self.offsets.names
        out = {name: mine.get(name, 0.0) + before.get(name, 0.0) for name in names}
        rest = [s for name, s in mine.items() if name not in names]
        if rest or OTHER_PHASES in before:
            out[OTHER_PHASES] = before.get(OTHER_PHASES, 0.0) + sum(rest)
        return dict(sorted(out.items()))

    def allocator_counts(self) -> tuple[float | None, float | None] | None:
        """Allocation retries and OOMs since the rank's first process, each None while no process of it
        reported that counter; None when neither was ever reported."""
        o = self.offsets
        out = tuple(
            None if last is None and not known else offset + (last or 0.0)
            for offset, last, known in zip((o.alloc_retries, o.ooms), self.alloc, o.alloc_known, strict=True)
        )
        return None if out == (None, None) else (out[0], out[1])


def _point(r: Report) -> Point:
    t = r.totals
    h = r.step_seconds
    m = r.memory
    return Point(
        r.time,
        r.updated,
        t.steps,
        t.tokens,
        t.samples,
        t.requests,
        h.sum,
        h.count,
        # running phases count as far as they have run: a loop hung in data_wait shows 100 % data wait now,
        # not 0 % until the phase ends; a phase's seconds still only grow (the closed total includes them)
        _with_open(r.phases, r.open_phases),
        None if m is None else m.alloc_retries,
        None if m is None else m.ooms,
        r.open_phases,
    )


def _with_open(closed: Mapping[str, float], running: Mapping[str, float]) -> Mapping[str, float]:
    if not running:
        return closed
    return {name: closed.get(name, 0.0) + running.get(name, 0.0) for name in {*closed, *running}}


def _anchor(r: Report) -> Point | None:
    if r.anchor is None or r.anchor_time is None:
        return None
    a = r.anchor
    return Point(r.anchor_time, r.anchor_time, a.steps, a.tokens, a.samples, a.requests, 0.0, 0.0, {})


class JobStore:
    def __init__(self, *, max_jobs: int, max_ranks: int, ttl: float, window: float) -> None:
        self.max_jobs = max_jobs
        self.max_ranks = max_ranks
        self.ttl = ttl
        self.window = window
        self.expired = 0
        self._ranks: dict[tuple[str, int], Rank] = {}
        self._gone: dict[tuple[str, int], tuple[float, Rank]] = {}  # (when it went, the rank) for offsets
        self._expired_at = float("-inf")
        self._lost: dict[str, tuple[int, float]] = {}  # job -> (ranks lost, when the job was last seen)
        # job -> its baseline's step time, for the ledger's slow steps (kept by whoever compares baselines)
        self.baseline_steps: dict[str, float] = {}
        # told of every stored report, after the store let go of its lock (the simulator's driven GPUs)
        self.listeners: list[Callable[[Report], None]] = []
        self._lock = threading.Lock()

    def ingest(self, r: Report, now: float, sender: Peer | None = None) -> None:
        """Store one report, sent by ``sender`` where the kernel said (the unix socket). Raises Stale
        (ignored, 'duplicate'), Conflict, Impostor, LimitExceeded, or ValueError."""
        for which, stamp in (
            ("time", r.time), ("started", r.started), ("updated", r.updated), ("anchor.time", r.anchor_time)
        ):  # fmt: skip
            if stamp is not None and stamp - now > FUTURE_SKEW:
                raise ValueError(
                    f"{which}: {stamp - now:.0f} s ahead of this node's clock (at most {FUTURE_SKEW:g} s "
                    "allowed); is the sending host's clock set?"
                )
        with self._lock:
            if now - self._expired_at >= 1.0:  # a scan of every rank: not per report under a flood
                self._expire(now)
            key = (r.job, r.rank)
            rank = self._ranks.get(key)
            if rank is None:
                self._expire(now)  # new ranks are rare, and the limits must count only live ones
                self._admit(r)
                rank = self._revive(key, r, now, sender)
                self._ranks[key] = rank
            elif r.incarnation != rank.report.incarnation:
                if r.started < rank.report.started:
                    if r.final or r.time < rank.report.started + CONFLICT_GRACE:
                        raise Stale()  # a late report from a process that has since been replaced
                    raise Conflict(_conflict(r, rank.report))
                _check_takeover(rank, r, sender)
                check_growth(None, r)
                _restart(rank)
                rank.sender = sender
            else:
                _check_sender(rank, r, sender)  # before the seq: another process's report is no duplicate
                if r.seq <= rank.report.seq:
                    if r.time > rank.report.time + CONFLICT_GRACE:
                        # a late delivery is older than what is held; a later report with a lower seq
                        # means two senders share this incarnation: say so, rather than drop the live
                        # one's in silence
                        raise Conflict(_shared_incarnation(r, rank.report))
                    raise Stale()
                _check_seq_jump(rank.report, r)
                _check_monotonic(rank.report, r)
                check_growth(rank.report, r)
            rank.offsets, rank.alloc = _track_allocator(rank.offsets.naming(r), rank.alloc, r)
            rank.report = r
            rank.received = now
            rank.ledger.observe(r, self.baseline_steps.get(r.job))
            rank.anchor = rank.anchor or _anchor(r)
            points = rank.points
            points.append(_point(r))
            horizon = r.time - self.window  # the report's own clock, like its points
            while len(points) > 2 and points[1].reported < horizon:
                points.popleft()  # keeps one point before the window, the base for a slow step
        for listener in self.listeners:
            try:
                listener(r)
            except Exception:  # a listener's fault is its own: the report is stored
                log.exception("a report listener failed")

    def _revive(self, key: tuple[str, int], r: Report, now: float, sender: Peer | None) -> Rank:
        """A new rank, or one that went and came back: then its counters continue where they were."""
        fresh = Rank(report=r, received=now, sender=sender)
        went = self._gone.get(key)
        if went is None:
            check_growth(None, r)
            return fresh
        old = went[1]
        if r.incarnation == old.report.incarnation:  # silent past the TTL, then back: the same process
            _check_sender(old, r, sender)
            _check_monotonic(old.report, r)
            check_growth(old.report, r)
            fresh.offsets, fresh.alloc, fresh.sender = old.offsets, old.alloc, old.sender
            fresh.restarts, fresh.ledger = old.restarts, old.ledger
        elif r.started >= old.report.started:
            check_growth(None, r)
            fresh.offsets, fresh.restarts = old.offsets.plus(old.report, old.alloc), old.restarts + 1
            fresh.ledger = old.ledger
        else:  # a late report of a process its successor replaced: the rank's past stays as it was
            raise Stale()
        del self._gone[key]
        return fresh

    def _admit(self, r: Report) -> None:
        jobs = {job for job, _ in self._ranks}
        if r.job not in jobs and len(jobs) >= self.max_jobs:
            raise LimitExceeded(
                "job_limit",
                f"this node already tracks {len(jobs)} jobs (the limit, --max-jobs); job {r.job!r} refused "
                "until one stops reporting",
            )
        if len(self._ranks) >= self.max_ranks:
            raise LimitExceeded(
                "rank_limit",
                f"this node already tracks {len(self._ranks)} ranks (the limit, --max-ranks); "
                f"rank {r.rank} of job {r.job!r} refused until one stops reporting",
            )

    def _expire(self, now: float) -> None:
        self._expired_at = now
        gone = [
            key
            for key, rank in self._ranks.items()
            if now - rank.received > (min(self.ttl, FINISHED_LINGER) if rank.report.final else self.ttl)
        ]
        for key in gone:
            rank = self._ranks.pop(key)
            # a gone rank is kept (RETAIN_OFFSETS) for its counters and ledger alone: its report history (up
            # to MAX_POINTS points, each with its phases) would hold tens of MB over 4 x max_ranks of them,
            # and even an emptied deque keeps a block of its own
            rank.points = _NO_POINTS
            rank.anchor = None
            self._gone[key] = (now, rank)
            if not rank.report.final:
                self._lost[key[0]] = (self._lost.get(key[0], (0, now))[0] + 1, now)
        self.expired += len(gone)
        oldest = min((went for went, _ in self._gone.values()), default=now)
        if gone or len(self._gone) > 4 * self.max_ranks or now - oldest > RETAIN_OFFSETS:
            keep = sorted(self._gone.items(), key=lambda kv: kv[1][0])[-4 * self.max_ranks :]
            self._gone = {k: v for k, v in keep if now - v[0] <= RETAIN_OFFSETS}

    def lost(self, now: float) -> dict[str, int]:
        """Ranks lost per job: every live job (0 until one is lost), and jobs gone within LOST_RETAIN."""
        with self._lock:
            self._expire(now)
            live = {job for job, _ in self._ranks}
            for job in live:
                self._lost[job] = (self._lost.get(job, (0, now))[0], now)
            recent = sorted(self._lost.items(), key=lambda kv: kv[1][1])[-4 * self.max_jobs :]
            self._lost = {j: v for j, v in recent if j in live or now - v[1] <= LOST_RETAIN}
            return {j: n for j, (n, _) in sorted(self._lost.items())}

    def gone_ledgers(self, now: float) -> list[tuple[str, int, LedgerView]]:
        """The ledgers of training ranks that went within RETAIN_OFFSETS, newest max_ranks of them: exported
        frozen, so that when a successor's first report brings a restart's gap, Prometheus already has the
        series it lands on (rate() over a series that appears with a jump sees no increase)."""
        with self._lock:
            self._expire(now)
            gone = sorted(self._gone.items(), key=lambda kv: kv[1][0])[-self.max_ranks :]
            return [
                (job, rank_id, rank.ledger.view())
                for (job, rank_id), (_, rank) in gone
                if rank.report.kind == "train" and rank.ledger.since is not None
            ]

    def retained(self) -> set[tuple[str, int]]:
        """Every (job, rank) whose counters continue if it reports again: the ranks listed and those gone
        whose offsets are kept (at most 5 x max_ranks in all)."""
        with self._lock:
            return set(self._ranks) | set(self._gone)

    def processes(self) -> list[tuple[str, str, int, float | None]]:
        """(job, hostname, pid, process start) of each rank listed whose SDK names its host: what NCCL's
        Inspector dumps join on (gpumon/nccl)."""
        with self._lock:
            return [
                (r.report.job, r.report.hostname, r.report.pid, r.report.process_started)
                for r in self._ranks.values()
                if r.report.hostname is not None
            ]

    def views(self, now: float) -> list[RankView]:
        with self._lock:
            self._expire(now)
            return [
                RankView(
                    rank.report,
                    rank.received,
                    rank.offsets,
                    rank.restarts,
                    tuple(rank.points),
                    rank.anchor,
                    rank.ledger.view(),
                    rank.alloc,
                )
                for rank in sorted(self._ranks.values(), key=lambda x: x.key)
            ]


def _restart(rank: Rank) -> None:
    rank.offsets = rank.offsets.plus(rank.report, rank.alloc)
    rank.alloc = (None, None)
    rank.restarts += 1
    rank.points.clear()
    rank.anchor = None


def _check_sender(rank: Rank, r: Report, sender: Peer | None) -> None:
    """A report of an incarnation comes from the process that sent its first, where the kernel said which:
    another local process that read the incarnation (GET /v1/jobs shows it) and guessed a seq cannot speak
    for it."""
    held = rank.sender
    if held is None or not held.known or held.same(sender):
        return
    who = "a TCP connection" if sender is None else f"pid {sender.pid}" if sender.pid else "another process"
    raise Impostor(
        f"job {r.job!r} rank {r.rank}: incarnation {r.incarnation!r} is pid {held.pid}'s, and this report "
        f"came from {who}; each process reports with an incarnation of its own"
    )


def _check_takeover(rank: Rank, r: Report, sender: Peer | None) -> None:
    """A new incarnation replaces a rank's process only once that process has exited (or finished): while
    it runs, a newcomer is a second process claiming its (job, rank), not its restart."""
    held = rank.sender
    if held is None or not held.known or held.same(sender) or rank.report.final or not held.alive():
        return
    raise Conflict(
        f"job {r.job!r} rank {r.rank} is reported by pid {held.pid}, which is still running; this process "
        f"(pid {r.pid}) can take the rank over once that one has exited, or report under its own job name "
        "(Reporter(job=...) or GPUMON_JOB) or rank"
    )


def _same_process(a: Report, b: Report) -> bool:
    """One pid, and not two processes of other pid namespaces (containers) that each sent their own start
    (only a process's first Reporter sends it; /proc's resolution is 10 ms)."""
    if a.pid != b.pid:
        return False
    return (
        a.process_started is None
        or b.process_started is None
        or abs(a.process_started - b.process_started) < 0.05
    )


def _conflict(r: Report, current: Report) -> str:
    if _same_process(r, current):
        # an SDK that does not share one (job, rank)'s counters in a process, or Reporters given two urls of
        # this daemon
        return (
            f"job {r.job!r} rank {r.rank} is reported by two Reporters in one process (pid {r.pid}): this "
            f"one (incarnation {r.incarnation!r}) and a later one ({current.incarnation!r}); the daemon "
            "takes each Reporter for a process of its own: use one Reporter per (job, rank) in a process "
            "(pass yours to the framework callback as reporter=...)"
        )
    return (
        f"job {r.job!r} rank {r.rank} is also reported by pid {current.pid}, which started later; two live "
        f"processes (this one is pid {r.pid}) cannot share one (job, rank): give each its own job name "
        "(Reporter(job=...) or GPUMON_JOB) or rank"
    )


def _shared_incarnation(r: Report, current: Report) -> str:
    late = (
        f"job {r.job!r} rank {r.rank}: seq {r.seq} is not after {current.seq}, yet this report is "
        f"{r.time - current.time:.0f} s later"
    )
    if _same_process(r, current):
        return (
            f"{late}; two senders in one process (pid {r.pid}) send incarnation {r.incarnation!r} (a copied "
            "Reporter?): each Reporter needs its own incarnation"
        )
    return (
        f"{late}; two processes (pids {r.pid} and {current.pid}) send incarnation {r.incarnation!r}: each "
        "process needs its own Reporter"
    )


def _check_seq_jump(old: Report, new: Report) -> None:
    elapsed = max(0.0, new.time - old.time)
    allowed = SEQ_BURST + SEQ_PER_SECOND * elapsed
    if new.seq - old.seq > allowed:
        raise ValueError(
            f"seq: jumped from {old.seq} to {new.seq} in {elapsed:.0f} s; the SDK numbers its reports one by "
            f"one (at most {allowed:.0f} here)"
        )


def _pairs(old: Report, new: Report) -> list[tuple[str, float, float]]:
    """Every cumulative quantity of a report, old value beside new."""
    pairs = [(f"totals.{n}", getattr(old.totals, n), getattr(new.totals, n)) for n in P.TOTALS]
    pairs.append(("step_seconds.sum", old.step_seconds.sum, new.step_seconds.sum))
    pairs += [
        (f"step_seconds.counts[{i}]", a, b)
        for i, (a, b) in enumerate(zip(old.step_seconds.counts, new.step_seconds.counts, strict=True))
    ]
    if old.request_seconds is not None:
        new_req = new.request_seconds
        pairs.append(("request_seconds.sum", old.request_seconds.sum, new_req.sum if new_req else -1.0))
        for i, a in enumerate(old.request_seconds.counts):
            pairs.append((f"request_seconds.counts[{i}]", a, new_req.counts[i] if new_req else -1.0))
    pairs += [(f"phases.{n}", s, new.phases.get(n, -1.0)) for n, s in old.phases.items()]
    return pairs


def _check_monotonic(old: Report, new: Report) -> None:
    for name, a, b in _pairs(old, new):
        if b < a:
            shown = "missing" if b < 0 else f"{b:g}"
            raise ValueError(
                f"{name} went backwards within one incarnation ({a:g} -> {shown}); every count and time is "
                "cumulative, and a restarted process needs a new incarnation"
            )
