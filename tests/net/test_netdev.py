"""Physical Ethernet interfaces from /sys/class/net: a captured tree (tests/fixtures/sysfs/procfs), and trees
no kernel writes."""

from __future__ import annotations

import os
from pathlib import Path

from support.helpers import ROOT

from gpumon.net import netdev
from gpumon.net.netdev import read_netdevs

PROCFS = ROOT / "tests" / "fixtures" / "sysfs" / "procfs"


def test_the_captured_interfaces_read_as_the_kernel_wrote_them() -> None:
    down, up = read_netdevs(str(PROCFS))
    assert (down.name, down.up, down.pci_bus_id) == ("enp162s0f0np0", False, "0000:a2:00.0")
    assert (down.receive_bytes, down.transmit_bytes, down.speed_bytes_per_second) == (0, 0, None)
    assert set(down.errors) == set(netdev.ERRORS) and down.read_errors == ()
    # eth0 of procfs's fixture: 1000 Mb/s and up, without statistics (absent, not 0)
    assert (up.name, up.up, up.speed_bytes_per_second, up.receive_bytes) == ("eth0", True, 1.25e8, None)


def iface(root: Path, name: str, *, kind: str = "1", device: bool = True, **files: str) -> Path:
    base = root / "class" / "net" / name
    (base / "statistics").mkdir(parents=True)
    (base / "type").write_text(kind + "\n")
    if device:
        (root / "devices" / name).mkdir(parents=True)
        os.symlink(root / "devices" / name, base / "device")
    for key, value in {"operstate": "up", "speed": "25000", "statistics/rx_bytes": "10", **files}.items():
        (base / key).write_text(value + "\n")
    return base


def test_virtual_and_ipoib_interfaces_are_left_out(tmp_path: Path) -> None:
    iface(tmp_path, "lo", device=False)
    iface(tmp_path, "docker0", device=False)
    iface(tmp_path, "ibp12s0", kind="32")  # IPoIB: its InfiniBand port counts the traffic
    iface(tmp_path, "ens1f0")
    (got,) = read_netdevs(str(tmp_path))
    assert (got.name, got.up, got.speed_bytes_per_second, got.receive_bytes) == ("ens1f0", True, 25e9 / 8, 10)


def test_values_no_kernel_writes_are_left_out_and_counted(tmp_path: Path) -> None:
    base = iface(tmp_path, "ens1f0", speed="99999999999", **{"statistics/rx_bytes": "1" * 30})
    os.remove(base / "statistics" / "rx_bytes")
    os.mkfifo(base / "statistics" / "rx_bytes")  # a FIFO must not hang the read
    (base / "statistics" / "tx_bytes").write_text("-5\n")
    (base / "operstate").write_text("unknown\n")  # a driver without carrier detection: unknown, not down
    (got,) = read_netdevs(str(tmp_path))
    assert (got.up, got.speed_bytes_per_second, got.receive_bytes, got.transmit_bytes) == (
        None,
        None,
        None,
        None,
    )
    assert set(got.read_errors) == {"speed", "statistics/rx_bytes", "statistics/tx_bytes"}
    (base / "speed").write_text("-1\n")  # no link: unknown, and not an error
    assert read_netdevs(str(tmp_path))[0].read_errors == ("statistics/rx_bytes", "statistics/tx_bytes")


def test_a_tree_with_thousands_of_interfaces_is_cut(tmp_path: Path) -> None:
    for n in range(netdev.MAX_INTERFACES + 20):
        iface(tmp_path, f"ens{n}")
    assert len(read_netdevs(str(tmp_path))) == netdev.MAX_INTERFACES
    assert read_netdevs(str(tmp_path / "none")) == ()


def test_no_kernels_names_fifos_and_virtual_functions(tmp_path: Path) -> None:
    iface(tmp_path, "eth 1")  # whitespace: the kernel refuses such a name
    iface(tmp_path, "eth\n2")
    vf = iface(tmp_path, "ens1f0v0")
    (tmp_path / "devices" / "ens1f0v0" / "physfn").mkdir()  # an SR-IOV VF: its PF counts its traffic
    base = iface(tmp_path, "ens1f0")
    os.remove(base / "speed")
    os.mkfifo(base / "speed")
    (got,) = read_netdevs(str(tmp_path))
    assert got.name == "ens1f0" and got.speed_bytes_per_second is None and got.read_errors == ("speed",)
    assert vf.exists()


def test_a_failing_rdma_read_keeps_the_ethernet_interfaces() -> None:
    from gpumon.net.reader import NicReader

    class Source:
        def ports(self, detail: bool) -> tuple[()]:
            raise OSError("sysfs went away")

        def nearest(self, gpus: list[str], nics: dict[str, str]) -> list[object]:
            return []

        def peermem(self) -> None:
            return None

        def interfaces(self) -> tuple[netdev.Netdev, ...]:
            return (netdev.Netdev("eth0", True, 1.25e8, 1, 2),)

    got = NicReader(Source()).read()  # type: ignore[arg-type]
    assert (
        got.ports is None and not got.ok and got.interfaces is not None and got.interfaces[0].name == "eth0"
    )
