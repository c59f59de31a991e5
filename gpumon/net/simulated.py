"""Simulated RDMA NICs beside simulated GPUs, read like this host's sysfs (a NicSource, net/reader.py).

The layout is an HGX node's: boards with NVLink have one 400 Gb/s NDR InfiniBand port per GPU, two GPUs and
their two NICs behind each PCIe switch (the ConnectX-7 layout of a DGX H100), so each GPU's nearest NIC is
its own, one switch away (PIX). PCIe boards share one 200 Gb/s RoCE port (Ethernet link layer) between two
GPUs behind one switch.

A NIC's traffic is its GPUs' traffic between nodes: the seconds their all-reduce crossed the NIC at full
speed (DeviceState.net_seconds: a job with ranks on other nodes, less the time it waits for a slower peer),
at EFFICIENCY of the line rate, which the GPUs behind it share (two moving data at once get half each, and
their collectives take no longer: a simplification), plus a trickle of fabric management traffic. The
counters follow simulated time: reading them advances the GPUs as an NVML call does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpumon.net.affinity import PATHS, Nearest, normalise
from gpumon.net.netdev import ERRORS as NETDEV_ERRORS
from gpumon.net.netdev import Netdev
from gpumon.net.rdma import CONGESTION, ERRORS, HW_COUNTERS, MORE_ERRORS, RETRANSMITS, RdmaPort

EFFICIENCY = 0.92  # of the line rate a large all-reduce achieves (NCCL's bus bandwidth on NDR: ~370 Gb/s)
IDLE_BYTES_PER_SECOND = 2.0e3  # subnet management and keep-alives, each way
MTU = 4096  # bytes per packet, for the packet counters


class _State(Protocol):
    net_seconds: float


class _Dynamics(Protocol):
    def advance_to(self, t: float) -> None: ...


class SimGpuLike(Protocol):
    """What this module reads of a simulated GPU (gpumon/gpu/sim/device.SimGpu)."""

    index: int
    pci_bus_id: str
    lock: threading.Lock

    @property
    def dynamics(self) -> _Dynamics: ...
    @property
    def state(self) -> _State: ...
    @property
    def model(self) -> object: ...


@dataclass(frozen=True)
class SimNic:
    device: str
    link_layer: str
    rate_bytes_per_second: float
    pci_bus_id: str
    gpus: tuple[int, ...]  # the GPUs behind the same PCIe switch, whose traffic it carries


def layout(gpus: Sequence[SimGpuLike]) -> list[SimNic]:
    """The node's NICs: one NDR port per GPU where the GPUs have NVLink, else one RoCE port per two GPUs."""
    nics: list[SimNic] = []
    hgx = all(getattr(g.model, "nvlinks", 0) for g in gpus)
    per = 1 if hgx else 2
    for n, first in enumerate(range(0, len(gpus), per)):
        behind = tuple(g.index for g in gpus[first : first + per])
        domain, bus, _ = normalise(gpus[first].pci_bus_id).split(":")
        nics.append(
            SimNic(
                device=f"mlx5_{n}",
                link_layer="InfiniBand" if hgx else "Ethernet",
                rate_bytes_per_second=400e9 / 8 if hgx else 200e9 / 8,
                # the NIC sits on the GPU's PCIe switch, on the bus after the GPU's
                pci_bus_id=f"{domain}:{(int(bus, 16) + 1) % 256:02x}:00.0",
                gpus=behind,
            )
        )
    return nics


MANAGEMENT_RATE = 25e9 / 8  # the node's own 25 Gb/s Ethernet: SSH, storage, the scrapes
MANAGEMENT_BYTES_PER_SECOND = 2e6  # what it carries: logs, checkpoints elsewhere, metrics


class SimNics:
    """The NICs of a simulated node (SimNvml's GPUs); ``now``: the GPUs' simulated time."""

    def __init__(self, gpus: Sequence[SimGpuLike], now: Callable[[], float]) -> None:
        self._gpus = {g.index: g for g in gpus}
        self._now = now
        self.nics = layout(gpus)

    def interfaces(self) -> tuple[Netdev, ...]:
        """The node's management interface (the jobs' collectives go over the RDMA ports)."""
        moved = int(MANAGEMENT_BYTES_PER_SECOND * max(0.0, self._now()))
        errors = dict.fromkeys(NETDEV_ERRORS, 0)
        return (Netdev("eth0", True, MANAGEMENT_RATE, moved, moved // 4, errors, "0000:04:00.0"),)

    def ports(self, detail: bool) -> tuple[RdmaPort, ...]:
        t = self._now()
        out = []
        for nic in self.nics:
            busy = 0.0
            for index in nic.gpus:
                gpu = self._gpus[index]
                with gpu.lock:
                    gpu.dynamics.advance_to(t)
                    busy += gpu.state.net_seconds
            # the GPUs behind a NIC share its line rate: two moving data at once get half each
            share = busy / len(nic.gpus)
            moved = int(share * nic.rate_bytes_per_second * EFFICIENCY + IDLE_BYTES_PER_SECOND * max(0.0, t))
            errors = dict.fromkeys(ERRORS + (MORE_ERRORS if detail else ()), 0)
            roce = nic.link_layer == "Ethernet"  # mlx5's RoCE ports have hw_counters, a healthy fabric 0s
            out.append(
                RdmaPort(
                    device=nic.device,
                    port=1,
                    link_layer=nic.link_layer,
                    state="ACTIVE",
                    phys_state="LinkUp",
                    rate_bytes_per_second=nic.rate_bytes_per_second,
                    receive_bytes=moved,
                    transmit_bytes=moved,
                    receive_packets=moved // MTU,
                    transmit_packets=moved // MTU,
                    errors=errors,
                    hw_counters=dict.fromkeys(HW_COUNTERS if detail else RETRANSMITS + CONGESTION, 0)
                    if roce
                    else {},
                    pci_bus_id=nic.pci_bus_id,
                    board_id="MT_0000000838",  # a ConnectX-7's
                    fw_ver="28.39.1002",
                )
            )
        return tuple(out)

    def nearest(self, gpus: list[str], nics: dict[str, str]) -> list[Nearest]:
        """Each GPU's own NIC, one switch away; GPUs this node does not have are left out."""
        own = {normalise(self._gpus[i].pci_bus_id): nic.device for nic in self.nics for i in nic.gpus}
        return [
            Nearest(bus, own[normalise(bus)], PATHS[0])
            for bus in gpus
            if normalise(bus) in own and own[normalise(bus)] in nics
        ]

    def peermem(self) -> str | None:
        return "nvidia_peermem"  # a simulated HGX node is set up for GPUDirect RDMA
