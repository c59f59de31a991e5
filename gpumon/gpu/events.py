"""The NVML event watcher: XID errors, ECC errors, page retirement and GPU-unavailable events, as they happen.

NVML delivers events through an event set that one thread waits on (``nvmlEventSetWait_v2`` blocks up to a
timeout and raises NVMLError_Timeout when nothing happened). Sampling cannot see an XID at all (there is no
counter to read), so one watcher thread per node registers every GPU and counts what arrives. Counts are
cumulative per (GPU, event) and per (GPU, XID code), with the time of the last one: a counter that
``increase()`` can alert on, not dcgm-exporter's "last XID" gauge that never resets.

The watcher outlives NVML trouble: when the wait fails (NVML re-initialised, driver reloaded) or the set of
GPUs changes (a GPU re-acquired after a reset gets a new handle, a GPU found late), it frees the set and
registers again, with backoff. A GPU that does not support events is recorded as such and skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pynvml

from gpumon.gpu.backend import Device
from gpumon.gpu.nvml.calls import ABSENT_ERRORS, error_kind
from gpumon.gpu.types import Support

log = logging.getLogger("gpumon.events")


def _event_type(name: str) -> int:
    return int(getattr(pynvml, name, 0))  # types newer than the installed nvidia-ml-py are skipped


# (NVML event type bit, our label). "xid" covers every XID; its code goes in a label of its own metric.
EVENT_TYPES: tuple[tuple[int, str], ...] = tuple(
    (bit, label)
    for bit, label in (
        (_event_type("nvmlEventTypeXidCriticalError"), "xid"),
        (_event_type("nvmlEventTypeSingleBitEccError"), "ecc_single_bit"),
        (_event_type("nvmlEventTypeDoubleBitEccError"), "ecc_double_bit"),
        (_event_type("nvmlEventTypeSingleBitEccErrorStorm"), "ecc_single_bit_storm"),
        (_event_type("nvmlEventTypeDramRetirementEvent"), "page_retirement"),
        (_event_type("nvmlEventTypeDramRetirementFailure"), "page_retirement_failure"),
        (_event_type("nvmlEventTypeNonFatalPoisonError"), "poison_non_fatal"),
        (_event_type("nvmlEventTypeFatalPoisonError"), "poison_fatal"),
        (_event_type("nvmlEventTypeGpuUnavailableError"), "gpu_unavailable"),
        (_event_type("nvmlEventTypeGpuRecoveryAction"), "recovery_action"),
    )
    if bit
)
WANTED = sum(bit for bit, _ in EVENT_TYPES)
LABEL = dict(EVENT_TYPES)
RECENT = 64  # events kept for /v1/gpus
WAIT_MS = 500  # bounds how long stop() and a GPU-set change wait for the thread
BACKOFF_MAX = 60.0


@dataclass(frozen=True, slots=True)
class Event:
    timestamp: float  # unix seconds when gpumon received it
    uuid: str
    event: str  # a label from EVENT_TYPES
    xid: int | None = None  # the XID code for "xid" events
    gpu_instance_id: int | None = None  # MIG: the instance the event belongs to, where NVML says
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class EventsView:
    """What the watcher has seen so far; immutable, swapped in whole after each change."""

    running: bool = False  # registered and waiting
    reason: str = ""  # why not, when it is not
    registered: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # uuid → event labels
    support: Mapping[str, str] = field(default_factory=dict)  # uuid → a Support value, for capabilities
    counts: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (uuid, event) → n
    last: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (uuid, event) → unix time
    xids: Mapping[tuple[str, int], int] = field(default_factory=dict)  # (uuid, xid) → n
    xid_last: Mapping[tuple[str, int], float] = field(default_factory=dict)
    recent: tuple[Event, ...] = ()  # newest last
    failures: int = 0  # times registration or waiting failed and the set was rebuilt
    errors: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (op, NVML error) → n


class EventWatcher:
    """One daemon thread waiting on an NVML event set that covers every GPU ``devices()`` returns."""

    def __init__(
        self,
        nv: Any,
        devices: Callable[[], Sequence[Device]],
        *,
        wait_ms: int = WAIT_MS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nv = nv
        self.devices = devices
        self.wait_ms = wait_ms
        self.clock = clock
        self._view = EventsView(reason="not started")
        self._counts: dict[tuple[str, str], int] = {}
        self._last: dict[tuple[str, str], float] = {}
        self._xids: dict[tuple[str, int], int] = {}
        self._xid_last: dict[tuple[str, int], float] = {}
        self._recent: deque[Event] = deque(maxlen=RECENT)
        self._registered: dict[str, tuple[str, ...]] = {}
        self._support: dict[str, str] = {}
        self._failures = 0
        self._errors: dict[tuple[str, str], int] = {}
        self._op = ""  # the NVML call in flight, so a failure can be counted under its name
        self._set: Any = None
        self._key: tuple[tuple[str, int], ...] = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def view(self) -> EventsView:
        return self._view

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="gpumon-events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.wait_ms / 1000 + 1.0)
            if self._thread.is_alive():  # stuck in the driver: freeing the set under it could crash
                return
        self._free()

    # -- the thread --------------------------------------------------------------------------------------
    def _loop(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            try:
                if self._set is None or self._devices_key() != self._key:
                    self._register()
                self._wait_once()
                backoff = 0.0
            except Exception as exc:  # NVML trouble or a bug: rebuild the set later, never die
                self._failures += 1
                key = (self._op or "event_watcher", error_kind(exc))
                self._errors[key] = self._errors.get(key, 0) + 1
                backoff = min(BACKOFF_MAX, backoff * 2 if backoff else 1.0)
                reason = f"{error_kind(exc)}: {exc}"
                level = logging.WARNING if self._view.running or self._failures == 1 else logging.DEBUG
                log.log(level, "NVML event watcher failed (%s); registering again in %.0f s", reason, backoff)
                self._free()
                self._publish(running=False, reason=reason)
                self._stop.wait(backoff)

    def _devices_key(self) -> tuple[tuple[str, int], ...]:
        # a re-acquired GPU has a new handle: an event set registered on the old one hears nothing
        return tuple((d.info.uuid, id(getattr(d, "handle", None))) for d in self.devices())

    def _register(self) -> None:
        self._free()
        key = self._devices_key()
        devices = self.devices()
        self._op = "nvmlEventSetCreate"
        event_set = self.nv.nvmlEventSetCreate()
        self._set = event_set
        registered: dict[str, tuple[str, ...]] = {}
        support: dict[str, str] = {}
        for dev in devices:
            handle = getattr(dev, "handle", None)
            uuid = dev.info.uuid
            try:
                self._op = "nvmlDeviceGetSupportedEventTypes"
                supported = int(self.nv.nvmlDeviceGetSupportedEventTypes(handle)) & WANTED
                if supported:
                    self._op = "nvmlDeviceRegisterEvents"
                    self.nv.nvmlDeviceRegisterEvents(handle, supported, event_set)
            except pynvml.NVMLError as exc:
                state = ABSENT_ERRORS.get(error_kind(exc))
                if state is None:
                    raise  # the GPU is down or NVML is: retried with the whole set
                support[uuid] = state.value
                continue
            if supported:
                support[uuid] = Support.SUPPORTED.value
                registered[uuid] = tuple(label for bit, label in EVENT_TYPES if supported & bit)
            else:
                support[uuid] = Support.NOT_SUPPORTED.value
        self._support = support
        self._key = key
        self._registered = registered
        for uuid, labels in registered.items():  # zero counters, so the first event is an increase
            for label in labels:
                self._counts.setdefault((uuid, label), 0)
        log.info("watching NVML events on %d of %d GPU(s)", len(registered), len(devices))
        self._publish(running=True, reason="" if registered else "no GPU supports NVML events")

    def _wait_once(self) -> None:
        self._op = "nvmlEventSetWait_v2"
        try:
            data = self.nv.nvmlEventSetWait_v2(self._set, self.wait_ms)
        except pynvml.NVMLError_Timeout:
            return
        self._record(data)

    def _record(self, data: Any) -> None:
        kind = int(data.eventType)
        label = LABEL.get(kind)
        if label is None:
            return
        try:
            uuid = str(self.nv.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as exc:  # the GPU went away with its event: still worth counting
            log.debug("event for a GPU that does not answer: %s", exc)
            uuid = ""
        now = self.clock()
        xid = int(data.eventData) if label == "xid" else None
        gi = _instance_id(getattr(data, "gpuInstanceId", None))
        ci = _instance_id(getattr(data, "computeInstanceId", None))
        event = Event(now, uuid, label, xid, gi, ci)
        self._counts[(uuid, label)] = self._counts.get((uuid, label), 0) + 1
        self._last[(uuid, label)] = now
        if xid is not None:
            self._xids[(uuid, xid)] = self._xids.get((uuid, xid), 0) + 1
            self._xid_last[(uuid, xid)] = now
        self._recent.append(event)
        log.warning(
            "GPU %s: NVML event %s%s%s",
            uuid or "?",
            label,
            f" (XID {xid})" if xid is not None else "",
            f" on MIG instance {gi}" if gi is not None else "",
        )
        self._publish(running=True, reason=self._view.reason)

    def _publish(self, *, running: bool, reason: str) -> None:
        self._view = EventsView(
            running=running,
            reason=reason,
            registered=MappingProxyType(dict(self._registered)),
            support=MappingProxyType(dict(self._support)),
            counts=MappingProxyType(dict(self._counts)),
            last=MappingProxyType(dict(self._last)),
            xids=MappingProxyType(dict(self._xids)),
            xid_last=MappingProxyType(dict(self._xid_last)),
            recent=tuple(self._recent),
            failures=self._failures,
            errors=MappingProxyType(dict(self._errors)),
        )

    def _free(self) -> None:
        event_set, self._set = self._set, None
        if event_set is None:
            return
        try:
            self.nv.nvmlEventSetFree(event_set)
        except pynvml.NVMLError as exc:  # freeing after NVML went away fails; nothing to do about it
            log.debug("nvmlEventSetFree: %s", exc)


def _instance_id(value: Any) -> int | None:
    # NVML reports 0xFFFFFFFF ("invalid") for events that do not belong to a MIG instance
    if value is None:
        return None
    value = int(value)
    return None if value >= 0xFFFFFFFF else value
