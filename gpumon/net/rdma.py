"""RDMA ports from ``/sys/class/infiniband``: traffic, link state and speed, and the errors operators act on.

Unprivileged and cheap: small text files, read as the kernel writes them (Documentation/ABI/stable/
sysfs-class-infiniband). Every file is optional. A port whose counter reads "N/A (no PMA)" (iWARP adapters
without a performance-management agent) or is missing has that quantity absent; a value that does not parse
is absent too and counted as a read error, and the rest of the port is still read. A device or port that
vanishes mid-read (a reset, a hot unplug) is skipped for that sweep.

``port_rcv_data`` and ``port_xmit_data`` count 4-byte words (octets divided by the 4 lanes); they are
multiplied back to bytes here. Where the driver offers the extended 64-bit counters under ``counters_ext``
(older mlx4 kernels) they are preferred; in ``counters`` the same names are 64-bit wherever the adapter has
extended PMA counters, as every adapter of the last decade does.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

_T = TypeVar("_T")

# the error counters an operator acts on, as the kernel names them (the default exposition's set)
ERRORS = (
    "symbol_error",  # minor link errors on the physical lanes
    "link_error_recovery",  # the link retrained successfully
    "link_downed",  # the link failed to recover and went down
    "port_rcv_errors",  # malformed packets received
    "port_xmit_discards",  # outbound packets dropped because the port was down or congested
)
# more of the port's error and congestion counters (an opt-in detail)
MORE_ERRORS = (
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_rcv_constraint_errors",
    "port_xmit_constraint_errors",
    "VL15_dropped",
)
# RoCE congestion control and transport retries, where the driver has them (mlx5 hw_counters)
HW_COUNTERS = (
    "np_cnp_sent",  # congestion notifications this port sent as a receiver of ECN-marked packets
    "np_ecn_marked_roce_packets",  # packets that arrived ECN-marked: the fabric is congested towards here
    "rp_cnp_handled",  # congestion notifications this port received and slowed down for
    "out_of_sequence",  # packets received out of order: drops somewhere on the path
    "packet_seq_err",
    "local_ack_timeout_err",  # the transport retransmitted for want of an ACK
    "rnr_nak_retry_err",
    "out_of_buffer",  # packets dropped for want of a receive buffer
)
# the transport's retries (packets lost on the path and sent again: RoCE on a lossy fabric) and the
# congestion notifications this port slowed down for: read always for the verdict, exported with nic-detail
RETRANSMITS = ("local_ack_timeout_err", "out_of_sequence", "packet_seq_err")
CONGESTION = ("rp_cnp_handled",)
NA = "N/A"  # what a counter without a performance-management agent reads
MAX_VALUE_BYTES = 256  # a sysfs attribute is at most a page; these are one short line
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec", re.IGNORECASE)
_STATE = re.compile(r"^\s*(\d+)\s*:\s*(\S.*?)\s*$")


@dataclass(frozen=True, slots=True)
class RdmaPort:
    device: str  # the RDMA device, e.g. mlx5_0
    port: int
    link_layer: str | None  # "InfiniBand" or "Ethernet" (RoCE)
    state: str | None  # the logical state: ACTIVE, INIT, DOWN, ...
    phys_state: str | None  # the physical state: LinkUp, Polling, Disabled, ...
    rate_bytes_per_second: float | None  # the link's signalling rate, from e.g. "400 Gb/sec (4X NDR)"
    receive_bytes: int | None
    transmit_bytes: int | None
    receive_packets: int | None
    transmit_packets: int | None
    errors: dict[str, int] = field(default_factory=dict)  # ERRORS and MORE_ERRORS the port has
    hw_counters: dict[str, int] = field(default_factory=dict)  # HW_COUNTERS the driver has
    pci_bus_id: str | None = None  # the adapter's PCI function, from the device link
    board_id: str | None = None
    fw_ver: str | None = None
    read_errors: tuple[str, ...] = ()  # files whose content did not parse, relative to the device

    @property
    def up(self) -> bool | None:
        """Whether the port is ACTIVE; None where its state could not be read (unknown, not down)."""
        return None if self.state is None else self.state == "ACTIVE"


class _NotSysfs(str):
    """What a file that no kernel writes reads as (a FIFO, a device, a directory): counted, never parsed."""


NOT_SYSFS = _NotSysfs("")


def _text(path: str) -> str | None:
    """The file's first line; None where it is missing, unreadable or gone; NOT_SYSFS where it is no
    regular file. Opened without blocking and read up to MAX_VALUE_BYTES: --sys-root may name any tree, and
    a FIFO in it must not hang the sweep."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return NOT_SYSFS
        raw = os.read(fd, MAX_VALUE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    return raw.decode("ascii", "replace").strip().split("\n", 1)[0].strip()


MAX_COUNTER = 2**64 - 1  # the kernel's counters are at most 64-bit


def _count(path: str, bad: list[str], name: str) -> int | None:
    text = _text(path)
    if text is None or text.startswith(NA):
        return None
    if text.isascii() and text.isdigit() and len(text) <= 20 and int(text) <= MAX_COUNTER:
        return int(text)
    bad.append(name)
    return None


MAX_RATE_GBPS = 10_000.0  # far above any link (XDR is 800 Gb/s a port): a larger rate is no kernel's


def parse_rate(text: str | None) -> float | None:
    """``400 Gb/sec (4X NDR)`` → 5e10 bytes/s; ``2.5 Gb/sec (1X SDR)`` → 3.125e8. None for what is no link
    rate, 0 included (a share of line rate would divide by it)."""
    m = _RATE.match(text or "")
    if m is None or len(m.group(1)) > 12:
        return None
    gbps = float(m.group(1))
    return gbps * 1e9 / 8 if 0 < gbps <= MAX_RATE_GBPS else None


def parse_state(text: str | None) -> str | None:
    """``4: ACTIVE`` → ``ACTIVE``; ``5: LinkUp`` → ``LinkUp``."""
    m = _STATE.match(text or "")
    return None if m is None or not m.group(2).isascii() else m.group(2)


def _parsed(path: str, parse: Callable[[str | None], _T | None], bad: list[str], name: str) -> _T | None:
    """A file parsed by ``parse``; one that is there but does not parse is counted in ``bad``."""
    text = _text(path)
    value = parse(text)
    if value is None and text:  # present, not empty, and not what a kernel writes
        bad.append(name)
    return value


def _pci_bus_id(device_dir: str) -> str | None:
    try:
        target = os.readlink(os.path.join(device_dir, "device"))
    except OSError:
        return None
    name = os.path.basename(target.rstrip("/"))
    return name if re.fullmatch(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", name) else None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def read_port(device_dir: str, device: str, port: int, *, detail: bool = False) -> RdmaPort | None:
    """One port of one device, or None when the port is gone. ``detail`` also reads MORE_ERRORS and every
    HW_COUNTERS (without it, the RETRANSMITS and CONGESTION ones)."""
    base = os.path.join(device_dir, "ports", str(port))
    if not os.path.isdir(base):
        return None
    bad: list[str] = []
    counters, ext = os.path.join(base, "counters"), os.path.join(base, "counters_ext")

    def counter(name: str) -> int | None:
        return _count(os.path.join(counters, name), bad, f"ports/{port}/counters/{name}")

    def extended(name: str, scale: int = 1) -> int | None:
        # one source per counter, chosen by which file exists, never by what it reads this time: a read
        # that fails once ("N/A (no PMA)" when a query times out) must not switch a 64-bit series to the
        # 32-bit one for a sweep, which Prometheus would take for a reset and a huge rise
        wide = os.path.join(ext, f"{name}_64")
        if os.path.exists(wide):
            value = _count(wide, bad, f"ports/{port}/counters_ext/{name}_64")
        else:
            value = counter(name)
        return None if value is None else value * scale

    names = ERRORS + (MORE_ERRORS if detail else ())
    errors = {n: v for n in names if (v := counter(n)) is not None}
    hw: dict[str, int] = {}
    hwdir = os.path.join(base, "hw_counters")
    if os.path.isdir(hwdir):  # mlx5 has them; most other drivers, and InfiniBand ports of some, do not
        hw = {
            n: v
            for n in (HW_COUNTERS if detail else RETRANSMITS + CONGESTION)
            if (v := _count(os.path.join(hwdir, n), bad, f"ports/{port}/hw_counters/{n}")) is not None
        }
    read = RdmaPort(
        device=device,
        port=port,
        link_layer=_text(os.path.join(base, "link_layer")) or None,
        state=_parsed(os.path.join(base, "state"), parse_state, bad, f"ports/{port}/state"),
        phys_state=_parsed(os.path.join(base, "phys_state"), parse_state, bad, f"ports/{port}/phys_state"),
        rate_bytes_per_second=_parsed(os.path.join(base, "rate"), parse_rate, bad, f"ports/{port}/rate"),
        receive_bytes=extended("port_rcv_data", 4),
        transmit_bytes=extended("port_xmit_data", 4),
        receive_packets=extended("port_rcv_packets"),
        transmit_packets=extended("port_xmit_packets"),
        errors=errors,
        hw_counters=hw,
        pci_bus_id=_pci_bus_id(device_dir),
        board_id=_text(os.path.join(device_dir, "board_id")) or None,
        fw_ver=_text(os.path.join(device_dir, "fw_ver")) or None,
        read_errors=tuple(bad),
    )
    return read if os.path.isdir(base) else None  # gone while it was read: nothing of it is trustworthy


# a node has a handful of adapters; a tree with thousands (a hostile or broken sysfs) is cut here
MAX_PORTS = 64
_PORT = re.compile(r"[1-9][0-9]{0,2}")  # ASCII digits only ("²" is a digit to str.isdigit, not to int())


def label(name: str) -> str:
    """A directory name as a label value: root may rename an RDMA device to any bytes, and an undecodable
    one (a surrogate, as os.listdir returns it) would make every exposition and JSON document fail."""
    return os.fsencode(name).decode("utf-8", "replace")


def read_ports(sysfs: str = "/sys", *, detail: bool = False) -> tuple[RdmaPort, ...]:
    """Every port of every RDMA device under ``sysfs``/class/infiniband, in name order (at most
    MAX_PORTS). No devices (no RDMA driver loaded): an empty tuple."""
    root = os.path.join(sysfs, "class", "infiniband")
    out: list[RdmaPort] = []
    names: set[str] = set()
    for entry in _listdir(root):
        device_dir = os.path.join(root, entry)
        name = label(entry)
        if name in names:  # two undecodable names that read alike: one series, the first
            continue
        names.add(name)
        # the kernel names ports 1, 2, ...: "01" (a link planted beside "1") would serve port 1 twice
        ports = sorted(int(p) for p in _listdir(os.path.join(device_dir, "ports")) if _PORT.fullmatch(p))
        for port in ports:
            if len(out) >= MAX_PORTS:
                return tuple(out)
            read = read_port(device_dir, name, port, detail=detail)
            if read is not None:
                out.append(read)
    return tuple(out)
