"""NVML event sets for the simulator: register, wait, free, and events injected by tests or ``--sim-fault``.

Like NVML, an event reaches only the sets that registered its GPU for its type, and a wait that sees
nothing within its timeout raises NVMLError_Timeout.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import pynvml

from gpumon.gpu.sim.catalog import SimModel
from gpumon.gpu.sim.device import NO_INSTANCE

if TYPE_CHECKING:
    from gpumon.gpu.sim.device import SimGpu
    from gpumon.gpu.sim.faults import Faults

XID = pynvml.nvmlEventTypeXidCriticalError
_ECC_EVENTS = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | getattr(pynvml, "nvmlEventTypeDramRetirementEvent", 0)
    | getattr(pynvml, "nvmlEventTypeDramRetirementFailure", 0)
)


def supported_events(model: SimModel) -> int:
    if model.gpm:  # Hopper and later: every event type (the H200 capture, driver 580: 0xff9f)
        return int(pynvml.nvmlEventTypeAll)
    mask = XID | pynvml.nvmlEventTypePState | pynvml.nvmlEventTypeClock
    return mask | _ECC_EVENTS if model.ecc else mask


class SimEventSet:
    def __init__(self) -> None:
        self.registered: dict[int, int] = {}  # GPU index → event type mask
        self.queue: deque[SimEventData] = deque()
        self.freed = False


class SimEventData:
    """The fields of ``c_nvmlEventData_t``; ``device`` is a simulator handle, as the handles are."""

    __slots__ = ("computeInstanceId", "device", "eventData", "eventType", "gpuInstanceId")

    def __init__(self, device: SimGpu, event_type: int, data: int, gi: int, ci: int) -> None:
        self.device = device
        self.eventType = event_type
        self.eventData = data
        self.gpuInstanceId = gi
        self.computeInstanceId = ci


class SimEvents:
    """The event half of SimNvml."""

    gpus: list[SimGpu]
    faults: Faults

    if TYPE_CHECKING:

        def _enter(self, op: str, gpu: SimGpu | None = None) -> None: ...
        def _gpu(self, handle: Any, op: str) -> SimGpu: ...
        def elapsed(self) -> float: ...

    def _events_init(self) -> None:
        self._event_cond = threading.Condition()
        self._event_sets: list[SimEventSet] = []
        self._fired: set[int] = set()

    def nvmlEventSetCreate(self) -> SimEventSet:
        self._enter("nvmlEventSetCreate")
        event_set = SimEventSet()
        with self._event_cond:
            self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: SimGpu) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetSupportedEventTypes")
        return supported_events(gpu.model)

    def nvmlDeviceRegisterEvents(self, handle: SimGpu, eventTypes: int, eventSet: SimEventSet) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if eventTypes & ~supported_events(gpu.model):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not isinstance(eventSet, SimEventSet) or eventSet.freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._event_cond:
            eventSet.registered[gpu.index] = eventSet.registered.get(gpu.index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: SimEventSet, timeoutms: int) -> SimEventData:
        self._enter("nvmlEventSetWait_v2")
        if not isinstance(eventSet, SimEventSet) or eventSet.freed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + timeoutms / 1000.0
        with self._event_cond:
            while True:
                scheduled = self._deliver_due()
                if eventSet.queue:
                    return eventSet.queue.popleft()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
                # scheduled XIDs run on the simulator's clock: look again soon while any is pending
                self._event_cond.wait(min(remaining, 0.02) if scheduled else remaining)

    def nvmlEventSetFree(self, eventSet: SimEventSet) -> None:
        self._enter("nvmlEventSetFree")
        with self._event_cond:
            eventSet.freed = True
            self._event_sets = [s for s in self._event_sets if s is not eventSet]
            self._event_cond.notify_all()

    # -- injection -------------------------------------------------------------------------------------
    def inject_event(
        self, gpu: int, event_type: int, data: int = 0, gi: int = NO_INSTANCE, ci: int = NO_INSTANCE
    ) -> int:
        """Deliver one event to every set registered for it; returns how many sets got it."""
        with self._event_cond:
            return self._deliver(gpu, event_type, data, gi, ci)

    def inject_xid(self, gpu: int, code: int) -> int:
        return self.inject_event(gpu, XID, code)

    def _deliver(self, gpu: int, event_type: int, data: int, gi: int, ci: int) -> int:
        delivered = 0
        for event_set in self._event_sets:
            if event_set.registered.get(gpu, 0) & event_type:
                event_set.queue.append(SimEventData(self.gpus[gpu], event_type, data, gi, ci))
                delivered += 1
        if delivered:
            self._event_cond.notify_all()
        return delivered

    def _deliver_due(self) -> bool:
        """Deliver ``xid`` faults whose time has come; True while some are still pending."""
        pending = False
        now = self.elapsed()
        for fault in self.faults.events():
            if id(fault) in self._fired or fault.gpu is None or fault.gpu >= len(self.gpus):
                continue
            # an XID nobody listens for yet stays pending: a watcher registering late still sees it
            if fault.start <= now and self._deliver(fault.gpu, XID, fault.xid, NO_INSTANCE, NO_INSTANCE):
                self._fired.add(id(fault))
            else:
                pending = True
        return pending
