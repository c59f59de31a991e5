"""Which RDMA NIC is nearest each GPU, from the PCI tree in sysfs, in the categories ``nvidia-smi topo -m``
prints: PIX (one PCIe switch between them), PXB (several), PHB (through the CPU's host bridge), NODE (across
host bridges of one NUMA node), SYS (across the socket link). GPUDirect RDMA lets a NIC read and write GPU
memory directly; it needs the peer-memory module, and pays off where the NIC is near: PIX or PXB.

A device's place is the chain of PCI functions from its root complex down to it, as the resolved
``/sys/bus/pci/devices/<address>`` path names them (``/sys/devices/pci0000:17/0000:17:01.0/0000:18:00.0/
0000:19:02.0/0000:1b:00.0``). Two devices below the same root port share a prefix of that chain; the bridges
left on each side say how far apart they are.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

PATHS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first
NEAR = ("PIX", "PXB")  # where GPUDirect RDMA pays off
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")  # today's module and the older Mellanox one
_ROOT = re.compile(r"^pci[0-9a-fA-F]{4}:[0-9a-fA-F]{2}$")
_FUNCTION = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


@dataclass(frozen=True)
class PciPlace:
    address: str  # 0000:1b:00.0
    root: str  # the root complex, pci0000:17
    chain: tuple[str, ...]  # the functions from the root port down to the device, the device last
    numa_node: int | None


def normalise(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` (an 8-digit domain, upper case) as sysfs names it: ``0000:18:00.0``."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3:
        return f"{parts[0][-4:].rjust(4, '0')}:{parts[1]}:{parts[2]}"
    if len(parts) == 2:
        return f"0000:{parts[0]}:{parts[1]}"
    return bus_id.strip().lower()


def place(sysfs: str, bus_id: str) -> PciPlace | None:
    """Where the PCI function sits, or None where sysfs does not know it (a GPU passed through without its
    bridges, a simulated one)."""
    address = normalise(bus_id)
    if not _FUNCTION.match(address):
        return None
    link = os.path.join(sysfs, "bus", "pci", "devices", address)
    try:
        real = os.path.realpath(link, strict=True)
    except (OSError, RuntimeError):
        return None
    parts = real.split(os.sep)
    roots = [i for i, p in enumerate(parts) if _ROOT.match(p)]
    if not roots:
        return None
    chain = tuple(p for p in parts[roots[-1] + 1 :] if _FUNCTION.match(p))
    if not chain or chain[-1] != address:
        return None
    return PciPlace(address, parts[roots[-1]], chain, _numa(real))


def _numa(device_dir: str) -> int | None:
    try:
        with open(os.path.join(device_dir, "numa_node"), "rb") as f:
            text = f.read(16).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # -1: the platform does not say


def path(a: PciPlace, b: PciPlace) -> str:
    """The PATHS category between two devices."""
    if a.root != b.root:
        # numa_node -1 on both: the platform has one node (or does not say); on one side only: unknown
        return "NODE" if a.numa_node == b.numa_node else "SYS"
    common = 0
    for x, y in zip(a.chain[:-1], b.chain[:-1], strict=False):
        if x != y:
            break
        common += 1
    if common == 0:  # different root ports of one host bridge
        return "PHB"
    # the bridges each side passes below the deepest shared one: a switch's downstream port on each side
    # (or none) is one switch between them
    below = max(len(a.chain) - 1 - common, len(b.chain) - 1 - common)
    return "PIX" if below <= 1 else "PXB"


@dataclass(frozen=True)
class Nearest:
    gpu: str  # the GPU's bus id as NVML gives it
    nic: str  # the RDMA device, e.g. mlx5_0
    path: str  # a PATHS category


def nearest(sysfs: str, gpus: list[str], nics: dict[str, str]) -> list[Nearest]:
    """For each GPU bus id (in NVML's order), the nearest of ``nics`` (RDMA device → its PCI address).
    Among equally near NICs, the one serving the fewest GPUs so far, then the first in ``nics``' order: two
    GPUs and two NICs behind one switch pair off (GPU 0 with the first, GPU 1 with the second), as NCCL
    spreads them. By the PCI tree alone, never by a port's state: a link that goes down must not move its
    GPUs to another NIC (the verdict would then read the other's idleness). GPUs or NICs sysfs does not place
    are left out."""
    placed = {name: p for name, bus in nics.items() if (p := place(sysfs, bus)) is not None}
    order = {name: i for i, name in enumerate(nics)}
    serving: dict[str, int] = dict.fromkeys(placed, 0)
    out = []
    for gpu in gpus:
        g = place(sysfs, gpu)
        if g is None or not placed:
            continue
        paths = {n: path(g, p) for n, p in placed.items()}
        best = min(PATHS.index(v) for v in paths.values())
        name = min(
            (n for n, v in paths.items() if PATHS.index(v) == best), key=lambda n: (serving[n], order[n])
        )
        serving[name] += 1
        out.append(Nearest(gpu, name, paths[name]))
    return out


def peermem(sysfs: str) -> str | None:
    """The loaded GPUDirect RDMA peer-memory module, or None."""
    for module in PEERMEM_MODULES:
        if os.path.isdir(os.path.join(sysfs, "module", module)):
            return module
    return None
