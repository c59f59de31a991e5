"""The sampler's view of the NICs: the latest reading of the RDMA ports and each GPU's nearest NIC.

Reading an mlx5 port's counters, state or rate is a firmware command on a real adapter, each with a
firmware timeout of a minute. So the daemon reads them on a thread of their own, every READ_EVERY seconds,
and the GPU sweep only picks up the latest reading: a sick adapter costs the NIC series (the nic collector
fails once a read runs past STUCK_AFTER, and a reading older than that is dropped), never the GPUs'.
One-off commands (snapshot, doctor) read in the caller.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpumon.net.affinity import Nearest, nearest, normalise, peermem
from gpumon.net.netdev import Netdev, read_netdevs
from gpumon.net.rdma import RdmaPort, read_ports

READ_EVERY = 5.0  # seconds between reads in the daemon: rates over a minute still get a dozen points
STUCK_AFTER = 30.0  # a read running this long, or a reading this old, fails the nic collector

Near = tuple[str, str, str]  # a GPU's uuid, its nearest RDMA device, the path between them (affinity.PATHS)


class NicSource(Protocol):
    """Where the ports come from: this host's sysfs (SysfsNics), or simulated NICs (net/simulated.py)."""

    def ports(self, detail: bool) -> tuple[RdmaPort, ...]: ...

    def nearest(self, gpus: list[str], nics: dict[str, str]) -> list[Nearest]: ...

    def peermem(self) -> str | None: ...

    def interfaces(self) -> tuple[Netdev, ...]: ...


class SysfsNics:
    def __init__(self, sysfs: str = "/sys") -> None:
        self.sysfs = sysfs

    def ports(self, detail: bool) -> tuple[RdmaPort, ...]:
        return read_ports(self.sysfs, detail=detail)

    def nearest(self, gpus: list[str], nics: dict[str, str]) -> list[Nearest]:
        return nearest(self.sysfs, gpus, nics)

    def peermem(self) -> str | None:
        return peermem(self.sysfs)

    def interfaces(self) -> tuple[Netdev, ...]:
        return read_netdevs(self.sysfs)


@dataclass(frozen=True)
class NicReading:
    ports: tuple[RdmaPort, ...] | None  # None: no reading to serve (none yet, or the last is too old)
    nearest: tuple[Near, ...]
    ok: bool
    duration_seconds: float
    seq: int  # readings made so far: a new one carries new read errors to count
    error: BaseException | None = None
    at: float | None = None  # when the ports were read, wall clock (their counters' time, for rates)
    peermem: str | None = None  # the GPUDirect RDMA module loaded, if any
    interfaces: tuple[Netdev, ...] | None = None  # the physical Ethernet interfaces, read with the ports


class NicReader:
    """``source``: a sysfs root, or a NicSource; ``every``: seconds between reads on a thread of this
    reader's own; None reads in the caller."""

    def __init__(
        self,
        source: str | NicSource = "/sys",
        *,
        detail: bool = False,
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.source: NicSource = SysfsNics(source) if isinstance(source, str) else source
        self.detail = detail
        self.every = every
        self.clock = clock
        self.wall = wall
        self._lock = threading.Lock()
        self._ports: tuple[RdmaPort, ...] | None = None
        self._error: BaseException | None = None
        self._at: float | None = None
        self._peermem: str | None = None
        self._interfaces: tuple[Netdev, ...] | None = None
        self._when = 0.0  # when the last reading was made
        self._duration = 0.0
        self._seq = 0
        self._started: float | None = None  # when the read in progress began
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._key: tuple[object, ...] | None = None
        self._nearest: tuple[Near, ...] = ()

    def read(self, gpus: Sequence[tuple[str, str]] = ()) -> NicReading:
        """The latest reading, and each GPU's nearest NIC; ``gpus``: each GPU's uuid and NVML bus id."""
        if self.every is None:
            self._read_once()
        elif self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpumon-nics", daemon=True)
            self._thread.start()
        now = self.clock()
        with self._lock:
            ports, error, seq, duration = self._ports, self._error, self._seq, self._duration
            at, module, interfaces = self._at, self._peermem, self._interfaces
            stuck = self._started is not None and now - self._started > STUCK_AFTER
            stale = seq > 0 and now - self._when > STUCK_AFTER and self.every is not None
        if stale:
            ports = interfaces = None
        ok = error is None and not stuck and not stale
        near = self._near(gpus, ports or ())
        return NicReading(ports, near, ok, duration, seq, error, at, module, interfaces)

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._read_once()
            self._stop.wait(self.every or READ_EVERY)

    def _read_once(self) -> None:
        t0 = self.clock()
        with self._lock:
            self._started = t0
        module = None
        interfaces: tuple[Netdev, ...] | None = None
        try:
            ports: tuple[RdmaPort, ...] | None = self.source.ports(self.detail)
            module = self.source.peermem()
            error = None
        except Exception as exc:  # a sysfs no kernel writes: the NIC series go, nothing else
            ports, error = None, exc
        try:
            interfaces = self.source.interfaces()
        except Exception as exc:  # the Ethernet interfaces go, the RDMA ports stay
            error = error or exc
        t1, at = self.clock(), self.wall()
        with self._lock:
            self._ports, self._error, self._at, self._peermem = ports, error, at, module
            self._interfaces = interfaces
            self._when, self._duration, self._started = t1, t1 - t0, None
            self._seq += 1

    def _near(self, gpus: Sequence[tuple[str, str]], ports: tuple[RdmaPort, ...]) -> tuple[Near, ...]:
        adapters = candidates(ports)
        key = (tuple(gpus), tuple(adapters.items()))
        if key != self._key:
            uuid = {normalise(bus): u for u, bus in gpus}
            found = self.source.nearest([bus for _, bus in gpus], adapters)
            fresh = {uuid[normalise(n.gpu)]: (n.nic, n.path) for n in found}
            # a GPU whose nearest NIC vanished (an adapter reset or unplugged, its driver unloaded) keeps it:
            # the verdict must see its NIC gone, not read another NIC's idleness
            present = {u for u, _ in gpus}
            kept = {u: (nic, p) for u, nic, p in self._nearest if nic not in adapters and u in present}
            merged = {**fresh, **kept}
            self._nearest = tuple((u, *merged[u]) for u, _ in gpus if u in merged)
            self._key = key
        return self._nearest


def candidates(ports: tuple[RdmaPort, ...]) -> dict[str, str]:
    """Each adapter's PCI address, by name as a person counts (mlx5_2 before mlx5_10): the order a GPU's
    nearest is chosen in among equally near ones, whatever the ports' state."""
    out: dict[str, str] = {}
    for p in sorted(ports, key=lambda p: _natural(p.device)):
        if p.pci_bus_id:
            out.setdefault(p.device, p.pci_bus_id)
    return out


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))
