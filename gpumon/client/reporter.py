"""The Reporter: counters a training or serving loop bumps, and a thread that ships them to the node's daemon.

The hot path (step, phase enter/exit, add_phase, request) does no I/O, holds no lock across anything slow,
never touches the GPU and allocates nothing a loop would notice; bad arguments are logged once per kind and
ignored, never raised. Every counter is cumulative, so the sender thread reads them without a lock: a torn
read only makes one report slightly behind the next. Standard library only, Python >= 3.9.
"""

from __future__ import annotations

import atexit
import logging
import math
import numbers
import os
import re
import threading
import time
import weakref
from bisect import bisect_left
from typing import Any, Protocol

from gpumon.client import env as _env
from gpumon.client.protocol import BUCKETS, MAX_PHASES, PHASE_PATTERN, VERSION
from gpumon.client.transport import Sender, Shipper, Transport

log = logging.getLogger("gpumon.client")

_perf = time.perf_counter
_BUCKETS = BUCKETS
_INF = math.inf
_PHASE_RE = re.compile(PHASE_PATTERN)
# for all live Reporters together: interpreter exit must not hang on a dead or slow daemon
AT_EXIT_TIMEOUT = 2.0
_live: weakref.WeakSet[Reporter] = weakref.WeakSet()


class FlopsModel(Protocol):
    def flops_per_token(self, train: bool = True, convention: str = "palm") -> float: ...


class Phase:
    """Times one named phase; Reporter.phase() hands out one cached instance per name. Nesting the same
    phase times only the outermost block. Being shared, it belongs to one thread (the training loop's);
    other threads time themselves and call add_phase()."""

    __slots__ = ("_depth", "_start", "name", "seconds")

    def __init__(self, name: str) -> None:
        self.name = name
        self.seconds = 0.0
        self._depth = 0
        self._start = 0.0

    def __enter__(self) -> Phase:
        if self._depth == 0:
            self._start = _perf()
        self._depth += 1
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        depth = self._depth - 1
        if depth > 0:
            self._depth = depth
        elif depth == 0:
            self._depth = 0
            self.seconds += _perf() - self._start
        # below 0: an exit without its enter (a block entered before a fork, say) is ignored


class NullPhase:
    """What a disabled Reporter, or a bad phase name, hands out."""

    __slots__ = ()

    def __enter__(self) -> NullPhase:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        return None


NULL_PHASE = NullPhase()


def _count(value: object) -> int | float | None:
    """A non-negative finite count from a Python or NumPy number, else None: a tensor too, since reading
    one would synchronise the GPU."""
    try:
        if value.__class__ is bool:
            return None
        if isinstance(value, numbers.Integral):
            number = int(value)
            return number if number >= 0 else None
        if isinstance(value, numbers.Real):
            real = float(value)
            if not 0.0 <= real < _INF:
                return None
            return int(real) if real.is_integer() else real
    except (TypeError, ValueError, OverflowError):
        pass
    return None


def _mistake(value: object) -> str:
    """Which kind of bad number ``value`` is: each kind is logged once per Reporter."""
    if value.__class__ is bool or not isinstance(value, numbers.Real):
        return "not a number"
    try:
        return "negative" if float(value) < 0 else "not finite"
    except (TypeError, ValueError, OverflowError):
        return "not a number"


def _seconds(value: object) -> float | None:
    number = _count(value)
    return None if number is None else float(number)


class Reporter:
    """Counts steps, tokens, samples, requests and phase times; a daemon thread reports them to gpumon.

    The API is documented in gpumon/client/__init__.py. Arguments left None come from the environment
    (gpumon.client.env); a bad one is logged and replaced by its default, never raised.
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
    ) -> None:
        # the hot path's state comes first, so every method works whatever happens below
        self._on = False
        self._closed = False
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
        # one (wall, perf) pair: the hot path reads only perf_counter, reports convert with it
        self._wall0 = time.time()
        self._perf0 = _perf()
        self.started = self._wall0
        self.incarnation = os.urandom(8).hex()
        self.settings = _env.Settings()
        environ = os.environ
        on = enabled if enabled is not None else _env.env_flag(environ.get("GPUMON_REPORT"))
        if on is False:
            return
        try:
            self.settings, problems = _env.resolve(
                environ, job, rank, world_size, local_rank, device, kind, workload, dtype, flops_per_token,
                model, flops_convention, peak_flops, url, token, interval,
            )  # fmt: skip
            for problem in problems:
                log.warning("gpumon: %s", problem)
            transport = Transport(self.settings.url, self.settings.token)
        except Exception:
            log.warning("gpumon: reporting is off: the Reporter could not be set up", exc_info=True)
            return
        self._shipper = Shipper(Sender(transport, self.settings.interval), self._report)
        self._on = True
        _live.add(self)
        # started now rather than at the first step: the daemon learns this rank, its pid and its GPUs while
        # the model loads, so a rank stuck before its first step shows; and the hot path needs no check
        self._shipper.start()

    # ---- hot path: one training-loop thread calls step() and times phases --------------------------------

    def step(self, tokens: float = 0, samples: float = 0) -> None:
        """One optimizer step that processed ``tokens`` tokens and ``samples`` samples on this rank."""
        if not self._on:
            return
        if tokens.__class__ is not int or samples.__class__ is not int or tokens < 0 or samples < 0:
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

    def add_phase(self, name: str, seconds: float) -> None:
        """Add ``seconds`` the caller timed itself to phase ``name``; safe from any thread."""
        if not self._on:
            return
        if seconds.__class__ is not float or not 0.0 <= seconds < _INF:
            checked = _seconds(seconds)
            if checked is None:
                why = _mistake(seconds)
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
        if tokens.__class__ is not int or tokens < 0:
            checked = _count(tokens)
            if checked is None:
                why = _mistake(tokens)
                self._warn("request.tokens " + why, "request(tokens=%r) ignored: %s", tokens, why)
                return
            tokens = checked
        if latency is not None and (latency.__class__ is not float or not 0.0 <= latency < _INF):
            checked_latency = _seconds(latency)
            if checked_latency is None:
                why = _mistake(latency)
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
        good_tokens, good_samples = _count(tokens), _count(samples)
        if good_tokens is None or good_samples is None:
            name, bad = ("tokens", tokens) if good_tokens is None else ("samples", samples)
            why = _mistake(bad)
            self._warn(
                f"step.{name} {why}",
                "step(%s=%r) ignored: %s; counts must be finite Python or NumPy numbers >= 0 (not tensors: "
                "reading one synchronises the GPU). Further calls with this mistake are ignored silently",
                name,
                bad,
                why,
            )
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
        return self._on

    @property
    def totals(self) -> dict[str, Any]:
        """A copy of the cumulative totals, with "phases": {name: seconds}."""
        t = self._t
        phases = {name: found.seconds for name, found in self._phases.items()}
        return {"steps": t[0], "tokens": t[1], "samples": t[2], "requests": t[3], "phases": phases}

    def _report(self, final: bool) -> dict[str, Any]:
        """The report, but its seq (the sender numbers what it sends)."""
        t = self._t  # first, and in one read: totals and "updated" agree
        anchor = self._anchor
        phases = {name: found.seconds for name, found in self._phases.items()}
        cfg = self.settings
        requests = None
        if cfg.kind == "inference" or t[3]:
            requests = {"counts": list(self._request_counts), "sum": self._request_sum}
        report = {
            "v": VERSION,
            "job": cfg.job,
            "rank": cfg.rank,
            "world_size": cfg.world_size,
            "local_rank": cfg.local_rank,
            "kind": cfg.kind,
            "workload": cfg.workload,
            "incarnation": self.incarnation,
            "pid": os.getpid(),
            "seq": 0,
            "time": time.time(),
            "started": self.started,
            "devices": list(cfg.devices),
            "dtype": cfg.dtype,
            "flops_per_token": cfg.flops_per_token,
            "flops_convention": cfg.flops_convention,
            "peak_flops": cfg.peak_flops,
            "totals": {"steps": t[0], "tokens": t[1], "samples": t[2], "requests": t[3]},
            "updated": None if t[4] is None else self._wall(t[4]),
            "anchor": None,
            "step_seconds": {"counts": list(self._step_counts), "sum": self._step_sum},
            "request_seconds": requests,
            "phases": phases,
            "final": final,
        }
        if anchor is not None:
            keys = ("steps", "tokens", "samples", "requests")
            report["anchor"] = {"time": anchor[0], **{key: anchor[i + 1] for i, key in enumerate(keys)}}
        return report

    def flush(self, timeout: float = 2.0) -> bool:
        """Send a report now, from the caller's thread; True when the daemon accepted it."""
        shipper = self._shipper
        return self._on and shipper is not None and shipper.flush(timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Send the final report and stop the thread, within ``timeout`` seconds; later calls do nothing."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._on = False
        _live.discard(self)
        if self._shipper is not None:
            self._shipper.close(timeout)

    def _forked(self) -> None:
        """In a forked child (a DataLoader worker) the parent goes on reporting and this copy goes quiet: no
        thread, no reports. The parent's threads may have held the locks at fork time, so they are replaced;
        the inherited connection is dropped without a byte sent on it."""
        self._on = False
        self._closed = True
        self._shipper = None
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "on" if self._on else "off"
        return f"<Reporter job={self.settings.job} rank={self.settings.rank} {state}>"


def _close_all() -> None:
    deadline = time.monotonic() + AT_EXIT_TIMEOUT
    for reporter in list(_live):
        reporter.close(timeout=max(0.0, deadline - time.monotonic()))


def _after_fork_in_child() -> None:
    for reporter in list(_live):
        reporter._forked()
    _live.clear()


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
