"""PCIe and NVLink: throughput counters, link state, replays."""

from __future__ import annotations

from gpumon.metrics.registry import GPU, metric, section

section("PCIe")
PCIE_TX = metric(
    "gpumon_gpu_pcie_transmit_bytes_total",
    "counter",
    "Bytes the GPU sent over PCIe.",
    unit="bytes",
    source="field NVML_FI_DEV_PCIE_COUNT_TX_BYTES (197)",
    field="pcie_transmit_bytes",
)
PCIE_RX = metric(
    "gpumon_gpu_pcie_receive_bytes_total",
    "counter",
    "Bytes the GPU received over PCIe.",
    unit="bytes",
    source="field NVML_FI_DEV_PCIE_COUNT_RX_BYTES (198)",
    field="pcie_receive_bytes",
)
PCIE_TX_RATE = metric(
    "gpumon_gpu_pcie_transmit_bytes_per_second",
    "gauge",
    "PCIe send rate over a 20 ms window; only on GPUs without the byte counters above.",
    unit="bytes/s",
    source="nvmlDeviceGetPcieThroughput(TX) (KB/s)",
    field="pcie_transmit_bytes_per_second",
)
PCIE_RX_RATE = metric(
    "gpumon_gpu_pcie_receive_bytes_per_second",
    "gauge",
    "PCIe receive rate over a 20 ms window; only on GPUs without the byte counters above.",
    unit="bytes/s",
    source="nvmlDeviceGetPcieThroughput(RX) (KB/s)",
    field="pcie_receive_bytes_per_second",
)
PCIE_GEN = metric(
    "gpumon_gpu_pcie_link_generation",
    "gauge",
    "Current PCIe link generation (some boards drop it when idle to save power; H100 and H200 do not).",
    source="nvmlDeviceGetCurrPcieLinkGeneration",
    field="pcie_link_generation",
)
PCIE_WIDTH = metric(
    "gpumon_gpu_pcie_link_width",
    "gauge",
    "Current PCIe link width in lanes.",
    source="nvmlDeviceGetCurrPcieLinkWidth",
    field="pcie_link_width",
)
PCIE_GEN_MAX = metric(
    "gpumon_gpu_pcie_link_max_generation",
    "gauge",
    "Maximum PCIe link generation of the GPU.",
    source="nvmlDeviceGetMaxPcieLinkGeneration",
)
PCIE_WIDTH_MAX = metric(
    "gpumon_gpu_pcie_link_max_width",
    "gauge",
    "Maximum PCIe link width in lanes.",
    source="nvmlDeviceGetMaxPcieLinkWidth",
)
PCIE_REPLAYS = metric(
    "gpumon_gpu_pcie_replays_total",
    "counter",
    "PCIe replays (retransmissions after link errors).",
    source="field NVML_FI_DEV_PCIE_REPLAY_COUNTER, else nvmlDeviceGetPcieReplayCounter",
    field="pcie_replays",
)

section("NVLink")
NVL_TX = metric(
    "gpumon_gpu_nvlink_transmit_bytes_total",
    "counter",
    "Data bytes sent over all NVLinks of the GPU.",
    unit="bytes",
    source="field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (138), all links (KiB)",
    field="nvlink_transmit_bytes",
)
NVL_RX = metric(
    "gpumon_gpu_nvlink_receive_bytes_total",
    "counter",
    "Data bytes received over all NVLinks of the GPU.",
    unit="bytes",
    source="field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX (139), all links (KiB)",
    field="nvlink_receive_bytes",
)
NVL_LINKS = metric(
    "gpumon_gpu_nvlink_links",
    "gauge",
    "NVLinks the GPU has.",
    source="field NVML_FI_DEV_NVLINK_LINK_COUNT (91)",
)
NVL_LINKS_UP = metric(
    "gpumon_gpu_nvlink_links_up",
    "gauge",
    "NVLinks of the GPU that are active; below gpumon_gpu_nvlink_links a link is down and collectives slow.",
    source="field NVML_FI_DEV_NVLINK_GET_STATE (165) per link, else nvmlDeviceGetNvLinkState",
)
NVL_LINK_UP = metric(
    "gpumon_gpu_nvlink_link_up",
    "gauge",
    "1 if the link is active (refreshed every 10 sweeps).",
    (*GPU, "link"),
    source="field NVML_FI_DEV_NVLINK_GET_STATE (165), else nvmlDeviceGetNvLinkState",
    detail="nvlink-links",
)
NVL_LINK_TX = metric(
    "gpumon_gpu_nvlink_link_transmit_bytes_total",
    "counter",
    "Data bytes sent over one NVLink.",
    (*GPU, "link"),
    "bytes",
    "field 138, scopeId = link (KiB)",
    detail="nvlink-links",
)
NVL_LINK_RX = metric(
    "gpumon_gpu_nvlink_link_receive_bytes_total",
    "counter",
    "Data bytes received over one NVLink.",
    (*GPU, "link"),
    "bytes",
    "field 139, scopeId = link (KiB)",
    detail="nvlink-links",
)
