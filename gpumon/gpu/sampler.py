"""Background sampling: one long-lived worker thread per GPU (gpumon.gpu.worker), a coordinator that enforces
a deadline.

Each sweep the coordinator hands every GPU worker one unit of work (read that GPU), reads the host while
they run, waits until the deadline, and publishes an immutable Snapshot by swapping a reference. A GPU whose
call hangs misses the deadline and is reported down (naming the call); its worker stays stuck alone, the
other GPUs and the HTTP server never wait for it, and no threads pile up. A GPU that is lost or whose driver
vanished is retried with exponential backoff.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from gpumon.gpu.attribution.owners import Attributor
from gpumon.gpu.attribution.ownership import GpuOwnership
from gpumon.gpu.backend import Backend, Device
from gpumon.gpu.events import EventsView, EventWatcher
from gpumon.gpu.snapshot import CollectorStatus, ErrorKey, GpuStatus, Snapshot
from gpumon.gpu.types import BackendUnavailable, DeviceDown, DriverInfo, ReadResult, Support
from gpumon.gpu.worker import GpuWorker
from gpumon.host import HostReading, HostSampler
from gpumon.net.reader import NicReader, NicReading
from gpumon.ranges import runs

log = logging.getLogger("gpumon.sampler")

BACKOFF_INITIAL = 1.0
BACKOFF_MAX = 60.0
DISCOVERY_EVERY = 30.0
ERROR_LOG_EVERY = 300.0  # a recurring error is logged on first sight, then at most this often
# how long a read may take, in sample intervals, while it is late rather than hung (see Sampler._late)
# before its GPU is called hung anyway; as long as /readyz lets a sample age
LATE_LIMIT = 3.0
# the daemon counts as late when its sampling thread wakes this much after it asked to (its other threads
# hold the interpreter lock: an idle daemon wakes within 0.1 ms, one behind three busy threads 2-20 ms);
# then even a call in flight past its deadline may be the daemon's delay
LAG_LIMIT = 0.002


# what the start-up summary says of a quantity a GPU lacks, in this order
ABSENT = {Support.NOT_SUPPORTED.value: "not supported", Support.NO_PERMISSION.value: "denied (no permission)"}


def gpu_ranges(indices: Sequence[int]) -> str:
    """``GPU 3``, ``GPUs 0-7`` or ``GPUs 0-2, 5``: GPU indices as runs."""
    return f"{'GPUs' if len(set(indices)) > 1 else 'GPU'} {runs(indices, ', ')}"


def _pids(st: GpuStatus) -> tuple[int, ...] | None:
    procs = st.reading.processes if st.reading is not None else None
    return None if procs is None else tuple(p.pid for p in procs)


class _GpuHealth:
    """What the coordinator remembers about one GPU between sweeps."""

    def __init__(self) -> None:
        self.down_reason: str | None = None
        self.down_since = 0.0
        self.backoff = 0.0
        self.next_retry = 0.0
        self.hung_op: str | None = None  # set while a call is stuck past its deadline
        self.last_success: float | None = None
        self.caps_version = -1
        self.caps: Mapping[str, str] = MappingProxyType({})
        self.caps_events: EventsView | None = None
        self.announced: dict[str, str] = {}  # absent quantities already logged, and how they are absent
        self.announced_caps: Mapping[str, str] | None = None  # the caps those were taken from


class Sampler:
    def __init__(
        self,
        backend: Backend,
        *,
        interval: float = 1.0,
        timeout: float | None = None,
        host: HostSampler | None = None,
        clock: Callable[[], float] = time.monotonic,
        events: EventWatcher | None = None,
        attributor: Attributor | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.backend = backend
        self.interval = interval
        self.timeout = timeout if timeout is not None else interval / 2.0
        if not 0 < self.timeout <= interval:
            raise ValueError("timeout must be positive and no longer than the interval")
        self.host = host if host is not None else HostSampler()
        self.clock = clock  # schedules backoff and rediscovery; tests pass a manual clock
        self.events = events  # the NVML event watcher, started and stopped with sampling
        self.attributor = attributor  # who owns each GPU process
        self.nics: NicReader | None = None  # the RDMA ports' reader (gpumon/net)
        self._nic_seq = 0  # the NIC reading whose read errors were counted
        self._done = threading.Condition()
        self._workers: list[GpuWorker] = []
        self._health: dict[str, _GpuHealth] = {}
        self._errors: dict[ErrorKey, int] = {}
        self._error_logged: dict[ErrorKey, float] = {}
        self._sweeps = 0
        self._unidentified = 0
        self._next_discovery = 0.0
        self._discovering: threading.Thread | None = None
        self.waiting: str | None = None  # why the backend has not started yet (open(wait=True))
        self._opening: threading.Thread | None = None
        self._open_backoff = 0.0
        self._next_open = 0.0
        # run once the backend has started, before the first sweep reads GPUs (DCGM, for one)
        self.on_open: list[Callable[[], None]] = []
        self._driver: DriverInfo | None = None
        self._snapshot: Snapshot | None = None
        # called with every new snapshot, on the sampling thread: quick, and never trusted not to raise
        self.listeners: list[Callable[[Snapshot], None]] = []
        self._listener_failed = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.last_sweep_monotonic = 0.0
        self._late_logged = float("-inf")
        self._lag = 0.0  # how late the sampling thread has woken this sweep (seconds)

    # -- lifecycle -------------------------------------------------------------------------------------
    def open(self, *, wait: bool = False) -> None:
        """Start the backend and identify GPUs. Raises BackendUnavailable, unless ``wait``: then sampling
        runs without GPUs (the gpu collector failing, each attempt counted) and the backend is tried again
        with backoff until it starts, as when a driver is installed after the daemon (GPU operator)."""
        try:
            devices = self.backend.open()
        except BackendUnavailable as exc:
            if not wait:
                raise
            self._unavailable(exc)
            return
        self._opened(devices)

    def _opened(self, devices: Sequence[Device]) -> None:
        self._add(devices)
        self._unidentified = max(0, self.backend.device_count - len(devices))
        self._next_discovery = self.clock() + DISCOVERY_EVERY
        if not devices:
            log.warning("no GPUs found by %s", self.backend.name)
        for hook in self.on_open:
            try:
                hook()
            except Exception:  # DCGM or another optional source: the GPUs are sampled without it
                log.exception("a step after %s started failed; sampling carries on", self.backend.name)
        self._driver = self.backend.driver_info()  # last: from here on, sweeps read the GPUs
        self.waiting = None
        if self._thread is not None and self.events is not None:
            self.events.start()  # a daemon that waited for the driver: events from now on

    def _unavailable(self, exc: BackendUnavailable) -> None:
        first = self.waiting is None
        self.waiting = str(exc)
        backoff = self._open_backoff
        self._open_backoff = min(BACKOFF_MAX, backoff * 2 if backoff else BACKOFF_INITIAL)
        self._next_open = self.clock() + self._open_backoff
        self._count(("", "", exc.op, exc.kind), str(exc), quiet=first)  # the first is logged below
        if first:
            log.warning("%s; serving without GPUs and trying again with backoff", exc)

    def _maybe_open(self, now: float) -> None:
        # off the sampling thread: nvmlInit can hang in a driver that is half loaded
        if now < self._next_open or (self._opening is not None and self._opening.is_alive()):
            return
        self._next_open = float("inf")  # set again by the attempt

        def attempt() -> None:
            try:
                devices = self.backend.open()
            except BackendUnavailable as exc:
                self._unavailable(exc)
                return
            except Exception as exc:  # a bug must not end the retries silently
                log.exception("starting %s failed", self.backend.name)
                self._unavailable(BackendUnavailable(repr(exc), kind=type(exc).__name__))
                return
            name, attempts = self.backend.name, self._attempts()
            log.info("%s started after %d attempt(s): %d GPU(s)", name, attempts, len(devices))
            self._opened(devices)

        self._opening = threading.Thread(target=attempt, name="gpumon-open", daemon=True)
        self._opening.start()

    def _attempts(self) -> int:
        return 1 + sum(n for (gpu, _, op, _), n in self._errors.items() if not gpu and op == "nvmlInit")

    def start(self) -> None:
        if self._driver is None and self.waiting is None:
            self.open()
        if self.events is not None and self._driver is not None:
            self.events.start()
        self._thread = threading.Thread(target=self._loop, name="gpumon-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + self.timeout + 1.0)
        if self.events is not None:
            self.events.stop()
        if self.nics is not None:
            self.nics.stop()
        for w in self._workers:
            w.stop()
        for w in self._workers:
            if not w.busy:
                w.thread.join(timeout=1.0)
        self.backend.close()

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def alive(self) -> bool:
        """The coordinator is running and has swept recently (what /healthz reports)."""
        if self._thread is None or not self._thread.is_alive():
            return False
        return time.monotonic() - self.last_sweep_monotonic < max(10.0, 5 * self.interval)

    def fresh(self) -> bool:
        """A sweep finished within three intervals (what /readyz reports): stricter than alive(), so that a
        node whose readings have gone stale leaves the scrape targets' ready set before it is restarted."""
        return time.monotonic() - self.last_sweep_monotonic < max(3.0, 3 * self.interval)

    def gpu_count(self) -> int:
        return len(self._workers)

    def devices(self) -> list[Device]:
        """The GPUs being sampled (what the event watcher registers)."""
        return [w.device for w in self._workers]

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sweep()
            except Exception:  # a bug here must not end sampling for good
                log.exception("sampling sweep failed")
                self._count(("", "", "sweep", "exception"))
            next_at += self.interval
            now = time.monotonic()
            if next_at < now:  # fell behind (a suspended VM, a stalled host): skip, don't burst
                next_at = now
            self._stop.wait(next_at - now)
            self._lagged(max(0.0, time.monotonic() - next_at))

    # -- GPUs ------------------------------------------------------------------------------------------
    def _add(self, devices: Sequence[Device]) -> None:
        for dev in devices:
            self._health[dev.info.uuid] = _GpuHealth()  # before the worker is visible to a sweep
        added = [GpuWorker(dev, self.backend, self._done) for dev in devices]
        # a new list swapped in whole: a sweep running on another thread iterates the old one undisturbed
        self._workers = sorted([*self._workers, *added], key=lambda w: w.device.info.index)

    def _maybe_discover(self, now: float) -> None:
        # A GPU that could not be identified at start (lost, mid-reset) is looked for again now and then,
        # off the sampling thread, since discovery calls NVML too and may hang like any call.
        if not self._unidentified or now < self._next_discovery:
            return
        if self._discovering is not None and self._discovering.is_alive():
            return
        self._next_discovery = now + DISCOVERY_EVERY

        def discover() -> None:
            try:
                found, failed = self.backend.discover({w.device.info.uuid for w in self._workers})
            except Exception as exc:  # a bug here must not kill rediscovery silently
                log.exception("looking for unidentified GPUs failed")
                self._count(("", "", "discover", type(exc).__name__), quiet=True)
                return
            if found:
                log.info("found %d more GPU(s): %s", len(found), ", ".join(d.info.uuid for d in found))
                self._add(found)
            self._unidentified = failed

        self._discovering = threading.Thread(target=discover, name="gpumon-discover", daemon=True)
        self._discovering.start()

    # -- one sweep -------------------------------------------------------------------------------------
    def sweep(self) -> Snapshot:
        driver = self._driver
        if driver is None and self.waiting is None:
            raise RuntimeError("Sampler.open() must succeed before sweeping")
        started = time.monotonic()
        deadline = started + self.timeout
        now = self.clock()
        self._sweeps += 1
        seq = self._sweeps
        if driver is None:
            self._maybe_open(now)
            return self._publish(self._snapshot_without_gpus(seq))
        workers = list(self._workers)
        events = self.events.view() if self.events is not None else None
        asked: list[GpuWorker] = []
        with self._done:
            for w in workers:
                health = self._health[w.device.info.uuid]
                if w.busy:  # still inside a call from an earlier sweep
                    continue
                if health.down_reason is not None and now < health.next_retry:
                    continue
                w.request(seq, deadline, reopen=health.down_reason is not None)
                asked.append(w)

        host, host_status = self._read_host()
        nic, nic_status = self._read_nics(workers)
        done = self._collect(asked, workers, seq, deadline, events)
        gpu_elapsed = time.monotonic() - started
        statuses = tuple(done.get(id(w)) or self._status(w, seq, w in asked, events) for w in workers)
        self._maybe_discover(now)
        self._announce_absent(statuses)
        owners, owners_status = self._attribute(statuses)

        snap = Snapshot(
            timestamp=time.time(),
            sweep=seq,
            interval_seconds=self.interval,
            backend=self.backend.name,
            driver=driver,
            device_count=max(self.backend.device_count, len(workers)),
            gpus=statuses,
            host=host,
            collectors=(
                CollectorStatus("gpu", True, gpu_elapsed),
                host_status,
                *(() if nic_status is None else (nic_status,)),
                *(() if events is None else (CollectorStatus("events", events.running, 0.0),)),
                *(() if owners_status is None else (owners_status,)),
                *self._kubelet_status(),
            ),
            errors=MappingProxyType(dict(self._errors)),
            events=events,
            owners=owners,
            nics=None if nic is None else nic.ports,
            nic_affinity=() if nic is None else nic.nearest,
            nics_at=None if nic is None else nic.at,
            nic_peermem=None if nic is None else nic.peermem,
            netdevs=None if nic is None else nic.interfaces,
        )
        return self._publish(snap)

    def _collect(
        self,
        asked: list[GpuWorker],
        workers: list[GpuWorker],
        seq: int,
        deadline: float,
        events: EventsView | None,
    ) -> dict[int, GpuStatus]:
        """Wait for the asked GPUs until the deadline, and publish each one's reading as soon as it is in:
        the latest snapshot with that GPU replaced, so a change is visible one GPU read after it is read, not
        after the slowest GPU, the host and attribution. Listeners still get one snapshot per sweep.

        A GPU whose compute processes changed waits for the sweep's end: its new processes need their owners
        (attribution runs over every GPU at once), and a series published without them would be replaced by
        one with them, a series for a few milliseconds."""
        done: dict[int, GpuStatus] = {}
        pending = list(asked)
        while pending:
            with self._done:
                self._done.wait_for(
                    lambda: any(w.result_seq == seq for w in pending),
                    timeout=max(0.0, deadline - time.monotonic()),
                )
                finished = [w for w in pending if w.result_seq == seq]
            if not finished:  # the deadline passed
                self._lagged(time.monotonic() - deadline)
                break
            for w in finished:
                pending.remove(w)
                done[id(w)] = self._status(w, seq, True, events)
            self._publish_early([done[id(w)] for w in finished], workers)
        return done

    def _announce_absent(self, statuses: Sequence[GpuStatus]) -> None:
        """One info line per group of GPUs that lack the same quantities, for what this sweep learnt: at
        start-up, where eight GPUs of one model lack the same few, a line instead of one per GPU and
        quantity (those are at debug); later, a quantity that went absent, or a GPU found late."""
        groups: dict[tuple[tuple[str, tuple[str, ...]], ...], list[int]] = {}
        for st in statuses:
            health = self._health.get(st.info.uuid)
            if health is None or st.capabilities is health.announced_caps:
                continue  # unchanged since it was looked at: the common case, one identity check
            health.announced_caps = st.capabilities
            # events: the watcher logs its own count of the GPUs it watches
            new = {
                q: s
                for q, s in st.capabilities.items()
                if s in ABSENT and q != "events" and health.announced.get(q) != s
            }
            if not new:
                continue
            health.announced.update(new)
            key = tuple(
                (state, tuple(sorted(q for q, s in new.items() if s == state)))
                for state in ABSENT
                if state in new.values()
            )
            groups.setdefault(key, []).append(st.info.index)
        # a capture answers NOT_SUPPORTED to a call it never saw: not a fact about the captured GPU
        replay = (
            "; a replay also says not supported where its capture has no answer (--log-level debug names "
            "those calls)"
            if self.backend.name == "replay"
            else ""
        )
        for key, indices in groups.items():
            denied = any(state == Support.NO_PERMISSION.value for state, _ in key)
            log.info(
                "%s: %s; their series are absent (%s)%s",
                gpu_ranges(indices),
                "; ".join(f"{', '.join(quantities)} {ABSENT[state]}" for state, quantities in key),
                "run gpumon doctor for advice" if denied else "gpumon doctor shows each GPU's capabilities",
                replay,
            )

    def _late(self, w: GpuWorker) -> bool:
        """Still reading, yet not hung: no call in flight (the worker waits for the interpreter between
        calls), or the one in flight began in the last half deadline, or the daemon itself is late (its
        sampling thread has woken over LAG_LIMIT late lately: its other threads hold the interpreter); and
        the read is younger than LATE_LIMIT intervals. A call the driver holds past its deadline is a GPU
        fault; a read made slow by the daemon's own threads is not. While the daemon is late, a hang is
        called within LATE_LIMIT intervals rather than one deadline."""
        if not w.busy:
            return False
        now = time.monotonic()
        if now - w.started >= LATE_LIMIT * self.interval:
            return False
        dev = w.device
        return dev.current_op is None or now - dev.op_started < self.timeout / 2 or self._lag > LAG_LIMIT

    def _lagged(self, seconds: float) -> None:
        """How late the sampling thread woke: remembered, fading by a tenth at each wake (about twenty
        wakes to fall below LAG_LIMIT from 50 ms), so that prompt wakes in a congested stretch do not make
        a late read look hung."""
        self._lag = max(seconds, self._lag * 0.9)

    def _publish_early(self, fresh: list[GpuStatus], workers: list[GpuWorker]) -> None:
        prev = self._snapshot
        if prev is None or len(prev.gpus) != len(workers):
            return
        index = {st.info.uuid: i for i, st in enumerate(prev.gpus)}
        gpus = list(prev.gpus)
        changed = False
        for st in fresh:
            i = index.get(st.info.uuid)
            if i is None or not st.up or not gpus[i].up or _pids(st) != _pids(gpus[i]):
                continue  # new, down, just back, or with other processes: at the sweep's end
            gpus[i] = st
            changed = True
        if changed:
            # a reference swap, as _publish; not a sweep: no listeners, no freshness bookkeeping
            self._snapshot = dataclasses.replace(prev, gpus=tuple(gpus))

    def _snapshot_without_gpus(self, seq: int) -> Snapshot:
        """What a sweep sees while the backend has not started: the host, and the gpu collector failing."""
        host, host_status = self._read_host()
        return Snapshot(
            timestamp=time.time(),
            sweep=seq,
            interval_seconds=self.interval,
            backend=self.backend.name,
            driver=DriverInfo("", "", ""),
            device_count=0,
            gpus=(),
            host=host,
            collectors=(CollectorStatus("gpu", False, 0.0), host_status),
            errors=MappingProxyType(dict(self._errors)),
        )

    def _publish(self, snap: Snapshot) -> Snapshot:
        self._snapshot = snap  # one reference swap: a scrape sees the old snapshot or the new, never a mix
        self.last_sweep_monotonic = time.monotonic()
        for listener in self.listeners:
            try:
                listener(snap)
            except Exception:
                if not self._listener_failed:
                    self._listener_failed = True
                    log.exception("a snapshot listener failed; sampling carries on (logged once)")
        return snap

    def _attribute(
        self, statuses: tuple[GpuStatus, ...]
    ) -> tuple[Mapping[str, GpuOwnership] | None, CollectorStatus | None]:
        if self.attributor is None:
            return None, None
        t0 = time.monotonic()
        try:
            owners = self.attributor.attribute(statuses)
        except Exception as exc:  # /proc on an odd kernel: process series lose their owners, nothing else
            self._count(("", "", "attribution", type(exc).__name__), str(exc))
            return None, CollectorStatus("attribution", False, time.monotonic() - t0)
        return owners, CollectorStatus("attribution", True, time.monotonic() - t0)

    def _kubelet_status(self) -> tuple[CollectorStatus, ...]:
        healthy = self.attributor.pods_healthy if self.attributor is not None else None
        return () if healthy is None else (CollectorStatus("kubelet", healthy(), 0.0),)

    def _read_host(self) -> tuple[HostReading | None, CollectorStatus]:
        t0 = time.monotonic()
        try:
            reading = self.host.read()
        except Exception as exc:  # psutil on an odd kernel: host series absent, GPUs unaffected
            self._count(("", "", "host", type(exc).__name__), str(exc))
            return None, CollectorStatus("host", False, time.monotonic() - t0)
        return reading, CollectorStatus("host", True, time.monotonic() - t0)

    def _read_nics(self, workers: Sequence[GpuWorker]) -> tuple[NicReading | None, CollectorStatus | None]:
        """The latest reading of the RDMA ports and each GPU's nearest (net/reader.py: read on a thread of
        their own in the daemon). A file that did not parse costs its quantity and is counted once per
        reading; a reading that raised, is stuck or is too old fails the nic collector only."""
        if self.nics is None:
            return None, None
        r = self.nics.read([(w.device.info.uuid, w.device.info.pci_bus_id) for w in workers])
        if r.seq != self._nic_seq:
            self._nic_seq = r.seq
            if r.error is not None:
                self._count(("", "", "sysfs_infiniband", type(r.error).__name__), str(r.error))
            for p in r.ports or ():
                for name in p.read_errors:
                    self._count(("", "", "sysfs_infiniband", "unparsable"), f"{p.device}/{name}")
            for n in r.interfaces or ():
                for name in n.read_errors:
                    self._count(("", "", "sysfs_net", "unparsable"), f"{n.name}/{name}")
        return r, CollectorStatus("nic", r.ok, r.duration_seconds)

    def _status(self, w: GpuWorker, seq: int, asked: bool, events: EventsView | None) -> GpuStatus:
        dev = w.device
        info = dev.info
        health = self._health[info.uuid]
        label = (str(info.index), info.uuid)
        reading = None
        duration = 0.0

        if asked and w.result_seq == seq:
            duration = w.finished - w.started
            result = w.result
            if health.hung_op is not None:  # whatever the answer, the GPU answers calls again
                log.warning("GPU %d (%s): %s returned at last", info.index, info.uuid, health.hung_op)
                health.hung_op = None
            if isinstance(result, ReadResult):
                reading = result.reading
                for err in result.errors:
                    self._count((*label, err.op, err.kind), err.message)
                if health.down_reason is not None:
                    log.warning(
                        "GPU %d (%s) is back after %.0f s (was: %s)",
                        info.index,
                        info.uuid,
                        self.clock() - health.down_since,
                        health.down_reason,
                    )
                health.down_reason = None
                health.backoff = 0.0
                health.last_success = reading.timestamp
            elif isinstance(result, DeviceDown):
                self._mark_down(health, info.index, info.uuid, f"{result.kind} in {result.op}")
                self._count((*label, result.op, result.kind), str(result), quiet=True)
            else:  # a bug in a backend: count it, keep the GPU down, retry like any failure
                self._mark_down(health, info.index, info.uuid, f"{type(result).__name__}: {result}")
                self._count((*label, "read", "exception"), repr(result))
                if isinstance(result, BaseException):
                    log.error("reading GPU %d failed unexpectedly", info.index, exc_info=result)
        elif w.busy and health.hung_op is None and self._late(w):
            # the read goes on, late because the daemon was: the GPU keeps its last reading this sweep
            duration = time.monotonic() - w.started
            self._count((*label, "read", "late"), quiet=True)
            self._say_late(info.index, duration)
            prev = self._previous(info.uuid)
            if prev is not None:
                return prev
        elif not asked and not w.busy and health.hung_op is None and health.down_reason is None:
            # a late read of an earlier sweep that ended meanwhile: the GPU keeps its last reading, and
            # is asked again next sweep
            prev = self._previous(info.uuid)
            if prev is not None:
                return prev
        elif w.busy:
            duration = time.monotonic() - w.started
            op = dev.current_op or "read"
            if health.hung_op is None:
                health.hung_op = op
                self._count((*label, op, "deadline_exceeded"), quiet=True)
                log.warning(
                    "GPU %d (%s): %s has not returned within %.3g s; reporting the GPU down until it does",
                    info.index,
                    info.uuid,
                    op,
                    self.timeout,
                )

        version = dev.support_version  # read first: a late worker may change support while we copy
        if version != health.caps_version or events is not health.caps_events:
            caps = dict(dev.capabilities())
            if events is not None and info.uuid in events.support:
                caps["events"] = events.support[info.uuid]
            health.caps = MappingProxyType(dict(sorted(caps.items())))
            health.caps_version = version
            health.caps_events = events

        if reading is None:
            # a call stuck right now says more than why the GPU went down before it
            reason = f"{health.hung_op} exceeded its deadline" if health.hung_op else health.down_reason
            return GpuStatus(
                info, False, None, duration, health.last_success, reason or "not sampled", health.caps
            )
        return GpuStatus(info, True, reading, duration, health.last_success, None, health.caps)

    def _previous(self, uuid: str) -> GpuStatus | None:
        """The GPU's status in the latest snapshot, if it was up then."""
        snap = self._snapshot
        if snap is None:
            return None
        return next((st for st in snap.gpus if st.info.uuid == uuid and st.up), None)

    def _say_late(self, index: int, seconds: float) -> None:
        now = time.monotonic()
        if now - self._late_logged < 60.0:
            return
        self._late_logged = now
        log.warning(
            "GPU %d's read has taken %.2f s (deadline %.3g s) with no driver call stuck: the daemon itself "
            "is late (its threads are busy: a flood of API requests, or too few CPUs), not the GPU; its last "
            'reading is kept (counted as gpumon_errors_total{op="read",error="late"}; logged once a minute)',
            index,
            seconds,
            self.timeout,
        )

    def _mark_down(self, health: _GpuHealth, index: int, uuid: str, reason: str) -> None:
        now = self.clock()
        if health.down_reason is None:
            health.down_since = now
            log.warning("GPU %d (%s) is down: %s; retrying with backoff", index, uuid, reason)
        health.down_reason = reason
        health.backoff = min(BACKOFF_MAX, health.backoff * 2 if health.backoff else BACKOFF_INITIAL)
        health.next_retry = now + health.backoff

    def _count(self, key: ErrorKey, message: str = "", *, quiet: bool = False) -> None:
        """Count a failure; log it unless the caller already did (GPU down, call hung)."""
        n = self._errors.get(key, 0) + 1
        self._errors[key] = n
        if quiet:
            return
        now = time.monotonic()
        last = self._error_logged.get(key)
        if last is None or now - last >= ERROR_LOG_EVERY:
            self._error_logged[key] = now
            gpu, _, op, kind = key
            where = f"GPU {gpu}" if gpu else "node"
            log.warning(
                "%s: %s failed with %s (%d so far)%s", where, op, kind, n, f": {message}" if message else ""
            )
