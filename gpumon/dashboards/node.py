"""The node dashboard: every GPU of the selected nodes, one section per concern of docs/metrics.md."""

from __future__ import annotations

from gpumon.dashboards.builder import Dashboard, Panel, Row, Target
from gpumon.dashboards.node_health import BY_GPU, EACH, GPU, errors_and_processes, per_gpu, profiling_and_host
from gpumon.dashboards.node_network import network
from gpumon.dashboards.panels import (
    BYTES,
    BYTES_PER_S,
    CELSIUS,
    COUNT,
    HERTZ,
    HIGHER_IS_BETTER,
    JOULE,
    MEMORY_PRESSURE,
    NONE,
    PER_SECOND,
    RATIO,
    WATT,
    ZERO_IS_GOOD,
    bargauge,
    stat,
    state_timeline,
    table,
    timeseries,
)
from gpumon.dashboards.variables import common_variables, query_variable, sel

UID = "gpumon-node"


def _overview() -> list[Panel | Row]:
    return [
        Row("Overview"),
        stat(
            "GPUs up",
            "GPUs that answered NVML in the latest sweep, and all GPUs gpumon knows on the selection. "
            "A GPU down is lost, off the bus or hung in a driver call (gpumon_gpu_up).",
            COUNT,
            Target(f"sum(gpumon_gpu_up{{{GPU}}})", "up"),
            Target(f"count(gpumon_gpu_up{{{GPU}}})", "known"),
        ),
        stat(
            "Mean GPU utilisation",
            "Mean over the selected GPUs of the share of time a kernel was running.",
            RATIO,
            Target(f"avg(gpumon_gpu_utilization_ratio{{{GPU}}})"),
        ),
        stat(
            "HBM used, all GPUs",
            "Device memory allocated over memory installed, all selected GPUs together.",
            RATIO,
            Target(
                f"sum(gpumon_gpu_memory_used_bytes{{{GPU}}}) / sum(gpumon_gpu_memory_total_bytes{{{GPU}}})"
            ),
            steps=MEMORY_PRESSURE,
        ),
        stat(
            "Total power draw",
            "Current power draw of the selected GPUs together.",
            WATT,
            Target(f"sum(gpumon_gpu_power_watts{{{GPU}}})"),
        ),
        stat(
            "Energy since driver load",
            "Energy the selected GPUs consumed since their driver loaded (NVML total energy counter).",
            JOULE,
            Target(f"sum(gpumon_gpu_energy_joules_total{{{GPU}}})"),
        ),
        stat(
            "XID errors since gpumon started",
            "XID events NVML reported on the selected GPUs since gpumon started; the codes and what they "
            "mean are in the XID table below and in docs/xid.md.",
            COUNT,
            Target(f'sum(gpumon_gpu_events_total{{{GPU},event="xid"}})'),
            steps=ZERO_IS_GOOD,
        ),
        table(
            "GPUs",
            "Static facts about each GPU (model, PCI bus id, serial, VBIOS). Join them into any query with "
            "* on(uuid) group_left(name) gpumon_gpu_info.",
            NONE,
            Target(sel("gpumon_gpu_info", GPU)),
            width=24,
            height=6,
            hide=("Time", "__name__", "job", "Value"),
        ),
    ]


def _activity() -> list[Panel | Row]:
    return [
        Row("Utilisation and memory"),
        per_gpu(
            "GPU utilisation",
            "Share of the driver's sample window in which a kernel was running. Busy does not mean "
            "efficient: see tensor and SM activity under Profiling.",
            RATIO,
            "gpumon_gpu_utilization_ratio",
            hi=1,
        ),
        per_gpu(
            "Memory controller utilisation",
            "Share of the driver's sample window in which device memory was read or written.",
            RATIO,
            "gpumon_gpu_memory_controller_utilization_ratio",
            hi=1,
        ),
        per_gpu("HBM used", "Device memory allocated by processes.", BYTES, "gpumon_gpu_memory_used_bytes"),
        bargauge(
            "HBM used share",
            "Device memory allocated over memory installed, per GPU. Above 80 % memory may become the "
            "bottleneck; above 90 % it is one.",
            RATIO,
            Target(
                f"gpumon_gpu_memory_used_bytes{{{GPU}}} / gpumon_gpu_memory_total_bytes{{{GPU}}}",
                EACH,
                instant=True,
            ),
            hi=1,
            steps=MEMORY_PRESSURE,
        ),
        Row("Power, energy and temperature"),
        per_gpu(
            "Power draw",
            "Power draw per GPU (a 1 s average on Ampere and later).",
            WATT,
            "gpumon_gpu_power_watts",
            width=8,
        ),
        timeseries(
            "Power draw vs limit",
            "Power draw over the power limit the driver enforces; near 100 % the GPU is power-capped and its "
            "clocks drop (see Clocks and throttling).",
            RATIO,
            Target(f"gpumon_gpu_power_watts{{{GPU}}} / gpumon_gpu_power_limit_watts{{{GPU}}}", EACH),
            width=8,
            hi=1,
        ),
        timeseries(
            "Average power from the energy counter",
            "Rate of the energy counter: average power over the rate interval, the figure tokens per "
            "joule is computed from.",
            WATT,
            Target(f"rate(gpumon_gpu_energy_joules_total{{{GPU}}}[$__rate_interval])", EACH),
            width=8,
        ),
        per_gpu("GPU temperature", "GPU core temperature.", CELSIUS, "gpumon_gpu_temperature_celsius"),
        per_gpu(
            "HBM temperature",
            "HBM temperature (absent on GDDR boards); memory throttles near 95 C on H100.",
            CELSIUS,
            "gpumon_gpu_memory_temperature_celsius",
        ),
    ]


THROTTLE_REASONS = "sw_power_cap|hw_slowdown|sw_thermal|hw_thermal|hw_power_brake"


def _clocks_and_links() -> list[Panel | Row]:
    return [
        Row("Clocks and throttling"),
        timeseries(
            "Clocks",
            "Current SM and memory clocks per GPU.",
            HERTZ,
            Target(sel("gpumon_gpu_sm_clock_hertz", GPU), "SM " + EACH),
            Target(sel("gpumon_gpu_memory_clock_hertz", GPU), "memory " + EACH),
            width=8,
        ),
        timeseries(
            "SM clock vs maximum",
            "Current SM clock over its maximum: a sustained drop under load is throttling.",
            RATIO,
            Target(f"gpumon_gpu_sm_clock_hertz{{{GPU}}} / gpumon_gpu_sm_clock_max_hertz{{{GPU}}}", EACH),
            width=8,
            hi=1,
        ),
        timeseries(
            "Throttled time share by reason",
            "Share of time clocks were held down for each power or thermal reason, mean over the selected "
            "GPUs (NVML cumulative throttle time).",
            RATIO,
            Target(
                f"avg by (reason) (rate(gpumon_gpu_throttle_seconds_total{{{GPU}}}[$__rate_interval]))",
                "{{reason}}",
            ),
            width=8,
        ),
        state_timeline(
            "Clock event reasons",
            "Which clock event reasons held any selected GPU's clocks down for over 10 % of the interval "
            "(from the cumulative throttle time; hw_slowdown from its 0/1 series). The power and thermal "
            "ones ("
            + THROTTLE_REASONS.replace("|", ", ")
            + ") cost throughput; with --collect throttle-reasons the harmless ones (gpu_idle) show too.",
            {"0": ("inactive", "green"), "1": ("active", "orange")},
            Target(
                # the counters say a reason held clocks for over 10 % of the interval; the 0/1 series cover
                # the reasons without one (hw_slowdown, and every reason with --collect throttle-reasons)
                f"max by (reason) (rate(gpumon_gpu_throttle_seconds_total{{{GPU}}}[$__rate_interval])"
                f" > bool 0.1) or max by (reason) (gpumon_gpu_throttle_active{{{GPU}}})",
                "{{reason}}",
            ),
            height=7,
        ),
        Row("PCIe and NVLink"),
        timeseries(
            "PCIe throughput",
            "PCIe bytes per second from the cumulative counters, or NVML's 20 ms throughput sample on GPUs "
            "without them.",
            BYTES_PER_S,
            *[
                Target(
                    f"rate(gpumon_gpu_pcie_{d}_bytes_total{{{GPU}}}[$__rate_interval])"
                    f" or gpumon_gpu_pcie_{d}_bytes_per_second{{{GPU}}}",
                    f"{d} {EACH}",
                )
                for d in ("transmit", "receive")
            ],
            width=8,
        ),
        timeseries(
            "NVLink throughput",
            "Data bytes per second over all NVLinks of each GPU (NVLink4 peaks near 450 GB/s per direction).",
            BYTES_PER_S,
            *[
                Target(f"rate(gpumon_gpu_nvlink_{d}_bytes_total{{{GPU}}}[$__rate_interval])", f"{d} {EACH}")
                for d in ("transmit", "receive")
            ],
            width=8,
        ),
        bargauge(
            "NVLink links up",
            "Active NVLinks over the links each GPU has; below 100 % a link is down and collectives slow.",
            RATIO,
            Target(
                f"max by ({BY_GPU}) (gpumon_gpu_nvlink_links_up{{{GPU}}})"
                f" / on({BY_GPU}) gpumon_gpu_nvlink_links{{{GPU}}}",
                EACH,
                instant=True,
            ),
            width=8,
            hi=1,
            steps=HIGHER_IS_BETTER,
        ),
        table(
            "PCIe link",
            "Current PCIe generation and width against the maximum; links train down when idle, but a "
            "degraded link under load halves host transfers.",
            NONE,
            *[
                Target(f"max by ({BY_GPU}) (gpumon_gpu_pcie_link_{q}{{{GPU}}})")
                for q in ("generation", "max_generation", "width", "max_width")
            ],
            columns={
                "Value #A": ("generation", NONE),
                "Value #B": ("max generation", NONE),
                "Value #C": ("width", NONE),
                "Value #D": ("max width", NONE),
            },
        ),
        timeseries(
            "PCIe replays",
            "PCIe retransmissions after link errors per second; a steady rate points at a bad riser or slot.",
            PER_SECOND,
            Target(f"rate(gpumon_gpu_pcie_replays_total{{{GPU}}}[$__rate_interval])", EACH),
        ),
    ]


def dashboard() -> Dashboard:
    gpu = query_variable(
        "gpu", "GPU", 'label_values(gpumon_gpu_info{job=~"$job",instance=~"$instance"}, gpu)', numeric=True
    )
    return Dashboard(
        uid=UID,
        title="gpumon / Node",
        description="Every GPU of the selected nodes: utilisation, HBM, power, thermals, clocks, links, "
        "RDMA NICs, errors, processes and profiling counters, from the gpumon exporter.",
        variables=common_variables(gpu),
        items=[
            *_overview(),
            *_activity(),
            *_clocks_and_links(),
            *network(),
            *errors_and_processes(),
            *profiling_and_host(),
        ],
        tags=("gpu", "node"),
    )
