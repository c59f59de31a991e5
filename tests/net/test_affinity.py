"""GPU-to-NIC affinity from the PCI tree: sysfs trees laid out as an HGX H100 node (a GPU and a NIC behind
each PCIe switch, two switches per socket) and a PCIe server with one NIC, in nvidia-smi topo's categories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpumon.net.affinity import nearest, normalise, path, peermem, place
from gpumon.net.rdma import RdmaPort
from gpumon.net.reader import candidates


def device(sysfs: Path, chain: list[str], numa: int = -1) -> str:
    """A PCI function at ``chain`` (the root complex first), with the /sys/bus/pci/devices link to it."""
    where = sysfs / "devices"
    for part in chain:
        where = where / part
    where.mkdir(parents=True, exist_ok=True)
    (where / "numa_node").write_text(f"{numa}\n")
    links = sysfs / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    link = links / chain[-1]
    if not link.is_symlink():
        link.symlink_to(os.path.relpath(where, links))
    return chain[-1]


def hgx(sysfs: Path) -> tuple[list[str], dict[str, str]]:
    """8 GPUs and 8 NICs: socket 0 has root complexes pci0000:17 and pci0000:38, socket 1 pci0000:9a and
    pci0000:bb; each root port leads to a switch with two downstream ports, one GPU and one NIC."""
    gpus, nics = [], {}
    for i, (root, numa) in enumerate([("17", 0), ("38", 0), ("9a", 1), ("bb", 1)] * 2):
        rc = f"pci0000:{root}"
        rp = f"0000:{root}:0{1 + i // 4}.0"
        bus = int(root, 16) + 1 + (i // 4) * 8
        usp, dsp_gpu, dsp_nic = f"0000:{bus:02x}:00.0", f"0000:{bus + 1:02x}:00.0", f"0000:{bus + 1:02x}:01.0"
        gpu, nic = f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 3:02x}:00.0"
        gpus.append(device(sysfs, [rc, rp, usp, dsp_gpu, gpu], numa))
        nics[f"mlx5_{i}"] = device(sysfs, [rc, rp, usp, dsp_nic, nic], numa)
    return gpus, nics


def test_on_an_hgx_node_each_gpu_has_its_own_nic_behind_its_switch(tmp_path: Path) -> None:
    gpus, nics = hgx(tmp_path)
    found = nearest(str(tmp_path), [f"0000{g.upper()}" for g in gpus], nics)  # as NVML writes them
    assert [(n.nic, n.path) for n in found] == [(f"mlx5_{i}", "PIX") for i in range(8)]
    g0, g1 = place(str(tmp_path), gpus[0]), place(str(tmp_path), gpus[1])
    assert g0 is not None and g1 is not None
    assert path(g0, place(str(tmp_path), nics["mlx5_1"])) == "NODE"  # another root complex, same socket
    assert path(g0, place(str(tmp_path), nics["mlx5_2"])) == "SYS"  # the other socket
    assert path(g0, place(str(tmp_path), nics["mlx5_4"])) == "PHB"  # another root port of its complex


def test_a_nic_behind_a_second_switch_is_pxb(tmp_path: Path) -> None:
    rc, rp = "pci0000:17", "0000:17:01.0"
    gpu = device(tmp_path, [rc, rp, "0000:18:00.0", "0000:19:00.0", "0000:1a:00.0"])
    nested = [rc, rp, "0000:18:00.0", "0000:19:01.0", "0000:1b:00.0", "0000:1c:00.0", "0000:1d:00.0"]
    nic = device(tmp_path, nested)
    (found,) = nearest(str(tmp_path), [gpu], {"mlx5_0": nic})
    assert found.path == "PXB"


def test_a_pcie_server_whose_one_nic_sits_on_the_other_socket(tmp_path: Path) -> None:
    gpu0 = device(tmp_path, ["pci0000:00", "0000:00:01.0", "0000:01:00.0"], numa=0)
    gpu1 = device(tmp_path, ["pci0000:80", "0000:80:01.0", "0000:81:00.0"], numa=1)
    nic = device(tmp_path, ["pci0000:80", "0000:80:03.0", "0000:83:00.0"], numa=1)
    found = nearest(str(tmp_path), [gpu0, gpu1], {"mlx5_0": nic})
    assert [(n.gpu, n.path) for n in found] == [(gpu0, "SYS"), (gpu1, "PHB")]


def test_what_sysfs_does_not_place_is_left_out(tmp_path: Path) -> None:
    gpus, nics = hgx(tmp_path)
    unknown = ["0000:ee:00.0", "not a bus id", gpus[0]]
    found = nearest(str(tmp_path), unknown, {**nics, "ghost": "0000:ef:00.0"})
    assert [n.gpu for n in found] == [gpus[0]]
    assert nearest(str(tmp_path), gpus, {}) == []
    assert nearest(str(tmp_path / "empty"), gpus, nics) == []


def test_a_link_loop_or_a_path_outside_a_root_complex_places_nothing(tmp_path: Path) -> None:
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:01:00.0").symlink_to(links / "0000:01:00.0")
    outside = tmp_path / "elsewhere" / "0000:02:00.0"
    outside.mkdir(parents=True)
    (links / "0000:02:00.0").symlink_to(outside)
    assert place(str(tmp_path), "0000:01:00.0") is None and place(str(tmp_path), "0000:02:00.0") is None


@pytest.mark.parametrize(
    ("given", "expected"),
    [("00000000:18:00.0", "0000:18:00.0"), ("0000:1A:00.0", "0000:1a:00.0"), ("18:00.0", "0000:18:00.0")],
)
def test_bus_ids_as_nvml_writes_them(given: str, expected: str) -> None:
    assert normalise(given) == expected


def test_gpudirect_rdma_needs_the_peer_memory_module(tmp_path: Path) -> None:
    assert peermem(str(tmp_path)) is None
    (tmp_path / "module" / "nvidia_peermem").mkdir(parents=True)
    assert peermem(str(tmp_path)) == "nvidia_peermem"


def test_equally_near_nics_pair_off_with_the_gpus_in_order_whatever_their_state(tmp_path: Path) -> None:
    """Found by review: the nearest NIC among equals was the first ACTIVE one, so a GPU whose own NIC went
    down moved to its neighbour's, and the verdict read that one's idleness as "waiting on peers"; and two
    GPUs behind one switch both took the first NIC. Now: by the PCI tree alone, each next GPU the least
    used of the equally near NICs, then the first as a person counts (mlx5_2 before mlx5_10)."""
    rc, rp, usp = "pci0000:17", "0000:17:01.0", "0000:18:00.0"
    gpus = [device(tmp_path, [rc, rp, usp, f"0000:19:0{i}.0", f"0000:1{i + 1}:00.0"]) for i in (4, 5)]
    buses = {
        name: device(tmp_path, [rc, rp, usp, f"0000:19:0{i + 1}.0", f"0000:2{i}:00.0"])
        for i, name in enumerate(("mlx5_10", "mlx5_2", "mlx5_3"))
    }

    def port(name: str, state: str) -> RdmaPort:
        return RdmaPort(name, 1, "InfiniBand", state, "LinkUp", 5e10, 0, 0, 0, 0, pci_bus_id=buses[name])

    up = (port("mlx5_10", "ACTIVE"), port("mlx5_2", "ACTIVE"), port("mlx5_3", "ACTIVE"))
    assert list(candidates(up)) == ["mlx5_2", "mlx5_3", "mlx5_10"]
    found = nearest(str(tmp_path), gpus, candidates(up))
    assert [(n.nic, n.path) for n in found] == [("mlx5_2", "PIX"), ("mlx5_3", "PIX")]
    down = (port("mlx5_10", "ACTIVE"), port("mlx5_2", "DOWN"), port("mlx5_3", "ACTIVE"))
    assert nearest(str(tmp_path), gpus, candidates(down)) == found
