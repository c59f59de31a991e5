"""The node's physical Ethernet interfaces, from sysfs (/sys/class/net): traffic, link state and speed, and
the error counters operators act on.

A training job's collectives go over RDMA (the ports of /sys/class/infiniband, rdma.py), but not always:
NCCL falls back to TCP sockets when RDMA is not usable, jobs on plain Ethernet nodes use them, and the
checkpoints and data go over the same interfaces. Only interfaces with a PCI function (``device``) and
of ARP type Ethernet (1) are read: loopback, bridges, veths and tunnels have no device, IPoIB netdevs
(type 32) carry what their InfiniBand port's counters already count, and SR-IOV virtual functions
(``device/physfn``) what their physical function's interface counts. node_exporter's netdev collector reads
every interface and counter; this is the GPU node's short list.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gpumon.net.rdma import NOT_SYSFS, _count, _listdir, _pci_bus_id, _text, label

ETHERNET = "1"  # ARPHRD_ETHER in the interface's type file
# the errors an operator acts on, as the kernel names them in statistics/
ERRORS = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "rx_crc_errors", "tx_carrier_errors")
MAX_INTERFACES = 32  # a GPU node has a handful; a tree with thousands (hostile, broken) is cut here
MAX_MBPS = 10_000_000  # 10 Tb/s: a larger speed is no kernel's


@dataclass(frozen=True, slots=True)
class Netdev:
    name: str
    up: bool | None  # operstate "up"; None where it is unknown (no carrier detection, or unreadable)
    speed_bytes_per_second: float | None  # None: unknown (no link, or a driver that does not say)
    receive_bytes: int | None
    transmit_bytes: int | None
    errors: dict[str, int] = field(default_factory=dict)
    pci_bus_id: str | None = None
    read_errors: tuple[str, ...] = ()  # files whose content did not parse


def read_netdevs(sysfs: str = "/sys") -> tuple[Netdev, ...]:
    """Every physical Ethernet interface under ``sysfs``/class/net, in name order (at most
    MAX_INTERFACES)."""
    root = os.path.join(sysfs, "class", "net")
    out: list[Netdev] = []
    names: set[str] = set()
    for entry in _listdir(root):
        base = os.path.join(root, entry)
        name = label(entry)
        # the kernel refuses names with whitespace or '/' (dev_valid_name); a tree with one is no kernel's
        if name in names or not name.isprintable() or any(c.isspace() for c in name):
            continue
        if not os.path.islink(os.path.join(base, "device")):
            continue
        if os.path.lexists(os.path.join(base, "device", "physfn")):  # an SR-IOV VF: its PF's uplink counts
            continue
        if _text(os.path.join(base, "type")) != ETHERNET:
            continue
        names.add(name)
        if len(out) >= MAX_INTERFACES:
            break
        read = read_netdev(base, name)
        if read is not None:
            out.append(read)
    return tuple(out)


def read_netdev(base: str, name: str) -> Netdev | None:
    """One interface, or None when it went while it was read."""
    bad: list[str] = []
    stats = os.path.join(base, "statistics")

    def counter(key: str) -> int | None:
        return _count(os.path.join(stats, key), bad, f"statistics/{key}")

    state = _text(os.path.join(base, "operstate"))
    read = Netdev(
        name=name,
        up=None if state in (None, "", "unknown") else state == "up",
        speed_bytes_per_second=_speed(_text(os.path.join(base, "speed")), bad),
        receive_bytes=counter("rx_bytes"),
        transmit_bytes=counter("tx_bytes"),
        errors={k: v for k in ERRORS if (v := counter(k)) is not None},
        pci_bus_id=_pci_bus_id(base),
        read_errors=tuple(bad),
    )
    return read if os.path.isdir(base) else None


def _speed(text: str | None, bad: list[str]) -> float | None:
    """Mb/s as the kernel writes it; -1 (or an error reading it: no link) is unknown."""
    if text is NOT_SYSFS:
        bad.append("speed")
        return None
    if not text or text == "-1":
        return None
    if text.isascii() and text.isdigit() and 0 < int(text) <= MAX_MBPS:
        return int(text) * 125_000.0
    if text != "0":
        bad.append("speed")
    return None
