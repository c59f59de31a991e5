"""RDMA ports as samples of the registry's NIC metrics (gpumon.metrics.host): what the GPU flow's collector
adds to a snapshot's families."""

from __future__ import annotations

from collections.abc import Iterator

from gpumon.metrics import host as M
from gpumon.metrics.registry import Metric
from gpumon.net.netdev import Netdev
from gpumon.net.rdma import ERRORS, RdmaPort

Sample = tuple[Metric, list[str], float]


def nic_samples(ports: tuple[RdmaPort, ...], *, detail: bool = False) -> Iterator[Sample]:
    """Each port's samples; an absent quantity (a missing file, an adapter without counters) has none.
    Without ``detail`` (nic-detail), only the error counters operators act on (ERRORS) and none of the
    hw_counters, whatever was read."""
    for p in ports:
        key = [p.device, str(p.port)]
        info = [p.link_layer or "", p.pci_bus_id or "", p.board_id or "", p.fw_ver or ""]
        yield M.NIC_INFO, key + info, 1.0
        if p.up is not None:
            yield M.NIC_UP, key, 1.0 if p.up else 0.0
        yield from _known(
            key,
            (M.NIC_SPEED, p.rate_bytes_per_second),
            (M.NIC_RX, p.receive_bytes),
            (M.NIC_TX, p.transmit_bytes),
            (M.NIC_RX_PACKETS, p.receive_packets),
            (M.NIC_TX_PACKETS, p.transmit_packets),
        )
        for name, count in p.errors.items():
            if detail or name in ERRORS:
                yield M.NIC_ERRORS, [*key, name], float(count)
        if detail:  # the retransmits and congestion notifications the verdict reads stay in the daemon
            for name, count in p.hw_counters.items():
                yield M.NIC_HW, [*key, name], float(count)


def ethernet_samples(interfaces: tuple[Netdev, ...]) -> Iterator[Sample]:
    """Each interface's samples; an absent quantity has none."""
    for n in interfaces:
        key = [n.name]
        yield M.ETH_INFO, [*key, n.pci_bus_id or ""], 1.0
        if n.up is not None:
            yield M.ETH_UP, key, 1.0 if n.up else 0.0
        yield from _known(
            key,
            (M.ETH_SPEED, n.speed_bytes_per_second),
            (M.ETH_RX, n.receive_bytes),
            (M.ETH_TX, n.transmit_bytes),
        )
        for name, count in n.errors.items():
            yield M.ETH_ERRORS, [*key, name], float(count)


def _known(key: list[str], *pairs: tuple[Metric, float | None]) -> Iterator[Sample]:
    """A sample for each quantity that was read: unknown is absent, not 0."""
    for metric, value in pairs:
        if value is not None:
            yield metric, key, float(value)
