"""The Reporter: counters a training or serving loop bumps, and a thread that ships them to the node's daemon.

The hot path (step, phase enter/exit, add_phase, request) does no I/O, holds no lock across anything slow,
never touches the GPU and allocates nothing a loop would notice; bad arguments are logged once per kind and
ignored, never raised. Every counter is cumulative, so the sender thread reads them without a lock: a torn
read only makes one report slightly behind the next. Standard library only.

Around it: phases.py (phase timers), counts.py (number checks), settings.py (constructor arguments),
report.py (wire format), lifecycle.py (interpreter exit, fork), transport.py (the sender thread).

One (job, rank) has one set of counters per process. The daemon keys a rank by (job, rank) and takes each
Reporter for a process of its own: two Reporters of one rank in one process (the loop's own and a framework
callback's, say) would make it count a restart that never happened, refuse the older one's reports with 409
and lose its steps. So a Reporter made while a live one of the same (daemon URL, job, rank) exists in this
process is a second handle on that one: its calls count into the first's counters, one sender reports them,
and the last of the handles to be closed sends the final report.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from gpumon.client import lifecycle
from gpumon.client.counts import COUNT_HINT, as_count, as_seconds, mistake
from gpumon.client.lifecycle import AT_EXIT_TIMEOUT
from gpumon.client.phases import NULL_PHASE, NullPhase, Phase
from gpumon.client.process.allocator import AllocatorReader
from gpumon.client.process.start import claim_process_start
from gpumon.client.protocol import BUCKETS, MAX_PER_CALL, MAX_PER_CALL_SECONDS, MAX_PHASES, PHASE_PATTERN
from gpumon.client.rankstate import StateFile, read_predecessor, state_path
from gpumon.client.report import build_report, extend
from gpumon.client.settings import FlopsModel, Settings, check_step, env_flag, resolve
from gpumon.client.transport import Sender, Shipper, Transport

# the public names; several are defined in phases.py, lifecycle.py and settings.py
__all__ = ["AT_EXIT_TIMEOUT", "NULL_PHASE", "FlopsModel", "NullPhase", "Phase", "Reporter"]

log = logging.getLogger("gpumon.client")

# bound to module globals so the hot path skips an attribute lookup per call
_perf = time.perf_counter
_BUCKETS = BUCKETS
_MAX_CALL = MAX_PER_CALL
_MAX_SECONDS = MAX_PER_CALL_SECONDS
_PHASE_RE = re.compile(PHASE_PATTERN)

# the live Reporter of each (url, job, rank) in this process: the one later Reporters of that rank share
_ranks: dict[tuple[str, str, int], weakref.ref[Reporter]] = {}
# re-entrant: a finalizer (a Reporter dropped unclosed) may run on a thread that holds it
_ranks_lock = threading.RLock()
# set while a framework callback makes its Reporter: sharing the loop's own is then what was asked for
_callback = threading.local()
# what a second handle calls on the first: the hot path and the calls that act on the counters
_SHARED_CALLS = (
    "step", "phase", "data_wait", "forward_backward", "communication", "optimizer", "checkpoint",
    "evaluation", "add_phase", "request", "resume", "flush",
)  # fmt: skip
# settings a second handle may ask for differently, and does not get (the first's are sent)
_SETTINGS_COMPARED = (
    "world_size", "local_rank", "devices", "kind", "workload", "dtype", "flops_per_token",
    "flops_convention", "peak_flops", "token", "interval", "setup",
)  # fmt: skip


class Reporter:
    """Counts steps, tokens, samples, requests and phase times; a daemon thread reports them to gpumon.

    The API is documented in gpumon/client/__init__.py. Arguments left None come from the environment
    (gpumon.client.settings); a bad one is logged and replaced by its default, never raised.
    """

    def __init__(
        self,
        job: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        device: object = None,
        kind: str = "train",
        workload: str | None = None,
        dtype: object = None,
        flops_per_token: float | None = None,
        model: FlopsModel | None = None,
        flops_convention: str | None = None,
        peak_flops: float | None = None,
        url: str | None = None,
        token: str | None = None,
        interval: float | None = None,
        enabled: bool | None = None,
        resumed_step: int | None = None,
        micro_batch: int | None = None,
        zero_stage: int | None = None,
        setup: dict[str, Any] | None = None,
        state_dir: str | None = None,
    ) -> None:
        # the hot path's state comes first, so every method works whatever happens below
        self._on = False
        self._closed = False
        self._fork_copy = False  # the quiet copy a forked child inherits (_forked)
        # steps, tokens, samples, requests, perf_counter of the last change: one tuple, read in one go
        self._t: tuple[Any, ...] = (0, 0, 0, 0, None)
        self._last_step: float | None = None
        self._anchor: tuple[Any, ...] | None = None
        self._step_counts = [0] * (len(BUCKETS) + 1)
        self._step_sum = 0.0
        self._request_counts = [0] * (len(BUCKETS) + 1)
        self._request_sum = 0.0
        # replaced, never mutated, so the sender can iterate it while the loop adds a phase
        self._phases: dict[str, Phase] = {}
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._warned: set[str] = set()
        self._shipper: Shipper | None = None
        # the Reporter whose counters this one counts into: itself, or the first of its (job, rank) here
        self._core: Reporter = self
        self._holders = 1  # handles on these counters not yet closed (the core's own count)
        self._released = False  # this handle was closed
        # one (wall, perf) pair: the hot path reads only perf_counter, reports convert with it
        self._wall0 = time.time()
        self._perf0 = _perf()
        self.started = self._wall0
        self.incarnation = os.urandom(8).hex()
        self.settings = Settings()
        self.process_started: float | None = None
        self._memory: dict[str, Any] | None = None  # the latest allocator reading
        self._state: StateFile | None = None  # the rank's state file, with a state directory
        # what the sender thread reads the allocator with (the report's "memory"); the simulator's ranks
        # put their own here
        self.memory_source: Callable[[], dict[str, Any] | None] | None = None
        environ = os.environ
        on = enabled if enabled is not None else env_flag(environ.get("GPUMON_REPORT"))
        if on is False:
            return
        try:
            self.settings, problems = resolve(
                environ, job, rank, world_size, local_rank, device, kind, workload, dtype, flops_per_token,
                model, flops_convention, peak_flops, url, token, interval, resumed_step, micro_batch,
                zero_stage, setup, state_dir,
            )  # fmt: skip
            for problem in problems:
                log.warning("gpumon: %s", problem)
            key = (self.settings.url, self.settings.job, self.settings.rank)
            with _ranks_lock:
                ref = _ranks.get(key)
                first = ref() if ref is not None else None
                if first is not None and first._on and not first._closed:
                    first._holders += 1
                else:
                    first = None
                    transport = Transport(self.settings.url, self.settings.token)
                    # claimed only by a Reporter that will report: a failed one must not take the process's
                    # start
                    self.process_started = claim_process_start()
                    reader = AllocatorReader(self.settings.cuda_ordinal, self.settings.local_rank)
                    self.memory_source = reader.read
                    if self.settings.state_dir is not None:
                        path = state_path(self.settings.state_dir, self.settings.job, self.settings.rank)
                        found = read_predecessor(path, self.incarnation, time.time())
                        self._state = StateFile(path, self.incarnation, found)
                    _ranks[key] = weakref.ref(self)
        except Exception:
            log.warning("gpumon: reporting is off: the Reporter could not be set up", exc_info=True)
            return
        if first is not None:
            self._share(first)
            return
        self._shipper = Shipper(Sender(transport, self.settings.interval), self._report)
        self._on = True
        lifecycle.track(self)
        # started now rather than at the first step: the daemon learns this rank, its pid and its GPUs while
        # the model loads, so a rank stuck before its first step shows; and the hot path needs no check
        self._shipper.start()

    def _share(self, first: Reporter) -> None:
        """Become a second handle on ``first``, the live Reporter of this (job, rank) in this process: every
        call counts into its counters (bound to its methods, so the hot path costs what it costs there)."""
        mine, theirs = self.settings, first.settings
        differ = [name for name in _SETTINGS_COMPARED if getattr(mine, name) != getattr(theirs, name)]
        self._core = first
        self.settings, self.incarnation, self.started = theirs, first.incarnation, first.started
        self.process_started = first.process_started
        for name in _SHARED_CALLS:
            setattr(self, name, getattr(first, name))
        self._on = True
        if mine.resumed_step is not None:  # the checkpoint this process loaded, whichever handle knows it
            first.resume(mine.resumed_step)
        ignored = f"; its own {', '.join(differ)} ignored" if differ else ""
        if getattr(_callback, "sharing", False):
            log.info(
                "gpumon: the callback reports through this process's Reporter for job %r rank %d%s",
                theirs.job, theirs.rank, ignored,
            )  # fmt: skip
        else:
            log.warning(
                "gpumon: a second Reporter for job %r rank %d in this process (pid %d) shares the first "
                "one's counters and sender (the daemon takes each Reporter for a process of its own)%s; "
                "the last one closed sends the final report",
                theirs.job, theirs.rank, os.getpid(), ignored,
            )  # fmt: skip

    # ---- hot path: one training-loop thread calls step() and times phases --------------------------------

    def step(self, tokens: float = 0, samples: float = 0) -> None:
        """One optimizer step that processed ``tokens`` tokens and ``samples`` samples on this rank."""
        if not self._on:
            if self._fork_copy:
                self._warn(
                    "forked",
                    "step() in a forked child (pid %d) of the process that made this Reporter: its steps are "
                    "not reported (the parent's Reporter does); train in the parent, or make a Reporter in "
                    "the child (spawn, not fork)",
                    os.getpid(),
                )
            return
        if (
            tokens.__class__ is not int
            or samples.__class__ is not int
            or not 0 <= tokens <= _MAX_CALL
            or not 0 <= samples <= _MAX_CALL
        ):
            checked = self._check_counts(tokens, samples)
            if checked is None:
                return
            tokens, samples = checked
        now = _perf()
        last = self._last_step
        self._last_step = now
        t = self._t
        self._t = (t[0] + 1, t[1] + tokens, t[2] + samples, t[3], now)
        if last is not None:
            elapsed = now - last
            self._step_counts[bisect_left(_BUCKETS, elapsed)] += 1
            self._step_sum += elapsed
        elif self._anchor is None:
            self._set_anchor()

    def phase(self, name: str) -> Phase | NullPhase:
        """The cached context manager timing phase ``name`` (one of protocol.PHASES, or a custom name)."""
        if not self._on:
            return NULL_PHASE
        try:
            found = self._phases.get(name)
        except TypeError:
            found = None
        return found if found is not None else (self._new_phase(name) or NULL_PHASE)

    def data_wait(self) -> Phase | NullPhase:
        return self.phase("data_wait")

    def forward_backward(self) -> Phase | NullPhase:
        return self.phase("forward_backward")

    def communication(self) -> Phase | NullPhase:
        return self.phase("communication")

    def optimizer(self) -> Phase | NullPhase:
        return self.phase("optimizer")

    def checkpoint(self) -> Phase | NullPhase:
        return self.phase("checkpoint")

    def evaluation(self) -> Phase | NullPhase:
        return self.phase("evaluation")

    def resume(self, step: int) -> None:
        """This process resumed from global step ``step`` (the checkpoint it loaded): its steps continue from
        there, and those up to the rank's earlier high-water mark count as redone. Call it before the first
        step(), or pass Reporter(resumed_step=...)."""
        if not self._on:
            return
        problems: list[str] = []
        checked = check_step(step, problems)
        if checked is None:
            self._warn("resume", "resume(%r) ignored: %s", step, problems[0] if problems else "None")
            return
        self.settings.resumed_step = checked

    def add_phase(self, name: str, seconds: float) -> None:
        """Add ``seconds`` the caller timed itself to phase ``name``; safe from any thread."""
        if not self._on:
            return
        if seconds.__class__ is not float or not 0.0 <= seconds <= _MAX_SECONDS:
            checked = as_seconds(seconds)
            if checked is None:
                why = mistake(seconds)
                self._warn("add_phase.seconds " + why, "add_phase(%r, %r) ignored: %s", name, seconds, why)
                return
            seconds = checked
        try:
            found = self._phases.get(name)
        except TypeError:
            found = None
        if found is None:
            found = self._new_phase(name)
            if found is None:
                return
        with self._lock:
            found.seconds += seconds

    def request(self, tokens: float = 0, latency: float | None = None) -> None:
        """One served request: ``tokens`` generated, ``latency`` seconds end to end; safe from any thread."""
        if not self._on:
            return
        if tokens.__class__ is not int or not 0 <= tokens <= _MAX_CALL:
            checked = as_count(tokens)
            if checked is None:
                why = mistake(tokens)
                self._warn("request.tokens " + why, "request(tokens=%r) ignored: %s", tokens, why)
                return
            tokens = checked
        if latency is not None and (latency.__class__ is not float or not 0.0 <= latency <= _MAX_SECONDS):
            checked_latency = as_seconds(latency)
            if checked_latency is None:
                why = mistake(latency)
                self._warn("request.latency " + why, "request(latency=%r) ignored: %s", latency, why)
                return
            latency = checked_latency
        now = _perf()
        with self._lock:
            t = self._t
            self._t = (t[0], t[1] + tokens, t[2], t[3] + 1, now)
            if latency is not None:
                self._request_counts[bisect_left(_BUCKETS, latency)] += 1
                self._request_sum += latency
        if self._anchor is None:
            self._set_anchor()

    def _check_counts(self, tokens: object, samples: object) -> tuple[int | float, int | float] | None:
        good_tokens, good_samples = as_count(tokens), as_count(samples)
        if good_tokens is None or good_samples is None:
            name, bad = ("tokens", tokens) if good_tokens is None else ("samples", samples)
            why = mistake(bad)
            self._warn(f"step.{name} {why}", "step(%s=%r) ignored: %s; " + COUNT_HINT, name, bad, why)
            return None
        return good_tokens, good_samples

    def _new_phase(self, name: object) -> Phase | None:
        if not isinstance(name, str) or not _PHASE_RE.match(name):
            self._warn("phase.name", "phase %r ignored: names must match %s", name, PHASE_PATTERN)
            return None
        with self._lock:
            found = self._phases.get(name)
            if found is None:
                if len(self._phases) >= MAX_PHASES:
                    self._warn("phase.count", "phase %r ignored: at most %d phases", name, MAX_PHASES)
                    return None
                found = Phase(name)
                self._phases = {**self._phases, name: found}
            return found

    def _set_anchor(self) -> None:
        t = self._t
        self._anchor = (self._wall(t[4]), t[0], t[1], t[2], t[3])

    def _warn(self, kind: str, message: str, *args: object, exc_info: bool = False) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("gpumon: " + message, *args, exc_info=exc_info)

    def _wall(self, perf: float) -> float:
        return self._wall0 + (perf - self._perf0)

    # ---- reports -------------------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self._on and self._core._on and not self._released

    @property
    def shares_with(self) -> Reporter | None:
        """The first Reporter of this (job, rank) in this process, when this one is a second handle on it."""
        core = self._core
        return None if core is self else core

    @property
    def totals(self) -> dict[str, Any]:
        """A copy of the cumulative totals (a second handle's are the first's), "phases": {name: seconds}."""
        core = self._core
        t = core._t
        phases = {name: found.seconds for name, found in core._phases.items()}
        return {"steps": t[0], "tokens": t[1], "samples": t[2], "requests": t[3], "phases": phases}

    def _report(self, final: bool) -> dict[str, Any]:
        """The report, but its seq (the sender numbers what it sends)."""
        # The training thread keeps counting while this runs (no lock on the hot path), so the order of
        # reads matters: histograms, then the anchor, then the totals. Everything read later has grown at
        # least as much, so the report never shows more observations than steps or an anchor above the
        # totals, which the daemon would refuse.
        steps = {"counts": list(self._step_counts), "sum": self._step_sum}
        request_counts, request_sum = list(self._request_counts), self._request_sum
        anchor = self._anchor
        t = self._t  # one read: totals and "updated" agree
        phases = {}
        open_phases = {}
        for name, found in self._phases.items():
            # seconds before depth and start: a phase left in between is then under-counted for one report,
            # never counted twice
            phases[name] = found.seconds
            if found._depth > 0:
                running = _perf() - found._start
                if running > 0.0:
                    open_phases[name] = min(running, _MAX_SECONDS)
        requests = None
        if self.settings.kind == "inference" or t[3]:
            requests = {"counts": request_counts, "sum": request_sum}
        updated = None if t[4] is None else self._wall(t[4])
        # "time" on the same clock as "updated" (wall time at start plus perf_counter since), so the
        # daemon's idea of how long ago the last step was survives a wall-clock step
        now = self._wall(_perf())
        report = build_report(
            self.settings,
            self.incarnation,
            self.started,
            now,
            t,
            updated,
            anchor,
            steps,
            requests,
            phases,
            final,
        )
        extend(report, self.settings, self.process_started, open_phases, self._read_memory())
        state = self._state
        if state is not None:
            if state.predecessor is not None:
                report["predecessor"] = state.predecessor
            state.update(self.settings.resumed_step, t[0], updated, final)
        return report

    def _read_memory(self) -> dict[str, Any] | None:
        """The allocator, read on the sender thread only (flush() and close() run on the caller's, which may
        be the training loop's: they send the latest reading)."""
        shipper, source = self._shipper, self.memory_source
        if shipper is not None and source is not None and threading.current_thread() is shipper.thread:
            self._memory = source()
        return self._memory

    def flush(self, timeout: float = 2.0) -> bool:
        """Send a report now, from the caller's thread; True when the daemon accepted it."""
        shipper = self._shipper
        return self._on and shipper is not None and shipper.flush(timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Send the final report and stop the thread, within ``timeout`` seconds; later calls do nothing.
        A handle sharing its counters with others (see the module's docstring) only lets go of them: the
        last one closed sends the final report."""
        with self._close_lock:
            if self._released:
                return
            self._released = True
        core = self._core
        if core is not self:
            for name in _SHARED_CALLS:  # this handle's calls do nothing from now on, as a closed Reporter's
                self.__dict__.pop(name, None)
            self._on = False
        if core._let_go():
            core._shutdown(timeout)

    def _let_go(self) -> bool:
        """One handle on these counters was closed; True when it was the last."""
        with _ranks_lock:
            self._holders -= 1
            return self._holders <= 0

    def _shutdown(self, timeout: float) -> None:
        """Send the final report and stop the thread, whoever still holds a handle (interpreter exit)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._on = False
        self._unregister()
        lifecycle.forget(self)
        if self._shipper is not None:
            self._shipper.close(timeout)

    def _unregister(self) -> None:
        with _ranks_lock:
            key = (self.settings.url, self.settings.job, self.settings.rank)
            ref = _ranks.get(key)
            if ref is not None and ref() in (self, None):
                del _ranks[key]

    def __del__(self) -> None:
        # Collected without close(): the usual ``def main(): r = Reporter(...); train(r)`` drops it when
        # main() returns, before the exit hooks run. Its last counts and a final report are still owed
        # (without one the daemon counts the rank lost); building the report is cheap and the sender thread
        # sends it, so the thread dropping the last reference never waits, and the exit hooks wait for it.
        try:
            core = self._core
            if core is not self:
                # a second handle dropped unclosed lets go of the counters; when it held them last, the
                # first's own handle was closed already and the first has only this one left to keep it
                if not self._released and core._let_go():
                    core._orphan()
                return
            self._orphan()
        except Exception:
            pass  # a finalizer must not raise (at interpreter teardown the modules may be half gone)

    def _orphan(self) -> None:
        """The final report, handed to the sender thread to send: no waiting on the caller's thread."""
        shipper = self._shipper
        if self._on and not self._closed and shipper is not None:
            self._closed = True
            self._on = False
            # the dict may be half gone at interpreter teardown; the rank's next Reporter must not share
            # this one's ended counters
            self._unregister()
            shipper.orphan(self._report(True))
            lifecycle.orphaned(shipper)

    def _forked(self) -> None:
        """In a forked child (a DataLoader worker) the parent goes on reporting and this copy goes quiet: no
        thread, no reports. The parent's threads may have held the locks at fork time, so they are replaced;
        the inherited connection is dropped without a byte sent on it."""
        self._on = False
        self._closed = True
        self._fork_copy = True
        if self._shipper is not None:
            # dropping the reference is not enough: the parent's sender thread, frozen in the child mid-call,
            # keeps the socket referenced, and the worker would hold the parent's connection open for life
            self._shipper.sender.transport.abandon()
        self._shipper = None
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "on" if self.enabled else "off"
        shared = "" if self._core is self else " shared"
        return f"<Reporter job={self.settings.job} rank={self.settings.rank} {state}{shared}>"


def callback_reporter(**kwargs: Any) -> Reporter:
    """The Reporter a framework callback makes for itself: a second handle on this process's live Reporter
    of the same (job, rank) if there is one (the loop's own), which is then what was asked for: an info line
    says so, not a warning."""
    _callback.sharing = True
    try:
        return Reporter(**kwargs)
    finally:
        _callback.sharing = False


def _forget_ranks_in_child() -> None:
    """A forked child's Reporters are disabled copies (lifecycle.py): its own new ones share none of them.
    The lock may have been held by a parent's thread at the fork."""
    global _ranks_lock
    _ranks.clear()
    _ranks_lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_ranks_in_child)
