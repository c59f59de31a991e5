"""RDMA ports read from captured sysfs trees of real hosts (tests/fixtures/sysfs/README.md) and from hostile
ones: missing files, garbage, huge files, devices that vanish, more ports than a node has."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.helpers import ROOT

from gpumon.net.rdma import ERRORS, MAX_PORTS, RdmaPort, parse_rate, parse_state, read_port, read_ports

FIXTURES = ROOT / "tests" / "fixtures" / "sysfs"
PROCFS, NODE_EXPORTER = str(FIXTURES / "procfs"), str(FIXTURES / "node_exporter")


def by_name(ports: tuple[RdmaPort, ...]) -> dict[tuple[str, int], RdmaPort]:
    return {(p.device, p.port): p for p in ports}


def test_procfs_hosts_read_as_procfs_itself_expects_them() -> None:
    ports = by_name(read_ports(PROCFS, detail=True))
    assert sorted(ports) == [("hfi1_0", 1), ("mlx4_0", 1), ("mlx4_0", 2), ("mlx5_0", 1)]
    mlx5 = ports[("mlx5_0", 1)]
    # procfs's class_infiniband_test.go expects these for the same files
    assert mlx5.rate_bytes_per_second == 3_125_000_000
    assert mlx5.receive_bytes == 72_505_381_512 and mlx5.transmit_bytes == 11_523_046_035_392
    assert (mlx5.state, mlx5.phys_state, mlx5.link_layer, mlx5.up) == ("ACTIVE", "ACTIVE", "InfiniBand", True)
    assert set(mlx5.errors) >= set(ERRORS) and mlx5.errors["symbol_error"] == 0
    # RoCE transport counters where the driver has them; the congestion ones this adapter lacks stay absent
    assert {"out_of_sequence", "local_ack_timeout_err", "out_of_buffer"} <= set(mlx5.hw_counters)
    assert "np_cnp_sent" not in mlx5.hw_counters
    assert (mlx5.board_id, mlx5.fw_ver, mlx5.read_errors) == ("SM_2001000001034", "14.28.2006", ())
    assert ports[("hfi1_0", 1)].rate_bytes_per_second == 100e9 / 8
    assert ports[("mlx4_0", 2)].link_layer == "InfiniBand"  # its file has a blank line after the value


def test_an_iwarp_adapter_without_a_performance_agent_has_its_counters_absent_not_zero() -> None:
    (port,) = [p for p in read_ports(NODE_EXPORTER) if p.device == "i40iw0"]
    assert (port.receive_bytes, port.transmit_bytes, port.receive_packets, port.errors) == (
        None,
        None,
        None,
        {},
    )
    assert port.rate_bytes_per_second == 10e9 / 8 and port.read_errors == ()


def test_the_legacy_extended_counters_are_preferred_where_the_driver_has_them() -> None:
    port = by_name(read_ports(NODE_EXPORTER))[("mlx4_0", 1)]
    assert port.receive_bytes == 4_631_917 * 4 and port.transmit_bytes == 3_733_440 * 4
    assert port.receive_packets == 0  # counters_ext/port_rcv_packets_64, not counters/port_rcv_packets


def test_the_default_read_leaves_the_long_tail_out() -> None:
    port = by_name(read_ports(PROCFS))[("mlx5_0", 1)]
    assert set(port.errors) == set(ERRORS)
    # of the hw_counters, only the retransmits and congestion notifications the verdict reads (this host's
    # driver has no rp_cnp_handled)
    assert port.hw_counters == {"local_ack_timeout_err": 131, "out_of_sequence": 1, "packet_seq_err": 1}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)", 50e9),
        ("200 Gb/sec (2X NDR)", 25e9),
        ("2.5 Gb/sec (1X SDR)", 312_500_000),
        ("10 Gb/sec (4X)", 1.25e9),
        ("0 GB/sec", None),  # no link rate: a share of line rate would divide by it
        ("1e308 Gb/sec", None),
        ("20000 Gb/sec (4X)", None),  # no link is that fast
        ("", None),
        ("fast", None),
        (None, None),
    ],
)
def test_rate(text: str | None, expected: float | None) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4: ACTIVE", "ACTIVE"), ("5: LinkUp", "LinkUp"), ("1: DOWN", "DOWN"), ("ACTIVE", None), ("4:", None)],
)
def test_state(text: str, expected: str | None) -> None:
    assert parse_state(text) == expected


def hostile(tmp_path: Path) -> Path:
    """A copy of procfs's mlx5_0, to spoil."""
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "procfs" / "class" / "infiniband" / "mlx5_0", root / "class/infiniband/mlx5_0")
    return root


def test_garbage_in_a_file_costs_that_quantity_only_and_is_named(tmp_path: Path) -> None:
    root = hostile(tmp_path)
    counters = root / "class/infiniband/mlx5_0/ports/1/counters"
    (counters / "port_rcv_data").write_bytes(b"12x34\n")
    (counters / "symbol_error").write_bytes(b"-5\n")
    (counters / "port_xmit_data").write_bytes(b"9" * 1_000_000)  # past any counter, and past what is read
    (counters / "link_downed").write_bytes(b"\xff\xfe\n")
    (root / "class/infiniband/mlx5_0/ports/1/rate").write_text("garbage\n")
    os.remove(counters / "port_rcv_errors")
    (port,) = read_ports(str(root))
    assert port.receive_bytes is None and port.transmit_bytes is None and port.rate_bytes_per_second is None
    assert "symbol_error" not in port.errors and "port_rcv_errors" not in port.errors
    assert port.receive_packets is not None and port.errors["port_xmit_discards"] == 0
    assert set(port.read_errors) == {
        f"ports/1/counters/{n}" for n in ("port_rcv_data", "symbol_error", "port_xmit_data", "link_downed")
    } | {"ports/1/rate"}


def test_values_no_kernel_writes_are_counted_and_names_that_alias_are_served_once(tmp_path: Path) -> None:
    """Found by review: a rate or state that did not parse went uncounted, a counter past 64 bits was
    served, a "01" link beside port 1 served it twice, and undecodable device names that read alike served
    their series twice."""
    root = hostile(tmp_path)
    device = root / "class/infiniband/mlx5_0"
    (device / "ports/1/counters/symbol_error").write_text("99999999999999999999\n")  # 20 digits > 2^64
    (device / "ports/1/state").write_text("4: ACT\u00cfVE\n")
    (device / "ports/01").symlink_to(device / "ports/1")
    shutil.copytree(device, root / "class/infiniband" / os.fsdecode(b"bad\xff"), symlinks=True)
    shutil.copytree(device, root / "class/infiniband" / os.fsdecode(b"bad\xfe"), symlinks=True)
    ports = read_ports(str(root))
    assert sorted((p.device, p.port) for p in ports) == [("bad\ufffd", 1), ("mlx5_0", 1)]
    mlx5 = next(p for p in ports if p.device == "mlx5_0")
    assert "symbol_error" not in mlx5.errors and mlx5.state is None and mlx5.up is None
    assert {"ports/1/counters/symbol_error", "ports/1/state"} <= set(mlx5.read_errors)


def test_a_port_or_a_file_that_is_not_what_sysfs_has_is_skipped(tmp_path: Path) -> None:
    root = hostile(tmp_path)
    device = root / "class/infiniband/mlx5_0"
    (device / "ports/1/state").unlink()
    (device / "ports/1/state").mkdir()  # a directory where a file should be
    (device / "ports/not-a-port").mkdir()
    (device / "ports/99999").mkdir()  # no such port number
    (device / "device").symlink_to(device / "device")  # a loop
    (port,) = read_ports(str(root))
    assert (port.state, port.up, port.pci_bus_id) == (None, None, None)  # unknown, not down


def test_a_device_that_vanishes_mid_read_is_skipped_for_that_read(tmp_path: Path) -> None:
    root = hostile(tmp_path)
    device = str(root / "class/infiniband/mlx5_0")
    shutil.rmtree(os.path.join(device, "ports"))
    assert read_port(device, "mlx5_0", 1) is None and read_ports(str(root)) == ()


def test_the_pci_function_comes_from_the_device_link(tmp_path: Path) -> None:
    root = hostile(tmp_path)
    device = root / "class/infiniband/mlx5_0"
    (device / "device").symlink_to("../../../devices/pci0000:a0/0000:a0:01.0/0000:a1:00.0")
    (port,) = read_ports(str(root))
    assert port.pci_bus_id == "0000:a1:00.0"


def test_no_rdma_driver_means_no_ports(tmp_path: Path) -> None:
    assert read_ports(str(tmp_path)) == ()


def test_a_tree_with_thousands_of_ports_is_cut_at_max_ports(tmp_path: Path) -> None:
    root = tmp_path / "class/infiniband"
    for d in range(40):
        for p in (1, 2):
            port = root / f"dev{d:02d}/ports/{p}"
            port.mkdir(parents=True)
            (port / "state").write_text("4: ACTIVE\n")
    ports = read_ports(str(tmp_path))
    assert len(ports) == MAX_PORTS and ports[0].device == "dev00" and ports[1].port == 2


def test_a_fifo_where_sysfs_has_a_file_never_blocks_the_read(tmp_path: Path) -> None:
    """--sys-root may name any tree: opening a FIFO for reading would wait for a writer forever."""
    root = hostile(tmp_path)
    port = root / "class/infiniband/mlx5_0/ports/1"
    for name in ("counters/port_rcv_data", "state"):
        (port / name).unlink()
        os.mkfifo(port / name)
    (read,) = read_ports(str(root))  # returns: the test would hang otherwise
    assert read.receive_bytes is None and read.state is None and read.transmit_bytes is not None
    assert "ports/1/counters/port_rcv_data" in read.read_errors


def test_names_no_kernel_would_write_are_made_safe_or_skipped(tmp_path: Path) -> None:
    """Root may rename an RDMA device to any bytes: an undecodable name becomes a valid label value, and a
    port directory named with a digit int() refuses ("²") is no port."""
    root = hostile(tmp_path)
    infiniband = root / "class" / "infiniband"
    os.rename(infiniband / "mlx5_0", os.path.join(os.fsencode(infiniband), b"mlx5_\xff"))
    (
        infiniband / "mlx5_\udcff".encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape")
    ).exists()
    (Path(os.fsdecode(os.path.join(os.fsencode(infiniband), b"mlx5_\xff"))) / "ports" / "\u00b2").mkdir()
    (port,) = read_ports(str(root))
    assert port.device == "mlx5_\ufffd" and port.port == 1
    port.device.encode("utf-8")  # what the exposition does with it


def test_a_64_bit_counter_never_falls_back_to_the_32_bit_one(tmp_path: Path) -> None:
    """A failed read of counters_ext/*_64 ("N/A" when a query times out) leaves the quantity absent for that
    sweep; a fallback to the saturated 32-bit counter would look like a reset and a petabyte rise."""
    root = tmp_path / "sys"
    shutil.copytree(
        FIXTURES / "node_exporter" / "class" / "infiniband" / "mlx4_0", root / "class/infiniband/mlx4_0"
    )
    ext = root / "class/infiniband/mlx4_0/ports/1/counters_ext/port_rcv_data_64"
    ext.write_text("N/A (no PMA)\n")
    port = by_name(read_ports(str(root)))[("mlx4_0", 1)]
    assert port.receive_bytes is None
