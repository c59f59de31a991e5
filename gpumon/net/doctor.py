"""The network part of ``gpumon doctor``: the RDMA ports found, each GPU's nearest NIC, GPUDirect RDMA, and
what to fix about them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpumon.net.affinity import NEAR, nearest, normalise, peermem
from gpumon.net.rdma import RdmaPort
from gpumon.net.reader import candidates


@dataclass
class NetReport:
    ports: list[dict[str, Any]] = field(default_factory=list)
    nearest: list[dict[str, Any]] = field(default_factory=list)  # per GPU: its index, nearest NIC, path
    peermem: str | None = None  # the GPUDirect RDMA module loaded, if any
    advice: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def report(sysfs: str, gpus: list[tuple[int, str]], ports: tuple[RdmaPort, ...] | None) -> NetReport:
    """``gpus``: each GPU's index and NVML bus id; ``ports``: what the sampler read (None: --no-nics)."""
    r = NetReport()
    if not ports:
        return r
    r.ports = [
        {
            "device": p.device,
            "port": p.port,
            "link_layer": p.link_layer,
            "state": p.state,
            "rate_bytes_per_second": p.rate_bytes_per_second,
            "pci_bus_id": p.pci_bus_id,
        }
        for p in ports
    ]
    adapters = candidates(ports)
    index = {normalise(bus): i for i, bus in gpus}
    found = nearest(sysfs, [bus for _, bus in gpus], adapters)
    r.nearest = [{"gpu": index[normalise(n.gpu)], "nic": n.nic, "path": n.path} for n in found]
    r.peermem = peermem(sysfs)
    far = [n for n in r.nearest if n["path"] == "SYS"]
    if far:
        r.advice.append(
            f"The nearest RDMA NIC of GPU {', '.join(str(n['gpu']) for n in far)} is across the socket link "
            "(SYS): its traffic to other nodes crosses the CPUs' interconnect. Place a NIC on that socket, "
            "or keep those GPUs out of multi-node jobs."
        )
    down = sorted({f"{p.device}/{p.port}" for p in ports if p.up is False})
    if down:
        r.advice.append(f"RDMA port {', '.join(down)} is not ACTIVE: check its cable and `ibstat`.")
    if r.nearest and r.peermem is None and any(n["path"] in NEAR for n in r.nearest):
        r.advice.append(
            "GPUDirect RDMA is off: no peer-memory module (nvidia_peermem) is loaded, so NICs copy GPU "
            "memory through host memory. `modprobe nvidia_peermem` (the driver ships it), or use NCCL's "
            "DMA-BUF path on a kernel and open driver that support it."
        )
    return r
