"""The network part of ``gpumon doctor``: the RDMA ports found, each GPU's nearest NIC, GPUDirect RDMA, and
what to fix about them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpumon.net.affinity import NEAR
from gpumon.net.rdma import RdmaPort
from gpumon.net.reader import Near


@dataclass
class NetReport:
    ports: list[dict[str, Any]] = field(default_factory=list)
    nearest: list[dict[str, Any]] = field(default_factory=list)  # per GPU: its index, nearest NIC, path
    peermem: str | None = None  # the GPUDirect RDMA module loaded, if any
    advice: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def report(
    gpus: dict[str, int], ports: tuple[RdmaPort, ...] | None, near: tuple[Near, ...], peermem: str | None
) -> NetReport:
    """``gpus``: each GPU's index by uuid; ``ports``, ``near`` and ``peermem``: what the sampler read and
    worked out (net/reader.py; ports None: --no-nics)."""
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
    r.nearest = [{"gpu": gpus[uuid], "nic": nic, "path": path} for uuid, nic, path in near if uuid in gpus]
    r.peermem = peermem
    far = [n for n in r.nearest if n["path"] == "SYS"]
    if far:
        r.advice.append(
            f"The nearest RDMA NIC of GPU {', '.join(str(n['gpu']) for n in far)} is across the socket link "
            "(SYS): its traffic to other nodes crosses the CPUs' interconnect. Place a NIC on that socket, "
            "or keep those GPUs out of multi-node jobs."
        )
    present = {p.device for p in ports}
    gone = sorted({n["nic"] for n in r.nearest if n["nic"] not in present})
    if gone:
        gpus_of = {nic: [str(n["gpu"]) for n in r.nearest if n["nic"] == nic] for nic in gone}
        r.advice.append(
            "RDMA device "
            + "; ".join(f"{nic} (nearest NIC of GPU {', '.join(gpus_of[nic])})" for nic in gone)
            + " is gone from /sys/class/infiniband: an adapter reset or unplugged, or its driver unloaded. "
            "Check dmesg and `ibstat`; the GPUs' traffic to other nodes now crosses a farther NIC or fails."
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
