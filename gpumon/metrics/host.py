"""The host the GPUs sit in, and its RDMA NICs (gpumon/net)."""

from __future__ import annotations

from gpumon.metrics.registry import metric, section

section("Host")
HOST_CPU = metric(
    "gpumon_host_cpu_utilization_ratio",
    "gauge",
    "Host CPU busy fraction since the previous sweep, all cores.",
    (),
    "ratio",
    "psutil.cpu_percent",
)
HOST_CPUS = metric("gpumon_host_cpus", "gauge", "Logical CPUs on the host.", (), source="psutil.cpu_count")
HOST_MEM_TOTAL = metric(
    "gpumon_host_memory_total_bytes", "gauge", "Host memory installed.", (), "bytes", "psutil.virtual_memory"
)
HOST_MEM_AVAIL = metric(
    "gpumon_host_memory_available_bytes",
    "gauge",
    "Host memory available without swapping.",
    (),
    "bytes",
    "psutil.virtual_memory",
)
HOST_LOAD1 = metric("gpumon_host_load1", "gauge", "1-minute load average.", (), source="os.getloadavg")
HOST_LOAD5 = metric("gpumon_host_load5", "gauge", "5-minute load average.", (), source="os.getloadavg")
HOST_LOAD15 = metric("gpumon_host_load15", "gauge", "15-minute load average.", (), source="os.getloadavg")

section("RDMA NICs")
NIC = ("device", "port")
NIC_SOURCE = "/sys/class/infiniband"
NIC_INFO = metric(
    "gpumon_nic_info",
    "gauge",
    "An RDMA port (InfiniBand, or RoCE where link_layer is Ethernet), its adapter's PCI function, board and "
    "firmware.",
    (*NIC, "link_layer", "pci_bus_id", "board_id", "fw_ver"),
    source=NIC_SOURCE,
)
NIC_UP = metric(
    "gpumon_nic_up", "gauge", "1 if the port's logical state is ACTIVE, else 0.", NIC, source=NIC_SOURCE
)
NIC_SPEED = metric(
    "gpumon_nic_link_speed_bytes_per_second",
    "gauge",
    "The link's signalling rate: a port's traffic is measured against it.",
    NIC,
    "bytes/s",
    f"{NIC_SOURCE} rate",
)
NIC_RX = metric(
    "gpumon_nic_receive_bytes_total",
    "counter",
    "Bytes received by the port (its 64-bit data counter, which counts 4-byte words).",
    NIC,
    "bytes",
    "port_rcv_data",
)
NIC_TX = metric(
    "gpumon_nic_transmit_bytes_total",
    "counter",
    "Bytes transmitted by the port.",
    NIC,
    "bytes",
    "port_xmit_data",
)
NIC_ERRORS = metric(
    "gpumon_nic_errors_total",
    "counter",
    "The port's error counters, by the kernel's name: symbol_error, link_error_recovery, link_downed, "
    "port_rcv_errors, port_xmit_discards (nic-detail adds the rest). The hardware's counters saturate "
    "rather than wrap. Absent until it first rises (0 first, so increase() sees it), or at once where the "
    "adapter counted some before.",
    (*NIC, "counter"),
    source=f"{NIC_SOURCE} counters",
)
NIC_RX_PACKETS = metric(
    "gpumon_nic_receive_packets_total",
    "counter",
    "Packets received by the port.",
    NIC,
    source="port_rcv_packets",
    detail="nic-detail",
)
NIC_TX_PACKETS = metric(
    "gpumon_nic_transmit_packets_total",
    "counter",
    "Packets transmitted by the port.",
    NIC,
    source="port_xmit_packets",
    detail="nic-detail",
)
NIC_HW = metric(
    "gpumon_nic_hw_events_total",
    "counter",
    "The driver's RoCE congestion and transport counters where it has them, by name: np_cnp_sent, "
    "np_ecn_marked_roce_packets, rp_cnp_handled (congestion), out_of_sequence, packet_seq_err, "
    "local_ack_timeout_err, rnr_nak_retry_err, out_of_buffer (drops and retries).",
    (*NIC, "counter"),
    source=f"{NIC_SOURCE} hw_counters",
    detail="nic-detail",
)
NIC_AFFINITY = metric(
    "gpumon_gpu_nic_affinity_info",
    "gauge",
    "The RDMA NIC nearest the GPU in the PCI tree, and the path between them as nvidia-smi topo -m names it: "
    "PIX (one PCIe switch), PXB (several), PHB (the CPU's host bridge), NODE (host bridges of one NUMA "
    "node), SYS (across the socket link).",
    ("gpu", "uuid", "device", "path"),
    source="/sys/bus/pci/devices",
)

section("Ethernet interfaces")
ETH = ("interface",)
ETH_SOURCE = "/sys/class/net"
ETH_INFO = metric(
    "gpumon_ethernet_info",
    "gauge",
    "A physical Ethernet interface (one with a PCI function; not loopback, bridges, veths or IPoIB) and "
    "its PCI function, to place it beside the GPUs.",
    (*ETH, "pci_bus_id"),
    source=ETH_SOURCE,
)
ETH_UP = metric(
    "gpumon_ethernet_up",
    "gauge",
    "1 if the interface's operational state is up, else 0; absent where the driver does not say.",
    ETH,
    source=f"{ETH_SOURCE} operstate",
)
ETH_SPEED = metric(
    "gpumon_ethernet_link_speed_bytes_per_second",
    "gauge",
    "The link's negotiated speed; absent without a link.",
    ETH,
    "bytes/s",
    f"{ETH_SOURCE} speed",
)
ETH_RX = metric(
    "gpumon_ethernet_receive_bytes_total",
    "counter",
    "Bytes received by the interface through the kernel (RDMA traffic of a RoCE port counts on its RDMA "
    "port, not here: TCP here while the port idles is NCCL on sockets).",
    ETH,
    "bytes",
    "statistics/rx_bytes",
)
ETH_TX = metric(
    "gpumon_ethernet_transmit_bytes_total",
    "counter",
    "Bytes transmitted by the interface through the kernel.",
    ETH,
    "bytes",
    "statistics/tx_bytes",
)
ETH_ERRORS = metric(
    "gpumon_ethernet_errors_total",
    "counter",
    "The interface's error and drop counters, by the kernel's name: rx_errors, tx_errors, rx_dropped, "
    "tx_dropped, rx_crc_errors, tx_carrier_errors. Absent until it first rises (0 first), or at once where "
    "the interface counted some before.",
    (*ETH, "counter"),
    source=f"{ETH_SOURCE} statistics",
)
