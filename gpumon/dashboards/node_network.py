"""The node dashboard's network section: the RDMA NICs' traffic against their line rate, their errors and
links, which NIC is nearest each GPU, and the Ethernet interfaces' traffic (gpumon/net)."""

from __future__ import annotations

from gpumon.dashboards.builder import Panel, Row, Target
from gpumon.dashboards.node_health import NODE
from gpumon.dashboards.panels import (
    BYTES_PER_S,
    HIGHER_IS_BETTER,
    NONE,
    PER_SECOND,
    RATIO,
    bargauge,
    table,
    timeseries,
)

PORT = "{{instance}} {{device}}/{{port}}"
BY_PORT = "job, instance, device, port"


def _rate(direction: str) -> str:
    return f"rate(gpumon_nic_{direction}_bytes_total{{{NODE}}}[$__rate_interval])"


def _of_line_rate(direction: str) -> str:
    return f"{_rate(direction)} / on ({BY_PORT}) gpumon_nic_link_speed_bytes_per_second{{{NODE}}}"


def nic_utilization(selector: str = NODE) -> str:
    """Each NIC's busier direction (any port) over the rate interval, as a share of its line rate. The
    transmit side gets a label of its own so that ``or`` keeps both directions for the max."""
    speed = f"gpumon_nic_link_speed_bytes_per_second{{{selector}}}"
    rx = f"rate(gpumon_nic_receive_bytes_total{{{selector}}}[$__rate_interval]) / on ({BY_PORT}) {speed}"
    tx = f"rate(gpumon_nic_transmit_bytes_total{{{selector}}}[$__rate_interval]) / on ({BY_PORT}) {speed}"
    return f'max by (job, instance, device) ({rx} or label_replace({tx}, "direction", "transmit", "", ""))'


def network() -> list[Panel | Row]:
    return [
        Row("Network (RDMA NICs)"),
        timeseries(
            "NIC throughput, of line rate",
            "Each RDMA port's bytes per second over its link's signalling rate (400 Gb/s NDR is 50 GB/s), "
            "each direction. A collective across nodes at line rate reads 90 % or more while it runs; a "
            "job in collectives whose NICs stay low waits for a slower peer, not for the network.",
            RATIO,
            Target(_of_line_rate("receive"), f"{PORT} receive"),
            Target(_of_line_rate("transmit"), f"{PORT} transmit"),
            hi=1,
        ),
        timeseries(
            "NIC throughput",
            "Each RDMA port's bytes per second (the kernel counts 4-byte words; gpumon serves bytes).",
            BYTES_PER_S,
            Target(_rate("receive"), f"{PORT} receive"),
            Target(_rate("transmit"), f"{PORT} transmit"),
        ),
        timeseries(
            "NIC errors",
            "Errors per second by port and counter: symbol errors and link recoveries are a marginal cable "
            "or transceiver, link_downed a link that failed, receive errors and transmit discards lost "
            "packets (GpumonNicErrorsRising). A port that never counted one reads 0 (its counters are "
            "served from their first rise).",
            PER_SECOND,
            Target(
                f"sum by (instance, device, port, counter) (rate(gpumon_nic_errors_total{{{NODE}}}"
                "[$__rate_interval]))"
                f" or sum by (instance, device, port) (0 * gpumon_nic_up{{{NODE}}})",
                f"{PORT} {{{{counter}}}}",
            ),
        ),
        bargauge(
            "NIC ports up",
            "Ports whose logical state is ACTIVE, over the ports each node has; below 100 % a link is down "
            "(GpumonNicLinkDown) and NCCL falls back to other NICs or fails.",
            RATIO,
            Target(
                f"sum by (instance) (gpumon_nic_up{{{NODE}}})"
                f" / count by (instance) (gpumon_nic_up{{{NODE}}})",
                "{{instance}}",
                instant=True,
            ),
            hi=1,
            steps=HIGHER_IS_BETTER,
        ),
        table(
            "Nearest NIC of each GPU",
            "Each GPU's nearest RDMA NIC from the PCI tree, in nvidia-smi topo -m's terms: PIX (one PCIe "
            "switch between them), PXB (several), PHB (through the CPU's host bridge), NODE (across host "
            "bridges of one NUMA node), SYS (across the socket link: traffic to other nodes crosses the "
            "CPUs' interconnect). gpumon doctor says what to do about it.",
            NONE,
            Target(f"max by (instance, gpu, device, path) (gpumon_gpu_nic_affinity_info{{{NODE}}})"),
            hide=("Time", "__name__", "job", "Value"),
        ),
        timeseries(
            "Ethernet throughput",
            "Each physical Ethernet interface's bytes per second through the kernel. RDMA traffic of a RoCE "
            "port is not here (it is on its NIC above): an interface busy while its RDMA port idles carries "
            "NCCL on TCP sockets, or checkpoints and data.",
            BYTES_PER_S,
            Target(_eth("receive"), "{{instance}} {{interface}} receive"),
            Target(_eth("transmit"), "{{instance}} {{interface}} transmit"),
        ),
    ]


def _eth(direction: str) -> str:
    return f"rate(gpumon_ethernet_{direction}_bytes_total{{{NODE}}}[$__rate_interval])"
