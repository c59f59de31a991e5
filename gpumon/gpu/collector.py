"""Snapshot → Prometheus metric families. A scrape never calls NVML.

NVML calls cost about a millisecond each (the PCIe throughput call 20 ms), and prometheus_client runs
``collect()`` on the server's event loop: sampling therefore happens in the background (gpumon.gpu.sampler)
and a scrape only formats the latest immutable snapshot. Families are built once per snapshot and reused by
every scrape until the next sweep replaces it.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumon import __version__
from gpumon import metrics as M
from gpumon.gpu import xid as xids
from gpumon.gpu.attribution.ownership import OWNER_LABELS, GpuOwnership, OwnedProcess
from gpumon.gpu.events import EventsView
from gpumon.gpu.snapshot import GpuStatus, Snapshot
from gpumon.gpu.types import THROTTLE_REASONS, MigReading

Family = GaugeMetricFamily | CounterMetricFamily
_ECC_TYPES = ("corrected", "uncorrected")
# series that already say who owns what, or are not about one GPU's work
_OWNER_EXEMPT = {M.GPU_INFO.name, M.GPU_OWNER.name, M.PROCESS_INFO.name, M.ERRORS.name}


def _family(m: M.Metric) -> Family:
    cls = CounterMetricFamily if m.type == "counter" else GaugeMetricFamily
    return cls(m.name, m.help, labels=m.labels)


def _add_fields(
    f: dict[str, Family], labels: list[str], source: object, fields: Iterable[tuple[M.Metric, str]]
) -> None:
    """One sample per (metric, attribute of ``source``) whose value is known: unknown is absent, not 0."""
    for metric, attr in fields:
        value = getattr(source, attr)
        if value is not None:
            f[metric.name].add_metric(labels, value)


def _add_gpu(f: dict[str, Family], st: GpuStatus) -> None:
    info = st.info
    gl = [str(info.index), info.uuid]
    f[M.GPU_INFO.name].add_metric(
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
    f[M.GPU_UP.name].add_metric(gl, 1 if st.up else 0)
    f[M.GPU_SAMPLE_DURATION.name].add_metric(gl, st.duration_seconds)
    if st.last_success is not None:
        f[M.GPU_LAST_SAMPLE.name].add_metric(gl, st.last_success)
    static = (
        (M.PERSISTENCE, info.persistence_mode),
        (M.SM_CLOCK_MAX, info.sm_clock_max_hz),
        (M.MEM_CLOCK_MAX, info.memory_clock_max_hz),
        (M.PCIE_GEN_MAX, info.pcie_link_max_generation),
        (M.PCIE_WIDTH_MAX, info.pcie_link_max_width),
    )
    for metric, value in static:
        if value is not None:
            f[metric.name].add_metric(gl, value)
    if info.nvlink_count:
        f[M.NVL_LINKS.name].add_metric(gl, info.nvlink_count)

    r = st.reading
    if r is None:  # down: only the health series above, no stale values
        return
    _add_fields(f, gl, r, ((m, m.field) for m in M.GPU_SCALARS if m.field is not None))
    if r.throttle_reasons is not None:
        active = f[M.THROTTLE_ACTIVE.name]
        for bit, reason, _ in THROTTLE_REASONS:
            active.add_metric([*gl, reason], 1 if r.throttle_reasons & bit else 0)
    for reason, seconds in r.throttle_seconds.items():
        f[M.THROTTLE_SECONDS.name].add_metric([*gl, reason], seconds)
    for metric, pair in (
        (M.ECC, (r.ecc_corrected_errors, r.ecc_uncorrected_errors)),
        (M.ECC_LIFETIME, (r.ecc_corrected_errors_lifetime, r.ecc_uncorrected_errors_lifetime)),
        (M.REMAPPED, (r.remapped_rows_correctable, r.remapped_rows_uncorrectable)),
    ):
        for kind, value in zip(_ECC_TYPES, pair, strict=True):
            if value is not None:
                f[metric.name].add_metric([*gl, kind], value)
    p = r.profiling
    if p is not None:
        f[M.PROFILING_INFO.name].add_metric([*gl, p.source], 1)
        _add_fields(f, gl, p, M.PROFILING_FIELDS)
    _add_mig(f, gl, r.mig or ())
    for link in r.nvlinks:
        ll = [*gl, str(link.link)]
        if link.up is not None:
            f[M.NVL_LINK_UP.name].add_metric(ll, 1 if link.up else 0)
        if link.transmit_bytes is not None:
            f[M.NVL_LINK_TX.name].add_metric(ll, link.transmit_bytes)
        if link.receive_bytes is not None:
            f[M.NVL_LINK_RX.name].add_metric(ll, link.receive_bytes)


def _add_mig(f: dict[str, Family], gl: list[str], migs: tuple[MigReading, ...]) -> None:
    instances_done: set[int] = set()
    for m in migs:
        gi = [*gl, str(m.gpu_instance_id)]
        f[M.MIG_INFO.name].add_metric([*gi, str(m.compute_instance_id), m.uuid, m.profile], 1)
        # memory and GPM are the GPU instance's: compute instances sharing one each report all of it
        if m.gpu_instance_id in instances_done:
            continue
        instances_done.add(m.gpu_instance_id)
        if m.memory_total_bytes is not None:
            f[M.MIG_MEM_TOTAL.name].add_metric(gi, m.memory_total_bytes)
        if m.memory_used_bytes is not None:
            f[M.MIG_MEM_USED.name].add_metric(gi, m.memory_used_bytes)
        if m.profiling is not None:
            _add_fields(f, gi, m.profiling, M.MIG_PROFILING_FIELDS)


def _add_processes(f: dict[str, Family], st: GpuStatus, ownership: GpuOwnership | None) -> None:
    gl = [str(st.info.index), st.info.uuid]
    if ownership is not None and ownership.owner is not None:
        f[M.GPU_OWNER.name].add_metric([*gl, *ownership.owner], 1)
    procs = st.reading.processes if st.reading is not None else None
    if procs is None:
        return
    f[M.GPU_PROCESSES.name].add_metric(gl, len(procs))
    owned = ownership.processes if ownership is not None else {}
    for p in procs:
        pl = [*gl, str(p.pid)]
        o = owned.get(p.pid) or OwnedProcess(p.pid)
        f[M.PROCESS_INFO.name].add_metric(
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
                f[metric.name].add_metric(pl, value)


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


def _add_events(f: dict[str, Family], ev: EventsView, index: dict[str, str]) -> None:
    for (op, kind), n in ev.errors.items():
        f[M.ERRORS.name].add_metric(["", "", op, kind], n)
    for uuid, labels in ev.registered.items():
        for label in labels:
            f[M.EVENTS_REGISTERED.name].add_metric([index.get(uuid, ""), uuid, label], 1)
    for (uuid, label), n in ev.counts.items():
        f[M.EVENTS.name].add_metric([index.get(uuid, ""), uuid, label], n)
    for (uuid, label), t in ev.last.items():
        f[M.EVENT_LAST.name].add_metric([index.get(uuid, ""), uuid, label], t)
    seen = set()
    for (uuid, code), n in ev.xids.items():
        f[M.XID_ERRORS.name].add_metric([index.get(uuid, ""), uuid, str(code)], n)
        f[M.XID_LAST.name].add_metric([index.get(uuid, ""), uuid, str(code)], ev.xid_last[(uuid, code)])
        seen.add(code)
    for code in sorted(seen):
        x = xids.lookup(code)
        f[M.XID_INFO.name].add_metric(
            [str(code), x.description, x.severity.value, x.cause.value, x.action], 1
        )


def build_families(snap: Snapshot, *, owner_labels: bool = False, node: str | None = None) -> list[Metric]:
    f: dict[str, Family] = {m.name: _family(m) for m in M.GPU_FLOW}
    f[M.BUILD_INFO.name].add_metric([__version__, platform.python_version(), snap.backend], 1)
    if node is not None:
        f[M.NODE_INFO.name].add_metric([node], 1)
    d = snap.driver
    if d.driver_version or d.nvml_version:  # absent while the daemon waits for the driver to load
        f[M.DRIVER_INFO.name].add_metric([d.driver_version, d.cuda_driver_version, d.nvml_version], 1)
    f[M.DEVICE_COUNT.name].add_metric([], snap.device_count)
    f[M.SAMPLE_INTERVAL.name].add_metric([], snap.interval_seconds)
    f[M.LAST_SAMPLE.name].add_metric([], snap.timestamp)
    f[M.SAMPLES.name].add_metric([], snap.sweep)
    for c in snap.collectors:
        f[M.COLLECTOR_SUCCESS.name].add_metric([c.name], 1 if c.success else 0)
        f[M.COLLECTOR_DURATION.name].add_metric([c.name], c.duration_seconds)
    for key, count in snap.errors.items():
        f[M.ERRORS.name].add_metric(list(key), count)
    for st in snap.gpus:
        _add_gpu(f, st)
        _add_processes(f, st, None if snap.owners is None else snap.owners.get(st.info.uuid))
    if snap.events is not None:
        _add_events(f, snap.events, {st.info.uuid: str(st.info.index) for st in snap.gpus})
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
            f[metric.name].add_metric([], value)
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
        self, source: Callable[[], Snapshot | None], *, owner_labels: bool = False, node: str | None = None
    ) -> None:
        super().__init__(source)
        self.owner_labels = owner_labels
        self.node = node

    def describe(self) -> list[Metric]:
        """Every family this collector can yield: lets ``name[]`` filtering and duplicate checks work."""
        return [_family(m) for m in M.GPU_FLOW]

    def build(self, snap: Snapshot, previous: Snapshot | None) -> list[Metric]:
        return build_families(snap, owner_labels=self.owner_labels, node=self.node)
