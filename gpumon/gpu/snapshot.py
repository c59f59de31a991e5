"""The immutable result of one sampling sweep. A scrape reads one of these and never touches NVML."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpumon.gpu import xid
from gpumon.gpu.attribution.ownership import OWNER_LABELS, GpuOwnership
from gpumon.gpu.events import EventsView
from gpumon.gpu.types import DriverInfo, GpuInfo, GpuReading
from gpumon.host import HostReading
from gpumon.net.netdev import Netdev
from gpumon.net.rdma import RdmaPort
from gpumon.net.reader import Near


@dataclass(frozen=True, slots=True)
class GpuStatus:
    info: GpuInfo
    up: bool
    reading: GpuReading | None  # this sweep's reading; None while the GPU is down
    duration_seconds: float  # time spent on this GPU in the sweep (the deadline when it timed out)
    last_success: float | None  # unix time of the last successful read
    down_reason: str | None  # e.g. "GpuIsLost in nvmlDeviceGetPowerUsage"
    capabilities: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    name: str
    success: bool
    duration_seconds: float


# error counter key: (gpu index or "", uuid or "", op, kind)
ErrorKey = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class Snapshot:
    timestamp: float  # unix time the sweep finished
    sweep: int  # sweeps completed so far, this one included
    interval_seconds: float
    backend: str
    driver: DriverInfo
    device_count: int  # what NVML counts, identified or not
    gpus: tuple[GpuStatus, ...]
    host: HostReading | None
    collectors: tuple[CollectorStatus, ...]
    errors: Mapping[ErrorKey, int]
    events: EventsView | None = None  # None when the event watcher is off
    owners: Mapping[str, GpuOwnership] | None = None  # uuid → processes' owners; None: attribution off
    nics: tuple[RdmaPort, ...] | None = None  # the node's RDMA ports (gpumon/net); None: --no-nics
    nic_affinity: tuple[Near, ...] = ()  # (GPU uuid, its nearest RDMA device, the PCI path between them)
    nics_at: float | None = None  # unix time the ports were read (the daemon reads them every few seconds)
    nic_peermem: str | None = None  # the GPUDirect RDMA peer-memory module loaded, if any
    netdevs: tuple[Netdev, ...] | None = None  # the physical Ethernet interfaces, read with the ports


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as plain JSON-able data (base units, as in the dataclasses)."""
    return {
        "timestamp": snap.timestamp,
        "sweep": snap.sweep,
        "interval_seconds": snap.interval_seconds,
        "backend": snap.backend,
        "simulated": snap.backend == "sim",
        "replayed": snap.backend == "replay",
        "driver": asdict(snap.driver),
        "device_count": snap.device_count,
        "gpus": [
            {
                **asdict(st.info),
                "up": st.up,
                "down_reason": st.down_reason,
                "last_success": st.last_success,
                "sample_duration_seconds": st.duration_seconds,
                "reading": None if st.reading is None else asdict(st.reading),
                "capabilities": dict(st.capabilities),
                "xids": _xids_json(snap, st.info.uuid),
                "owner": _owner_json(snap, st.info.uuid),
            }
            for st in snap.gpus
        ],
        "events": _events_json(snap),
        "host": None if snap.host is None else asdict(snap.host),
        "nics": None if snap.nics is None else [asdict(p) for p in snap.nics],
        "nic_affinity": [{"uuid": u, "nic": n, "path": p} for u, n, p in snap.nic_affinity],
        "nics_at": snap.nics_at,
        "nic_peermem": snap.nic_peermem,
        "netdevs": None if snap.netdevs is None else [asdict(n) for n in snap.netdevs],
        "errors": [
            {"gpu": gpu, "uuid": uuid, "op": op, "error": kind, "count": count}
            for (gpu, uuid, op, kind), count in sorted(snap.errors.items())
        ],
    }


def _xids_json(snap: Snapshot, uuid: str) -> list[dict[str, Any]]:
    """This GPU's XIDs so far, each with what the catalogue says about it."""
    ev = snap.events
    if ev is None:
        return []
    return [
        {**xid.as_json(code), "count": n, "last": ev.xid_last.get((u, code))}
        for (u, code), n in sorted(ev.xids.items())
        if u == uuid
    ]


def _events_json(snap: Snapshot) -> dict[str, Any] | None:
    ev = snap.events
    if ev is None:
        return None
    return {
        "running": ev.running,
        "reason": ev.reason,
        "recent": [
            {**asdict(e), "xid_info": None if e.xid is None else xid.as_json(e.xid)} for e in ev.recent
        ],
    }


def _owner_json(snap: Snapshot, uuid: str) -> dict[str, Any] | None:
    owned = None if snap.owners is None else snap.owners.get(uuid)
    if owned is None:
        return None
    owner = dict(zip(OWNER_LABELS, owned.owner, strict=True)) if owned.owner else None
    return {"owner": owner, "processes": [asdict(p) for p in owned.processes.values()]}
