"""Simulated NICs (gpumon/net/simulated.py): an HGX node's eight NDR ports whose traffic follows its jobs'
all-reduce across nodes: a job with ranks elsewhere moves data at line rate while it communicates, a job
waiting for a slower peer leaves its NICs idle, a job all on one node leaves them to their trickle."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpumon.gpu.sim import SimNvml
from gpumon.net.simulated import EFFICIENCY, IDLE_BYTES_PER_SECOND, SimNics


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _rate(sim: SimNvml, clock: Clock, seconds: float = 60.0) -> list[float]:
    """Each NIC's received bytes per second over ``seconds`` of simulated time."""
    nics = SimNics(sim.gpus, sim.now)
    before = nics.ports(False)
    clock.t += seconds
    after = nics.ports(False)
    return [(b.receive_bytes - a.receive_bytes) / seconds for a, b in zip(before, after, strict=True)]


def test_an_hgx_node_has_an_ndr_port_per_gpu_each_gpus_nearest_on_its_switch() -> None:
    sim = SimNvml("8xH100-SXM", unreported_jobs=False)
    nics = SimNics(sim.gpus, sim.now)
    ports = nics.ports(True)
    assert [p.device for p in ports] == [f"mlx5_{i}" for i in range(8)]
    assert {(p.link_layer, p.rate_bytes_per_second, p.state) for p in ports} == {
        ("InfiniBand", 5e10, "ACTIVE")
    }
    assert all(p.errors and not any(p.errors.values()) for p in ports)
    buses = [g.pci_bus_id for g in sim.gpus]
    near = nics.nearest(buses, {p.device: p.pci_bus_id for p in ports})
    assert [(n.nic, n.path) for n in near] == [(f"mlx5_{i}", "PIX") for i in range(8)]
    assert nics.peermem() == "nvidia_peermem"
    # boards without NVLink: one 200 Gb/s RoCE port for two GPUs
    pcie = SimNics(SimNvml("4xL4", unreported_jobs=False).gpus, sim.now).ports(True)
    assert [(p.device, p.link_layer, p.rate_bytes_per_second) for p in pcie] == [
        ("mlx5_0", "Ethernet", 2.5e10),
        ("mlx5_1", "Ethernet", 2.5e10),
    ]
    assert pcie[0].hw_counters and "np_cnp_sent" in pcie[0].hw_counters  # RoCE congestion counters


@pytest.mark.parametrize(
    ("spec", "moving"),
    [
        ("across:0-3:0/16:comm=0.4", 0.4),  # ranks elsewhere: the all-reduce crosses the NICs
        ("waiting:0-3:0/16:comm=0.4:peer_wait=0.3", 0.1),  # 0.3 of it waits for a slower peer
        ("alone:0-3:comm=0.4", 0.0),  # one node: NVLink carries it all
    ],
)
def test_a_sim_jobs_nics_carry_its_all_reduce_across_nodes_but_not_its_waits(
    spec: str, moving: float
) -> None:
    clock = Clock()
    sim = SimNvml("8xH100-SXM", jobs=[spec], clock=clock, warmup=100.0, unreported_jobs=False)
    rates = _rate(sim, clock)
    for rate in rates[:4]:
        assert rate == pytest.approx(moving * EFFICIENCY * 5e10 + IDLE_BYTES_PER_SECOND, rel=0.05)
    assert rates[4:] == [pytest.approx(IDLE_BYTES_PER_SECOND)] * 4  # GPUs 4-7 run nothing


def test_peer_wait_is_part_of_the_communication_share_of_a_job_across_nodes() -> None:
    with pytest.raises(ValueError, match=r"peer_wait 0\.5 is part of the communication share"):
        SimNvml("8xH100-SXM", jobs=["bad:0-1:0/8:comm=0.2:peer_wait=0.5"])
    with pytest.raises(ValueError, match="peer_wait is a wait for ranks on other nodes"):
        SimNvml("8xH100-SXM", jobs=["alone:0-7:comm=0.4:peer_wait=0.3"])


def test_two_gpus_behind_one_nic_share_its_line_rate() -> None:
    """Found by review: a RoCE port carried both its GPUs' traffic in full, 128 % of its line rate."""
    clock = Clock()
    sim = SimNvml("8xH100-PCIe", jobs=["big:0-7:0/16:comm=0.7"], clock=clock, warmup=100.0,
                  unreported_jobs=False)  # fmt: skip
    for rate in _rate(sim, clock):
        assert rate == pytest.approx(0.7 * EFFICIENCY * 2.5e10 + IDLE_BYTES_PER_SECOND, rel=0.05)


@dataclass
class _Totals:
    steps: float


@dataclass
class _Report:
    """What the SDK driver reads of a report (gpumon.jobs.report.Report has these)."""

    time: float
    steps: float
    comm: float
    world_size: int
    job: str = "driven"
    rank: int = 0
    incarnation: str = "i0"
    pid: int = field(default_factory=os.getpid)
    started: float = 0.0
    devices: tuple[str, ...] = ("2",)
    open_phases: dict[str, float] = field(default_factory=dict)
    memory: Any = None
    final: bool = False

    @property
    def phases(self) -> dict[str, float]:
        return {"communication": self.comm}

    @property
    def totals(self) -> _Totals:
        return _Totals(self.steps)


@pytest.mark.parametrize(("world", "moving"), [(16, 0.2), (1, 0.0)])
def test_a_driven_rank_moves_data_for_its_collectives_least_time_and_waits_the_rest(
    world: int, moving: float
) -> None:
    """An SDK loop: 2 steps a second; its collectives took 0.1 s a step while its peers kept pace, then 0.3 s
    once a peer elsewhere slowed. Only the 0.1 s moves data; a job of one node moves none."""
    clock = Clock()
    sim = SimNvml("8xH100-SXM", clock=clock, unreported_jobs=False)
    steps = comm = 0.0
    for second in range(1, 31):
        steps += 2
        comm += 0.2 if second <= 10 else 0.6
        clock.t += 1.0
        sim.driver.observe(_Report(float(second), steps, comm, world))
        if second == 10:
            nics = SimNics(sim.gpus, sim.now)
            before = nics.ports(False)[2].receive_bytes
    after = nics.ports(False)[2].receive_bytes
    assert (after - before) / 20.0 == pytest.approx(
        moving * EFFICIENCY * 5e10 + IDLE_BYTES_PER_SECOND, rel=0.1
    )
