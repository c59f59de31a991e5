"""Snapshot → Prometheus metric families. A scrape never calls NVML.

NVML calls cost about a millisecond each (the PCIe throughput call 20 ms), and prometheus_client runs
``collect()`` on the server's event loop: sampling therefore happens in the background (gpumon.gpu.sampler)
and a scrape only formats the latest immutable snapshot. Families are built once per snapshot and reused by
every scrape until the next sweep replaces it.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumon import __version__
from gpumon import metrics as M
from gpumon.gpu import xid as xids
from gpumon.gpu.attribution.ownership import OWNER_LABELS, GpuOwnership, OwnedProcess
from gpumon.gpu.events import EventsView
from gpumon.gpu.snapshot import GpuStatus, Snapshot
from gpumon.gpu.types import THROTTLE_REASONS, MigReading
from gpumon.net.exposition import ethernet_samples, nic_samples
from gpumon.zerofirst import ZeroFirst

Family = GaugeMetricFamily | CounterMetricFamily
_ECC_TYPES = ("corrected", "uncorrected")
# without --collect throttle-reasons: a 0/1 series only for reasons that cost throughput, and only where the
# GPU has no cumulative time for them (hw_slowdown has none anywhere)
_COSTLY_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
# series that already say who owns what, or are not about one GPU's work
_OWNER_EXEMPT = {M.GPU_INFO.name, M.GPU_OWNER.name, M.PROCESS_INFO.name, M.ERRORS.name}


def _family(m: M.Metric) -> Family:
    cls = CounterMetricFamily if m.type == "counter" else GaugeMetricFamily
    return cls(m.name, m.help, labels=m.labels)


PORT_MEMORY = 3600.0  # seconds a port missing from the readings keeps its rare counters' state
MAX_REMEMBERED_PORTS = 256  # and at most this many: device names can churn (a hostile --sys-root tree)


def _gpu_owner(uuid: str) -> tuple[str, int]:
    return (f"gpu:{uuid}", 0)


def _port_owner(device: str, port: int) -> tuple[str, int]:
    return (f"nic:{device}", port)


def _interface_owner(name: str) -> tuple[str, int]:
    return (f"eth:{name}", 0)


class RareCounters:
    """The RARE counters' state across builds: a ZeroFirst over GPUs and NIC ports (the "ranks" it keeps
    apart), and the ports shown lately. A GPU down keeps its counters' state for when it answers again, and
    so does a port missing from some readings (an adapter reset, a failed read) for PORT_MEMORY seconds."""

    def __init__(self, born: float, hold: float) -> None:
        self.first = ZeroFirst(born, hold)
        self._ports: dict[tuple[str, int], float] = {}  # port owner -> when last shown

    def value(
        self, owner: tuple[str, int], name: str, labels: list[str], value: float, now: float
    ) -> float | None:
        return self.first.value((*owner, name, tuple(labels)), value, now, _HARDWARE)

    def keep(self, shown: set[tuple[str, int]], gpus: list[tuple[str, int]], now: float) -> None:
        for owner in shown:
            if owner[0].startswith(("nic:", "eth:")):
                self._ports[owner] = now
        for owner in [k for k, t in self._ports.items() if not 0 <= now - t <= PORT_MEMORY]:
            del self._ports[owner]
        while len(self._ports) > MAX_REMEMBERED_PORTS:
            del self._ports[min(self._ports, key=self._ports.__getitem__)]
        self.first.keep(shown, {*gpus, *shown, *self._ports})


# the hardware's counters of rare trouble, cumulative since the driver (or the adapter) loaded: most are 0 on
# a healthy node, and a series per GPU, reason and type of them cost ~100 series of zeros on an HGX node. Each
# is absent until it is first above 0 (gpumon/zerofirst.py), except those already above 0 when the daemon
# first shows their GPU or port: the count is the hardware's, not this daemon's, and must not dip to 0
RARE = frozenset({"gpumon_gpu_throttle_seconds_total", "gpumon_gpu_ecc_errors_total",
                  "gpumon_gpu_remapped_rows_total", "gpumon_nic_errors_total",
                  "gpumon_ethernet_errors_total"})  # fmt: skip
_HARDWARE = 0.0  # a hardware counter's "process start": older than any daemon


class Families(dict[str, Family]):
    """The families of one build, only those of metrics switched on: adding to one that is off does nothing,
    so the builders below need not know which opt-in detail is on. ``first``: where the RARE counters are
    shown from their first rise (None: from 0, as every other counter)."""

    def __init__(
        self,
        metrics: Iterable[M.Metric],
        details: frozenset[str],
        first: RareCounters | None = None,
        now: float = 0.0,
    ) -> None:
        super().__init__((m.name, _family(m)) for m in metrics if not m.detail or m.detail in details)
        self.details = details
        self.first = first
        self.now = now
        self.shown: set[tuple[str, int]] = set()  # the GPUs and NIC ports shown this build (their owners)

    def add(self, metric: M.Metric, labels: list[str], value: float) -> None:
        fam = self.get(metric.name)
        if fam is not None:
            fam.add_metric(labels, value)

    def counter(self, owner: tuple[str, int], metric: M.Metric, labels: list[str], value: float) -> None:
        """A counter of ``owner`` (a GPU's uuid, or a NIC's device and port); a RARE one from its first
        rise."""
        if self.first is None or metric.name not in RARE or metric.name not in self:
            self.add(metric, labels, value)
            return
        shown = self.first.value(owner, metric.name, labels, value, self.now)
        if shown is not None:
            self.add(metric, labels, shown)


def _add_fields(
    f: Families, labels: list[str], source: object, fields: Iterable[tuple[M.Metric, str]]
) -> None:
    """One sample per (metric, attribute of ``source``) whose value is known: unknown is absent, not 0."""
    for metric, attr in fields:
        value = getattr(source, attr)
        if value is not None:
            f.add(metric, labels, value)


def _add_gpu(f: Families, st: GpuStatus) -> None:
    info = st.info
    gl = [str(info.index), info.uuid]
    f.add(
        M.GPU_INFO,
        [
            *gl,
            info.name,
            info.pci_bus_id,
            info.serial or "",
            info.board_part_number or "",
            info.vbios_version or "",
        ],
        1,
    )
    f.add(M.GPU_UP, gl, 1 if st.up else 0)
    f.add(M.GPU_SAMPLE_DURATION, gl, st.duration_seconds)
    if st.last_success is not None:
        f.add(M.GPU_LAST_SAMPLE, gl, st.last_success)
    static = (
        (M.PERSISTENCE, info.persistence_mode),
        (M.SM_CLOCK_MAX, info.sm_clock_max_hz),
        (M.MEM_CLOCK_MAX, info.memory_clock_max_hz),
        (M.PCIE_GEN_MAX, info.pcie_link_max_generation),
        (M.PCIE_WIDTH_MAX, info.pcie_link_max_width),
    )
    for metric, value in static:
        if value is not None:
            f.add(metric, gl, value)
    if info.nvlink_count:
        f.add(M.NVL_LINKS, gl, info.nvlink_count)

    r = st.reading
    if r is None:  # down: only the health series above, no stale values
        return
    _add_fields(f, gl, r, ((m, m.field) for m in M.GPU_SCALARS if m.field is not None))
    if r.throttle_reasons is not None:
        every = "throttle-reasons" in f.details
        for bit, reason, _ in THROTTLE_REASONS:
            # by what the GPU supports, not by this read: a failed batch must not make series come and go
            counted = st.capabilities.get(f"throttle_time:{reason}") in ("supported", "error")
            if every or (reason in _COSTLY_REASONS and not counted):
                f.add(M.THROTTLE_ACTIVE, [*gl, reason], 1 if r.throttle_reasons & bit else 0)
    owner = _gpu_owner(info.uuid)
    f.shown.add(owner)
    for reason, seconds in r.throttle_seconds.items():
        f.counter(owner, M.THROTTLE_SECONDS, [*gl, reason], seconds)
    for metric, pair in (
        (M.ECC, (r.ecc_corrected_errors, r.ecc_uncorrected_errors)),
        (M.ECC_LIFETIME, (r.ecc_corrected_errors_lifetime, r.ecc_uncorrected_errors_lifetime)),
        (M.REMAPPED, (r.remapped_rows_correctable, r.remapped_rows_uncorrectable)),
    ):
        for kind, value in zip(_ECC_TYPES, pair, strict=True):
            if value is not None:
                f.counter(owner, metric, [*gl, kind], value)
    p = r.profiling
    if p is not None:
        f.add(M.PROFILING_INFO, [*gl, p.source], 1)
        _add_fields(f, gl, p, M.PROFILING_FIELDS)
    _add_mig(f, gl, r.mig or ())
    states = [link.up for link in r.nvlinks if link.up is not None]
    if states:
        f.add(M.NVL_LINKS_UP, gl, sum(states))
    for link in r.nvlinks:
        ll = [*gl, str(link.link)]
        if link.up is not None:
            f.add(M.NVL_LINK_UP, ll, 1 if link.up else 0)
        if link.transmit_bytes is not None:
            f.add(M.NVL_LINK_TX, ll, link.transmit_bytes)
        if link.receive_bytes is not None:
            f.add(M.NVL_LINK_RX, ll, link.receive_bytes)


def _add_mig(f: Families, gl: list[str], migs: tuple[MigReading, ...]) -> None:
    instances_done: set[int] = set()
    for m in migs:
        gi = [*gl, str(m.gpu_instance_id)]
        f.add(M.MIG_INFO, [*gi, str(m.compute_instance_id), m.uuid, m.profile], 1)
        # memory and GPM are the GPU instance's: compute instances sharing one each report all of it
        if m.gpu_instance_id in instances_done:
            continue
        instances_done.add(m.gpu_instance_id)
        if m.memory_total_bytes is not None:
            f.add(M.MIG_MEM_TOTAL, gi, m.memory_total_bytes)
        if m.memory_used_bytes is not None:
            f.add(M.MIG_MEM_USED, gi, m.memory_used_bytes)
        if m.profiling is not None:
            _add_fields(f, gi, m.profiling, M.MIG_PROFILING_FIELDS)


def _add_processes(f: Families, st: GpuStatus, ownership: GpuOwnership | None) -> None:
    gl = [str(st.info.index), st.info.uuid]
    if ownership is not None and ownership.owner is not None:
        f.add(M.GPU_OWNER, [*gl, *ownership.owner], 1)
    procs = st.reading.processes if st.reading is not None else None
    if procs is None:
        return
    f.add(M.GPU_PROCESSES, gl, len(procs))
    owned = ownership.processes if ownership is not None else {}
    for p in procs:
        pl = [*gl, str(p.pid)]
        o = owned.get(p.pid) or OwnedProcess(p.pid)
        f.add(
            M.PROCESS_INFO,
            [
                *pl,
                o.name,
                o.user,
                o.container_id,
                o.pod_uid,
                o.namespace,
                o.pod,
                o.container,
                o.slurm_job_id,
                "" if p.gpu_instance_id is None else str(p.gpu_instance_id),
                "" if p.compute_instance_id is None else str(p.compute_instance_id),
            ],
            1,
        )
        for metric, value in (
            (M.PROCESS_MEMORY, p.used_memory_bytes),
            (M.PROCESS_SM, p.sm_utilization_ratio),
            (M.PROCESS_MEM_UTIL, p.memory_utilization_ratio),
            (M.PROCESS_LAST_SEEN, p.last_seen),
        ):
            if value is not None:
                f.add(metric, pl, value)


def _with_owner_labels(families: list[Metric], snap: Snapshot) -> None:
    """Append the GPU's owner labels to every per-GPU series: one label set per GPU at a time, so the
    series count stays what it was (a new owner replaces the old series, it does not add to them)."""
    owners = snap.owners or {}
    extra = {
        uuid: dict(zip(OWNER_LABELS, o.owner or ("", "", "", ""), strict=True)) for uuid, o in owners.items()
    }
    blank = dict.fromkeys(OWNER_LABELS, "")
    for fam in families:
        if fam.name in _OWNER_EXEMPT:
            continue
        fam.samples = [
            s._replace(labels={**s.labels, **extra.get(s.labels["uuid"], blank)}) if "uuid" in s.labels else s
            for s in fam.samples
        ]


def _add_events(f: Families, ev: EventsView, index: dict[str, str]) -> None:
    for (op, kind), n in ev.errors.items():
        f.add(M.ERRORS, ["", "", op, kind], n)
    for uuid, labels in ev.registered.items():
        for label in labels:
            f.add(M.EVENTS_REGISTERED, [index.get(uuid, ""), uuid, label], 1)
    every = "event-types" in f.details  # else XIDs only: every serious event type comes with one
    for (uuid, label), n in ev.counts.items():
        if every or label == "xid":
            f.add(M.EVENTS, [index.get(uuid, ""), uuid, label], n)
    for (uuid, label), t in ev.last.items():
        if every or label == "xid":
            f.add(M.EVENT_LAST, [index.get(uuid, ""), uuid, label], t)
    seen = set()
    for (uuid, code), n in ev.xids.items():
        f.add(M.XID_ERRORS, [index.get(uuid, ""), uuid, str(code)], n)
        f.add(M.XID_LAST, [index.get(uuid, ""), uuid, str(code)], ev.xid_last[(uuid, code)])
        seen.add(code)
    for code in sorted(seen):
        x = xids.lookup(code)
        f.add(M.XID_INFO, [str(code), x.description, x.severity.value, x.cause.value, x.action], 1)


def build_families(
    snap: Snapshot,
    *,
    owner_labels: bool = False,
    node: str | None = None,
    details: frozenset[str] = frozenset(),
    first: RareCounters | None = None,
) -> list[Metric]:
    """``first``: where the RARE counters are shown from their first rise, kept across builds (None: every
    counter from 0)."""
    f = Families(M.GPU_FLOW, details, first, snap.timestamp)
    f.add(M.BUILD_INFO, [__version__, platform.python_version(), snap.backend], 1)
    if node is not None:
        f.add(M.NODE_INFO, [node], 1)
    d = snap.driver
    if d.driver_version or d.nvml_version:  # absent while the daemon waits for the driver to load
        f.add(M.DRIVER_INFO, [d.driver_version, d.cuda_driver_version, d.nvml_version], 1)
    f.add(M.DEVICE_COUNT, [], snap.device_count)
    f.add(M.SAMPLE_INTERVAL, [], snap.interval_seconds)
    f.add(M.LAST_SAMPLE, [], snap.timestamp)
    f.add(M.SAMPLES, [], snap.sweep)
    for c in snap.collectors:
        f.add(M.COLLECTOR_SUCCESS, [c.name], 1 if c.success else 0)
        f.add(M.COLLECTOR_DURATION, [c.name], c.duration_seconds)
    for key, count in snap.errors.items():
        f.add(M.ERRORS, list(key), count)
    for st in snap.gpus:
        _add_gpu(f, st)
        _add_processes(f, st, None if snap.owners is None else snap.owners.get(st.info.uuid))
    index = {st.info.uuid: str(st.info.index) for st in snap.gpus}
    if snap.events is not None:
        _add_events(f, snap.events, index)
    h = snap.host
    if h is not None:
        for metric, value in (
            (M.HOST_CPU, h.cpu_utilization_ratio),
            (M.HOST_CPUS, h.cpu_count),
            (M.HOST_MEM_TOTAL, h.memory_total_bytes),
            (M.HOST_MEM_AVAIL, h.memory_available_bytes),
            (M.HOST_LOAD1, h.load1),
            (M.HOST_LOAD5, h.load5),
            (M.HOST_LOAD15, h.load15),
        ):
            f.add(metric, [], value)
    for metric, labels, value in nic_samples(snap.nics or (), detail="nic-detail" in f.details):
        port = _port_owner(labels[0], int(labels[1]))
        f.shown.add(port)
        f.counter(port, metric, labels, value)
    for metric, labels, value in ethernet_samples(snap.netdevs or ()):
        owner = _interface_owner(labels[0])
        f.shown.add(owner)
        f.counter(owner, metric, labels, value)
    for uuid, nic, path in snap.nic_affinity:
        if uuid in index:
            f.add(M.NIC_AFFINITY, [index[uuid], uuid, nic, path], 1)
    if first is not None:
        first.keep(f.shown, [_gpu_owner(st.info.uuid) for st in snap.gpus], snap.timestamp)
    # a family without samples is a quantity nobody here supports: leave it out entirely
    families: list[Metric] = [fam for fam in f.values() if fam.samples]
    if owner_labels:
        _with_owner_labels(families, snap)
    return families


class PerSnapshotCollector:
    """A prometheus_client collector over whatever snapshot ``source`` returns: families are built once per
    snapshot and reused by every scrape until the next sweep replaces it."""

    def __init__(self, source: Callable[[], Snapshot | None]) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._for: Snapshot | None = None
        self._families: list[Metric] = []

    def build(self, snap: Snapshot, previous: Snapshot | None) -> list[Metric]:
        raise NotImplementedError

    def collect(self) -> Iterator[Metric]:
        snap = self.source()
        if snap is None:
            return iter(())
        with self._lock:
            if snap is not self._for:
                self._families = self.build(snap, self._for)
                self._for = snap
            return iter(self._families)


class SnapshotCollector(PerSnapshotCollector):
    """gpumon's own series."""

    def __init__(
        self,
        source: Callable[[], Snapshot | None],
        *,
        owner_labels: bool = False,
        node: str | None = None,
        details: frozenset[str] = frozenset(),
        counter_hold: float = 60.0,
    ) -> None:
        """``counter_hold``: seconds a RARE counter shows 0 before its first value (--counter-hold)."""
        super().__init__(source)
        self.owner_labels = owner_labels
        self.node = node
        self.details = details
        self.first = RareCounters(time.time(), counter_hold)

    def describe(self) -> list[Metric]:
        """Every family this collector can yield: lets ``name[]`` filtering and duplicate checks work."""
        return list(Families(M.GPU_FLOW, self.details).values())

    def build(self, snap: Snapshot, previous: Snapshot | None) -> list[Metric]:
        return build_families(
            snap, owner_labels=self.owner_labels, node=self.node, details=self.details, first=self.first
        )
