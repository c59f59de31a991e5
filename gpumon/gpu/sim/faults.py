"""Fault injection for the simulated NVML: lost GPUs, NVML errors, hung and slow calls, unsupported calls.

A fault applies to one GPU (or all), one NVML function (or any), during a window of simulated time. The
textual form used by ``--sim-fault`` is ``KIND[:GPU[:OP[=ARG]]][@START[+DURATION]]``, for example
``lost:3@10+30`` (GPU 3 lost from t=10 s for 30 s), ``hang:2:nvmlDeviceGetTemperature@5`` (that call hangs
on GPU 2 from t=5 s on), ``error:1:nvmlDeviceGetTemperature=Unknown`` or ``slow:*:*=0.02``.
``xid:GPU:CODE@START`` delivers one XID event to the NVML event watcher, e.g. ``xid:3:79@10``.
``slowdown:GPU=FACTOR@START+DURATION`` makes the GPU itself run FACTOR times slower (clocks down, hardware
slowdown reasons raised; dynamics.py and jobs.py read it), e.g. ``slowdown:3=2@60+120``. Its calls are
untouched, so it is kept apart from the call faults: its windows are recorded when it is added, and a
removed one is closed rather than forgotten, so a job's progress never runs backwards.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import pynvml

KINDS = ("lost", "hang", "error", "unsupported", "slow", "uninitialized", "xid", "slowdown")
# kinds that are one-shot events delivered through NVML event sets, not call failures
EVENT_KINDS = ("xid",)
# kinds that change what the GPU does, not how its calls answer
STATE_KINDS = ("slowdown",)
DEFAULT_SLOWDOWN = 2.0
Window = tuple[float, float, float]  # a slowdown's (start, end, factor)
MAX_SLOWDOWN = 100.0

_WHEN = r"(?:@(?P<start>\d+(?:\.\d+)?)(?:\+(?P<duration>\d+(?:\.\d+)?))?)?$"
_SLOWDOWN = re.compile(r"^slowdown(?::(?P<gpu>\*|\d+))?(?:=(?P<factor>\d+(?:\.\d+)?))?" + _WHEN)
_SPEC = re.compile(
    r"^(?P<kind>[a-z]+)(?::(?P<gpu>\*|\d+)(?::(?P<op>\*|nvml\w+|\d+)(?:=(?P<arg>[\w.]+))?)?)?" + _WHEN
)


class FaultSpecError(ValueError):
    pass


def error_code(name: str) -> int:
    """``"Unknown"`` or ``"GpuIsLost"`` or ``"999"`` → the NVML return code."""
    if name.isdigit():
        return int(name)
    for code, cls in pynvml.NVMLError._valClassMapping.items():
        if cls.__name__ == f"NVMLError_{name}":
            return code
    raise FaultSpecError(
        f"unknown NVML error {name!r}: use a class suffix such as Unknown, Timeout, GpuIsLost"
    )


@dataclass(eq=False)  # identity matters: two equal faults are still two faults
class Fault:
    kind: str
    gpu: int | None = None  # None: every GPU
    op: str | None = None  # None: every device call
    start: float = 0.0
    duration: float | None = None  # None: until cleared
    error: int = pynvml.NVML_ERROR_UNKNOWN
    delay: float = 0.0
    xid: int = 0  # for kind "xid": the code delivered once at ``start``
    factor: float = 1.0  # for kind "slowdown": how many times slower the GPU runs

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FaultSpecError(f"unknown fault kind {self.kind!r}; one of {', '.join(KINDS)}")

    def active(self, t: float) -> bool:
        return t >= self.start and (self.duration is None or t < self.start + self.duration)

    def matches(self, op: str, gpu: int | None) -> bool:
        # a fault for one GPU never touches node-level calls (gpu None), such as nvmlInit
        return (self.op is None or self.op == op) and (self.gpu is None or self.gpu == gpu)

    @classmethod
    def parse(cls, text: str) -> Fault:
        if re.match(r"^slowdown\b", text.strip()):  # its =FACTOR follows the GPU, not an OP
            return cls._slowdown(text)
        m = _SPEC.match(text.strip())
        if not m:
            raise FaultSpecError(
                f"bad fault {text!r}: expected KIND[:GPU[:OP[=ARG]]][@START[+DURATION]], e.g. lost:3@10+30"
            )
        kind = m["kind"]
        if kind == "xid":
            if m["gpu"] in (None, "*") or m["op"] is None or not m["op"].isdigit() or m["arg"]:
                raise FaultSpecError(f"bad fault {text!r}: an XID is xid:GPU:CODE[@START], e.g. xid:3:79@10")
            return cls(kind=kind, gpu=int(m["gpu"]), start=float(m["start"] or 0.0), xid=int(m["op"]))
        if m["op"] is not None and m["op"].isdigit():
            raise FaultSpecError(
                f"bad fault {text!r}: OP is an NVML function name such as nvmlDeviceGetPowerUsage"
            )
        fault = cls(
            kind=kind,
            gpu=None if m["gpu"] in (None, "*") else int(m["gpu"]),
            op=None if m["op"] in (None, "*") else m["op"],
            start=float(m["start"] or 0.0),
            duration=None if m["duration"] is None else float(m["duration"]),
        )
        arg = m["arg"]
        if kind == "error" and arg:
            fault.error = error_code(arg)
        elif kind == "slow":
            try:
                fault.delay = float(arg or "0.02")
            except ValueError:
                raise FaultSpecError(f"bad fault {text!r}: slow takes a delay in seconds") from None
        elif arg:
            raise FaultSpecError(f"bad fault {text!r}: {kind} takes no =ARG")
        return fault

    @classmethod
    def _slowdown(cls, text: str) -> Fault:
        m = _SLOWDOWN.match(text.strip())
        factor = float(m["factor"] or DEFAULT_SLOWDOWN) if m else 0.0
        if not m or not 1.0 < factor <= MAX_SLOWDOWN:
            raise FaultSpecError(
                f"bad fault {text!r}: a slowdown is slowdown:GPU=FACTOR[@START[+DURATION]] with FACTOR "
                f"above 1 and at most {MAX_SLOWDOWN:g}, e.g. slowdown:3=2@60+120"
            )
        return cls(
            kind="slowdown",
            gpu=None if m["gpu"] in (None, "*") else int(m["gpu"]),
            start=float(m["start"] or 0.0),
            duration=None if m["duration"] is None else float(m["duration"]),
            factor=factor,
        )


_ERRORS = {
    "lost": pynvml.NVML_ERROR_GPU_IS_LOST,
    "uninitialized": pynvml.NVML_ERROR_UNINITIALIZED,
    "unsupported": pynvml.NVML_ERROR_NOT_SUPPORTED,
}


def _error(fault: Fault) -> int | None:
    """The NVML return code a fault makes a call fail with; None for faults that only slow or hang it."""
    return int(fault.error) if fault.kind == "error" else _ERRORS.get(fault.kind)


class Faults:
    """The active fault set of one simulated NVML. Thread-safe: the sampler calls from many threads."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._faults: list[Fault] = []
        # slowdown fault → (start, end) of its effect, fixed when added and closed when removed: never
        # earlier than the moment it was added, so a fault added late cannot rewrite the past
        self._slowdowns: dict[Fault, tuple[float, float]] = {}
        self._changed = threading.Condition()
        self.latency: dict[str, float] = {}  # per-function latency; key "*" for every other call

    def add(self, fault: Fault | str) -> Fault:
        if isinstance(fault, str):
            fault = Fault.parse(fault)
        with self._changed:
            self._faults = [*self._faults, fault]
            if fault.kind in STATE_KINDS:
                end = math.inf if fault.duration is None else fault.start + fault.duration
                self._slowdowns = {**self._slowdowns, fault: (max(fault.start, self._now()), end)}
            self._changed.notify_all()
        return fault

    def remove(self, fault: Fault) -> None:
        with self._changed:
            self._faults = [f for f in self._faults if f is not fault]
            self._close_slowdowns([fault])
            self._changed.notify_all()

    def clear(self) -> None:
        """Remove every fault and release every hung call."""
        with self._changed:
            self._close_slowdowns(self._faults)
            self._faults = []
            self._changed.notify_all()

    def _close_slowdowns(self, removed: Collection[Fault]) -> None:
        now = self._now()
        windows = dict(self._slowdowns)
        for f in removed:
            if f in windows:
                start, end = windows[f]
                windows[f] = (start, max(start, min(end, now)))
        self._slowdowns = windows

    def slowdown_windows(self, gpus: Collection[int], offset: float = 0.0) -> list[Window]:
        """(start, end, factor) of every slowdown, past or present, on any of ``gpus``; times shifted by
        ``offset`` (the simulator's warm-up), end ``inf`` while open."""
        return [
            (start + offset, end + offset, f.factor)
            for f, (start, end) in self._slowdowns.items()
            if end > start and (f.gpu is None or f.gpu in gpus)
        ]

    def slowdown(self, gpu: int, t: float) -> float:
        """How many times slower ``gpu`` runs at ``t`` (seconds since start): 1.0 when it is not slowed."""
        factor = 1.0
        for f, (start, end) in self._slowdowns.items():
            if start <= t < end and (f.gpu is None or f.gpu == gpu):
                factor = max(factor, f.factor)
        return factor

    def check(self, op: str, gpu: int | None) -> None:
        """Called on entry to every simulated NVML function: sleeps, hangs or raises as the faults say."""
        delay = self.latency.get(op, self.latency.get("*", 0.0))
        faults = self._faults  # copy-on-write list: reading it needs no lock
        if faults:
            t = self._now()
            for f in faults:
                if f.kind in EVENT_KINDS or f.kind in STATE_KINDS or not (f.matches(op, gpu) and f.active(t)):
                    continue
                if f.kind == "slow":
                    delay += f.delay
                elif f.kind == "hang":
                    self._hang(f)
                elif (error := _error(f)) is not None:
                    raise pynvml.NVMLError(error)
        if delay > 0.0:
            time.sleep(delay)

    def error_for(self, op: str, gpu: int | None) -> int | None:
        """The NVML error a call would raise now (for a field that carries what ``op`` reads), or None.
        Latency and hangs stay with the call itself."""
        t = self._now()
        for f in self._faults:
            if f.kind in EVENT_KINDS or f.kind in STATE_KINDS or not (f.matches(op, gpu) and f.active(t)):
                continue
            if (error := _error(f)) is not None:
                return error
        return None

    def events(self) -> list[Fault]:
        return [f for f in self._faults if f.kind in EVENT_KINDS]

    def _hang(self, fault: Fault) -> None:
        # A hung driver call: block until the fault window ends or the fault is removed.
        with self._changed:
            while fault in self._faults and fault.active(self._now()):
                self._changed.wait(0.05)
