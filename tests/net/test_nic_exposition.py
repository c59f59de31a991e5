"""RDMA ports on /metrics: a real daemon over a captured sysfs tree (tests/fixtures/sysfs), through the
sampler and the GPU flow's collector, promtool-clean; and what a broken tree costs."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from support.helpers import ROOT, Daemon, require_tool
from support.poll import poll
from support.soak import parse, value

from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml
from gpumon.net import reader
from gpumon.net.reader import NicReader

PROCFS = ROOT / "tests" / "fixtures" / "sysfs" / "procfs"


def served(d: Daemon) -> str:
    """/metrics once the NIC reader's first reading is in (it reads on its own thread in the daemon)."""

    def ready() -> str | None:
        text = d.get("/metrics").text
        return text if "gpumon_nic_up{" in text else None

    return poll(ready, 15, "the NICs' first reading")


def test_a_daemon_serves_each_rdma_port_of_the_tree_it_reads(daemon: Callable[..., Daemon]) -> None:
    d = daemon("--simulate", "1xH100-SXM", "--sys-root", str(PROCFS))
    body = served(d)
    got = parse(body)
    mlx5 = {"device": "mlx5_0", "port": "1"}
    assert value(got, "gpumon_nic_receive_bytes_total", **mlx5) == 72_505_381_512
    assert value(got, "gpumon_nic_transmit_bytes_total", **mlx5) == 11_523_046_035_392
    assert value(got, "gpumon_nic_link_speed_bytes_per_second", **mlx5) == 3_125_000_000
    assert value(got, "gpumon_nic_up", **mlx5) == 1
    # every error counter of the capture is 0: served from its first rise (test_budget.py tests the rise)
    assert not [lb for (n, lb) in got if n == "gpumon_nic_errors_total"]
    info = {"link_layer": "InfiniBand", "pci_bus_id": "", "board_id": "SM_2001000001034"}
    info["fw_ver"] = "14.28.2006"
    assert value(got, "gpumon_nic_info", **info, **mlx5) == 1
    assert value(got, "gpumon_collector_success", collector="nic") == 1
    # the long tail is opt-in (nic-detail)
    assert value(got, "gpumon_nic_receive_packets_total", **mlx5) is None
    ports = {(dict(lb)["device"], dict(lb)["port"]) for (n, lb) in got if n == "gpumon_nic_up"}
    assert ports == {("hfi1_0", "1"), ("mlx4_0", "1"), ("mlx4_0", "2"), ("mlx5_0", "1")}
    check = subprocess.run(
        [require_tool("promtool"), "check", "metrics"], input=body, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_nic_detail_adds_packets_and_the_adapters_own_counters(
    daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    # the capture, with 5 VL15 drops counted before the daemon started: an error counter of the detail
    tree = tmp_path / "sys"
    shutil.copytree(PROCFS, tree, symlinks=True)
    (tree / "class/infiniband/mlx5_0/ports/1/counters/VL15_dropped").write_text("5\n")
    d = daemon("--simulate", "1xH100-SXM", "--sys-root", str(tree), "--collect", "nic-detail")
    got = parse(served(d))
    mlx5 = {"device": "mlx5_0", "port": "1"}
    assert value(got, "gpumon_nic_receive_packets_total", **mlx5) is not None
    assert value(got, "gpumon_nic_hw_events_total", counter="out_of_sequence", **mlx5) is not None
    assert value(got, "gpumon_nic_errors_total", counter="VL15_dropped", **mlx5) == 5


def test_simulated_gpus_get_simulated_nics_not_the_hosts(daemon: Callable[..., Daemon]) -> None:
    """Without --sys-root, simulated GPUs sit beside simulated NICs (net/simulated.py): the host's own, if
    it has any, would make one node out of two."""
    got = parse(daemon("--simulate", "2xH100-SXM").get("/metrics").text)
    info = sorted(
        dict(lb)["device"] + " " + dict(lb)["pci_bus_id"] for n, lb in got if n == "gpumon_nic_info"
    )
    assert info == ["mlx5_0 0000:19:00.0", "mlx5_1 0000:2b:00.0"]  # each on its GPU's switch
    assert value(got, "gpumon_nic_link_speed_bytes_per_second", device="mlx5_1", port="1") == 5e10
    assert value(got, "gpumon_collector_success", collector="nic") == 1
    # and its management Ethernet interface
    assert value(got, "gpumon_ethernet_link_speed_bytes_per_second", interface="eth0") == 25e9 / 8
    assert value(got, "gpumon_ethernet_up", interface="eth0") == 1
    assert value(got, "gpumon_ethernet_receive_bytes_total", interface="eth0") > 0
    assert not [n for n, _ in got if n == "gpumon_ethernet_errors_total"]  # none rose


def test_a_real_trees_ethernet_interfaces_are_served(daemon: Callable[..., Daemon]) -> None:
    got = parse(served(daemon("--simulate", "1xH100-SXM", "--sys-root", str(PROCFS))))
    assert value(got, "gpumon_ethernet_up", interface="enp162s0f0np0") == 0
    assert value(got, "gpumon_ethernet_up", interface="eth0") == 1
    assert value(got, "gpumon_ethernet_info", interface="eth0", pci_bus_id="0000:00:1f.6") == 1
    assert value(got, "gpumon_ethernet_link_speed_bytes_per_second", interface="eth0") == 1.25e8


def test_no_nics_turns_the_collector_off(daemon: Callable[..., Daemon]) -> None:
    d = daemon("--simulate", "1xH100-SXM", "--sys-root", str(PROCFS), "--no-nics")
    got = parse(d.get("/metrics").text)
    assert not [n for n, _ in got if n.startswith(("gpumon_nic_", "gpumon_ethernet_"))]


def test_an_unparsable_file_is_counted_and_costs_only_its_quantity(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(PROCFS / "class" / "infiniband" / "mlx5_0", root / "class" / "infiniband" / "mlx5_0")
    (root / "class/infiniband/mlx5_0/ports/1/counters/port_rcv_data").write_text("lots\n")
    sampler = Sampler(NvmlBackend(SimNvml("1xH100-SXM", static=True)), timeout=1.0)
    sampler.nics = NicReader(str(root))
    sampler.open()
    try:
        for _ in range(2):
            snap = sampler.sweep()
    finally:
        sampler.stop()
    (port,) = snap.nics or ()
    assert port.receive_bytes is None and port.transmit_bytes == 11_523_046_035_392
    assert snap.errors[("", "", "sysfs_infiniband", "unparsable")] == 2
    assert {c.name: c.success for c in snap.collectors}["nic"] is True


def test_a_reader_that_raises_fails_the_nic_collector_only(monkeypatch) -> None:
    def broken(*args: object, **kw: object) -> tuple[()]:
        raise OSError("sysfs went away")

    monkeypatch.setattr(reader, "read_ports", broken)
    sampler = Sampler(NvmlBackend(SimNvml("1xH100-SXM", static=True)), timeout=1.0)
    sampler.nics = NicReader()
    sampler.open()
    try:
        snap = sampler.sweep()
    finally:
        sampler.stop()
    status = {c.name: c.success for c in snap.collectors}
    assert status["nic"] is False and status["gpu"] is True and snap.nics is None
    assert snap.errors[("", "", "sysfs_infiniband", "OSError")] == 1


def test_in_the_daemon_a_read_that_hangs_costs_the_nic_series_not_the_sweep(monkeypatch) -> None:
    """A real adapter answers each file with a firmware command, which can take a minute to time out: the
    daemon reads on a thread of the reader's own, and a read stuck past STUCK_AFTER fails the collector."""
    release = threading.Event()

    def hung(*args: object, **kw: object) -> tuple[()]:
        release.wait(10)
        return ()

    now = [100.0]
    monkeypatch.setattr(reader, "read_ports", hung)
    nics = NicReader(every=5.0, clock=lambda: now[0])
    sampler = Sampler(NvmlBackend(SimNvml("1xH100-SXM", static=True)), timeout=1.0)
    sampler.nics = nics
    sampler.open()
    try:
        t0 = time.monotonic()
        snap = sampler.sweep()  # the reader's thread is inside its first read
        assert time.monotonic() - t0 < 5.0 and snap.gpus[0].up
        assert {c.name: c.success for c in snap.collectors}["nic"] is True and snap.nics is None
        now[0] += reader.STUCK_AFTER + 1
        assert {c.name: c.success for c in sampler.sweep().collectors}["nic"] is False
    finally:
        release.set()
        sampler.stop()
