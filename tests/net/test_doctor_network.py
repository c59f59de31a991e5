"""`gpumon doctor` on a node's network: its RDMA ports, each GPU's nearest NIC and GPUDirect RDMA, run as a
user would over a sysfs tree laid out as a node (the captured ConnectX-4 behind GPU 0's PCIe switch)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.helpers import ROOT, run_gpumon
from support.soak import parse
from test_affinity import device
from test_nic_exposition import served

CAPTURED = ROOT / "tests" / "fixtures" / "sysfs" / "procfs" / "class" / "infiniband" / "mlx5_0"


def node(sysfs: Path, *, peermem: bool = False) -> Path:
    """The simulated 2xH100-SXM's GPUs (00000000:18:00.0 and 00000000:2A:00.0) on the two sockets, and
    mlx5_0 behind GPU 0's switch."""
    device(sysfs, ["pci0000:17", "0000:17:01.0", "0000:18:00.0"], numa=0)  # GPU 0 below the root port
    nic = device(sysfs, ["pci0000:17", "0000:17:01.0", "0000:19:00.0"], numa=0)
    device(sysfs, ["pci0000:29", "0000:29:01.0", "0000:2a:00.0"], numa=1)  # GPU 1, the other socket
    ib = sysfs / "class" / "infiniband" / "mlx5_0"
    shutil.copytree(CAPTURED, ib)
    (ib / "device").symlink_to(f"../../../devices/pci0000:17/0000:17:01.0/{nic}")
    if peermem:
        (sysfs / "module" / "nvidia_peermem").mkdir(parents=True)
    return sysfs


def test_doctor_names_each_gpus_nearest_nic_and_warns_across_the_socket(tmp_path: Path) -> None:
    sysfs = node(tmp_path / "sys")
    out = run_gpumon("doctor", "--simulate", "2xH100-SXM", "--sys-root", str(sysfs))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "NIC mlx5_0/1:   InfiniBand  25 Gb/s  ACTIVE  0000:19:00.0" in lines, out.stdout
    assert "nearest NIC:    GPU 0 mlx5_0 (PIX), GPU 1 mlx5_0 (SYS)" in lines, out.stdout
    assert "GPUDirect RDMA: no peer-memory module" in lines
    words = " ".join(out.stdout.split())
    assert "The nearest RDMA NIC of GPU 1 is across the socket link (SYS)" in words
    assert "modprobe nvidia_peermem" in words


def test_doctor_json_carries_the_network_and_the_peer_memory_module(tmp_path: Path) -> None:
    sysfs = node(tmp_path / "sys", peermem=True)
    doc = json.loads(
        run_gpumon("doctor", "--json", "--simulate", "2xH100-SXM", "--sys-root", str(sysfs)).stdout
    )
    net = doc["network"]
    assert net["nearest"] == [
        {"gpu": 0, "nic": "mlx5_0", "path": "PIX"},
        {"gpu": 1, "nic": "mlx5_0", "path": "SYS"},
    ]
    assert net["peermem"] == "nvidia_peermem" and net["ports"][0]["pci_bus_id"] == "0000:19:00.0"
    assert not any("modprobe" in a for a in doc["advice"])


@pytest.mark.parametrize(
    "args",
    [
        ("--simulate", "1xH100-SXM", "--no-nics"),
        # replayed GPUs are another node's: this host's NICs are not theirs, and a capture holds none
        ("--replay", str(ROOT / "tests" / "fixtures" / "captures" / "h200-idle.json")),
    ],
)
def test_doctor_without_rdma_nics_says_nothing_of_them(args: tuple[str, ...]) -> None:
    out = run_gpumon("doctor", *args)
    assert out.returncode == 0 and "NIC " not in out.stdout and "GPUDirect" not in out.stdout


def test_doctor_on_a_simulated_hgx_node_shows_its_simulated_nics() -> None:
    out = run_gpumon("doctor", "--simulate", "8xH100-SXM", "--json")
    net = json.loads(out.stdout)["network"]
    assert [(p["device"], p["link_layer"], p["state"]) for p in net["ports"]] == [
        (f"mlx5_{i}", "InfiniBand", "ACTIVE") for i in range(8)
    ]
    assert net["nearest"] == [{"gpu": i, "nic": f"mlx5_{i}", "path": "PIX"} for i in range(8)]
    assert net["peermem"] == "nvidia_peermem" and net["advice"] == []


def test_each_gpus_nearest_nic_is_an_info_series(tmp_path: Path, daemon) -> None:
    sysfs = node(tmp_path / "sys")
    d = daemon("--simulate", "2xH100-SXM", "--sys-root", str(sysfs))
    got = {
        (dict(lb)["gpu"], dict(lb)["device"], dict(lb)["path"])
        for (name, lb), v in parse(served(d)).items()
        if name == "gpumon_gpu_nic_affinity_info" and v == 1
    }
    assert got == {("0", "mlx5_0", "PIX"), ("1", "mlx5_0", "SYS")}
    assert [(n["nic"], n["path"]) for n in d.get("/v1/gpus").json()["nic_affinity"]] == [
        ("mlx5_0", "PIX"),
        ("mlx5_0", "SYS"),
    ]


def test_doctor_prints_sysfs_strings_on_one_line_without_terminal_escapes() -> None:
    """Root may name an RDMA device anything; a newline would forge a report line."""
    from gpumon.cli.doctor import _network
    from gpumon.gpu.doctor import Report
    from gpumon.net.doctor import NetReport

    port = {"device": "evil\n[ok] x\x1b[31m", "port": 1, "link_layer": "Infini\rBand", "state": "ACTIVE"}
    net = NetReport(ports=[{**port, "rate_bytes_per_second": 5e10, "pci_bus_id": None}])
    lines = _network(Report("nvml", {}, 0, [], [], {}, 0, network=net))
    assert lines[0] == "NIC evil\\n[ok] x\\x1b[31m/1: Infini\\rBand  400 Gb/s  ACTIVE", lines
    assert all("\n" not in line and "\x1b" not in line for line in lines)


def test_doctor_says_when_a_gpus_nearest_nic_is_gone() -> None:
    """The reader keeps a vanished NIC as its GPUs' nearest (test_nic_history.py); doctor says so."""
    from gpumon.net.doctor import report
    from gpumon.net.rdma import RdmaPort

    left = RdmaPort(
        "mlx5_1", 1, "InfiniBand", "ACTIVE", "LinkUp", 5e10, 0, 0, 0, 0, pci_bus_id="0000:2b:00.0"
    )
    r = report(
        {"GPU-a": 0, "GPU-b": 1}, (left,), (("GPU-a", "mlx5_0", "PIX"), ("GPU-b", "mlx5_1", "PIX")), None
    )
    (gone,) = [a for a in r.advice if "gone" in a]
    assert gone.startswith("RDMA device mlx5_0 (nearest NIC of GPU 0) is gone from /sys/class/infiniband")
