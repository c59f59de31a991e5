"""The fleet overview: every node and GPU at a glance, the utilisation distribution, errors and jobs.

Node aggregates come from the ``instance:`` recording rules so the page stays cheap with thousands of
GPUs; node names are joined in from ``gpumon_node_info{node}`` (gpumon series carry no node label).
"""

from __future__ import annotations

from gpumon.dashboards.builder import Dashboard, Panel, Row, Target
from gpumon.dashboards.panels import (
    COUNT,
    HIGHER_IS_BETTER,
    MEMORY_PRESSURE,
    NONE,
    PER_SECOND,
    RATIO,
    SECONDS,
    WATT,
    ZERO_IS_GOOD,
    bargauge,
    heatmap,
    stat,
    table,
    timeseries,
)
from gpumon.dashboards.variables import common_variables

UID = "gpumon-fleet"
NODE = 'job=~"$job",instance=~"$instance"'
# instance: rules aggregate by instance; the scrape job is not guaranteed to survive the aggregation
INSTANCE = 'instance=~"$instance"'
NODE_NAMES = f"max by (instance, node) (gpumon_node_info{{{NODE}}})"
# instance: rules have no scrape job label: keep the instances of the selected scrape jobs through node_info
SELECTED = f"on(instance) group by (instance) (gpumon_node_info{{{NODE}}})"
# Scrape jobs with gpumon exporters, from the last day: the build info of a job whose exporters are all down
# is stale, and must not hide them (the worst case would read as healthy).
GPUMON_JOBS = 'on(job) group by (job) (last_over_time(gpumon_build_info{job=~"$job"}[1d]))'
THROTTLING = 'reason=~"sw_power_cap|hw_slowdown|sw_thermal|hw_thermal|hw_power_brake"'


def by_node(expr: str) -> str:
    """``expr`` (one series per instance) with the node name joined in, one series per node."""
    return f"sum by (node, instance) ({expr} * on(instance) group_left(node) {NODE_NAMES})"


def node_rule(name: str) -> str:
    return by_node(f"instance:gpumon_{name}{{{INSTANCE}}}")


def selected_rule(name: str) -> str:
    """An ``instance:`` rule for the selected instances of the selected scrape jobs."""
    return f"(instance:gpumon_{name}{{{INSTANCE}}} and {SELECTED})"


def _overview() -> list[Panel | Row]:
    node_link = {
        "targetBlank": False,
        "title": "Node dashboard",
        "url": "/d/gpumon-node?${__url_time_range}&var-instance=${__data.fields.instance}",
    }
    return [
        Row("Fleet"),
        stat(
            "Nodes reporting",
            "Distinct node names among the gpumon exporters Prometheus scrapes successfully now "
            "(gpumon_node_info).",
            COUNT,
            Target(f"count(group by (node) (gpumon_node_info{{{NODE}}}))"),
        ),
        stat(
            "Exporters down",
            "Scrape targets Prometheus cannot reach now (up == 0) in the selected scrape jobs that had a "
            "gpumon exporter up at some point in the last day (0 when none). Their GPUs are unmonitored, not "
            "necessarily broken.",
            COUNT,
            Target(f"count((up{{{NODE}}} == 0) and {GPUMON_JOBS}) or vector(0)"),
            steps=ZERO_IS_GOOD,
        ),
        stat(
            "GPUs",
            "GPUs gpumon knows on the selected nodes (those whose exporter is up).",
            COUNT,
            Target(f"sum{selected_rule('gpus:count')}"),
        ),
        stat(
            "GPUs down",
            "GPUs known on the selected nodes but not answering NVML: lost, fallen off the bus, or hung in a "
            "driver call. GPUs of exporters that are down are not counted: see Exporters down.",
            COUNT,
            Target(f"sum{selected_rule('gpus:count')} - sum{selected_rule('gpus_up:sum')}"),
            steps=ZERO_IS_GOOD,
        ),
        stat(
            "Mean GPU utilisation",
            "Mean utilisation over every selected GPU.",
            RATIO,
            Target(f"avg(gpumon_gpu_utilization_ratio{{{NODE}}})"),
        ),
        stat(
            "GPU power",
            "Power draw of every selected GPU together.",
            WATT,
            Target(f"sum{selected_rule('gpu_power_watts:sum')}"),
        ),
        table(
            "Nodes",
            "Each node: GPUs known and up, mean utilisation, HBM used, GPU power and XID events since gpumon "
            "started. Click a node for its dashboard.",
            COUNT,
            Target(node_rule("gpus:count")),
            Target(node_rule("gpus_up:sum")),
            Target(node_rule("gpu_utilization:avg")),
            Target(node_rule("gpu_memory_used:ratio")),
            Target(node_rule("gpu_power_watts:sum")),
            Target(by_node(f'sum by (instance) (gpumon_gpu_events_total{{{NODE},event="xid"}})')),
            width=24,
            columns={
                "Value #A": ("GPUs", COUNT),
                "Value #B": ("GPUs up", COUNT),
                "Value #C": ("utilisation", RATIO),
                "Value #D": ("HBM used", RATIO),
                "Value #E": ("power", WATT),
                "Value #F": ("XID events", COUNT),
            },
            links=[node_link],
        ),
        table(
            "GPU models",
            "GPUs by model name on the selected nodes.",
            COUNT,
            Target(f"count by (name) (gpumon_gpu_info{{{NODE}}})"),
            width=8,
            columns={"Value": ("GPUs", COUNT)},
        ),
        table(
            "Software",
            "gpumon version, backend (sim: simulated GPUs), NVIDIA driver and CUDA driver version per node.",
            NONE,
            Target(
                "max by (node, instance, version, backend, driver_version, cuda_driver_version)"
                f" (gpumon_driver_info{{{NODE}}} * on(job, instance) group_left(version, backend)"
                f" gpumon_build_info{{{NODE}}} * on(instance) group_left(node) {NODE_NAMES})"
            ),
            width=16,
            hide=("Time", "Value"),
        ),
    ]


def _utilisation() -> list[Panel | Row]:
    util = f"gpumon_gpu_utilization_ratio{{{NODE}}}"
    return [
        Row("Utilisation"),
        heatmap(
            "GPU utilisation distribution",
            "How many GPUs ran at which utilisation, over time (10 % buckets). A fleet doing useful work "
            "sits at the top; a band at the bottom is idle or starved GPUs.",
            RATIO,
            Target(util, "{{instance}} {{gpu}}"),
            calculate_step="0.1",
            width=12,
            height=8,
        ),
        timeseries(
            "Utilisation spread across GPUs",
            "Minimum, 10th percentile, median and mean utilisation over every selected GPU.",
            RATIO,
            Target(f"min({util})", "min"),
            Target(f"quantile(0.1, {util})", "p10"),
            Target(f"quantile(0.5, {util})", "median"),
            Target(f"avg({util})", "mean"),
            hi=1,
        ),
        bargauge(
            "Mean utilisation by node",
            "Mean GPU utilisation of each node, now.",
            RATIO,
            Target(node_rule("gpu_utilization:avg"), "{{node}}", instant=True),
            width=8,
            hi=1,
        ),
        bargauge(
            "HBM used by node",
            "Device memory allocated over installed, each node, now.",
            RATIO,
            Target(node_rule("gpu_memory_used:ratio"), "{{node}}", instant=True),
            width=8,
            hi=1,
            steps=MEMORY_PRESSURE,
        ),
        timeseries(
            "GPU power by node",
            "Power draw of each node's GPUs together.",
            WATT,
            Target(node_rule("gpu_power_watts:sum"), "{{node}}"),
            width=8,
        ),
    ]


def _errors() -> list[Panel | Row]:
    return [
        Row("Errors"),
        stat(
            "ECC uncorrected errors",
            "Uncorrected ECC errors since the drivers loaded, all selected GPUs (the counter appears with a "
            "GPU's first error: none is 0).",
            COUNT,
            Target(
                f'sum(gpumon_gpu_ecc_errors_total{{{NODE},type="uncorrected"}})'
                f" or 0 * count(gpumon_gpu_up{{{NODE}}})"
            ),
            width=6,
            steps=ZERO_IS_GOOD,
        ),
        stat(
            "Row remap failures",
            "GPUs whose HBM row remapping failed: they need service.",
            COUNT,
            Target(f"sum(gpumon_gpu_row_remap_failure{{{NODE}}})"),
            width=6,
            steps=ZERO_IS_GOOD,
        ),
        stat(
            "PCIe replays",
            "PCIe retransmissions per second, summed over every selected GPU.",
            PER_SECOND,
            Target(f"sum(rate(gpumon_gpu_pcie_replays_total{{{NODE}}}[$__rate_interval]))"),
            width=6,
        ),
        stat(
            "Sampling errors",
            "Failed or hung NVML calls per second, summed over every selected node (0 when none).",
            PER_SECOND,
            Target(f"sum(rate(gpumon_errors_total{{{NODE}}}[$__rate_interval])) or vector(0)"),
            width=6,
        ),
        timeseries(
            "XID events by node",
            "XID errors per second on each node; the table beside gives the codes.",
            PER_SECOND,
            Target(
                by_node(
                    "sum by (instance)"
                    f' (rate(gpumon_gpu_events_total{{{NODE},event="xid"}}[$__rate_interval]))'
                ),
                "{{node}}",
            ),
        ),
        table(
            "XID errors by node and code",
            "XID errors since gpumon started, per node and code, summed over the node's GPUs, with the "
            "catalogue's description and severity (docs/xid.md; where gpumon versions word a code "
            "differently, one wording is shown). Empty while no GPU has reported an XID.",
            COUNT,
            Target(
                f"sum by (node, instance, xid) (gpumon_gpu_xid_errors_total{{{NODE}}}"
                f" * on(instance) group_left(node) {NODE_NAMES})"
                " * on(xid) group_left(description, severity)"
                # one catalogue entry per code: nodes on different gpumon versions may word it differently
                f" topk by (xid) (1, max by (xid, description, severity) (gpumon_xid_info{{{NODE}}}))"
            ),
            columns={"Value": ("errors", COUNT)},
        ),
        timeseries(
            "GPUs up by node",
            "GPUs answering NVML on each node.",
            COUNT,
            Target(node_rule("gpus_up:sum"), "{{node}}"),
        ),
        timeseries(
            "GPUs throttled by reason",
            "GPUs whose clocks a power or thermal reason holds down right now, by reason.",
            COUNT,
            Target(
                f"count by (reason) (rate(gpumon_gpu_throttle_seconds_total{{{NODE},{THROTTLING}}}"
                "[$__rate_interval]) > 0.1)"
                f" or sum by (reason) (gpumon_gpu_throttle_active{{{NODE},{THROTTLING}}})",
                "{{reason}}",
            ),
        ),
    ]


def _jobs() -> list[Panel | Row]:
    def job(name: str) -> Target:
        # the same labels in every query (job_name only), so the table merges them into one row per job;
        # jobs with a rank on the selected nodes, their figures over all their nodes
        return Target(
            f"max by (job_name) (job_name:gpumon_training_{name}"
            f" and on(job_name) gpumon_training_rank_info{{{NODE}}})"
        )

    return [
        Row("Training jobs"),
        table(
            "Training jobs",
            "Every job with a rank on the selected nodes, with its figures over all its nodes: tokens/s, "
            "GPUs, MFU, mean step time over its ranks, throughput against its baseline, scaling "
            "efficiency (where a baseline at a smaller scale exists) and goodput (the share of its "
            "wall-clock over the last hour that became kept "
            "progress). Open the training dashboard for one job.",
            COUNT,
            job("tokens_per_second:sum"),
            job("gpus:count"),
            job("mfu:ratio"),
            job("step_time_seconds:avg"),
            job("throughput_baseline:ratio"),
            job("scaling_efficiency:ratio"),
            job("goodput:ratio_rate1h"),
            width=24,
            columns={
                "Value #A": ("tokens/s", COUNT),
                "Value #B": ("GPUs", COUNT),
                "Value #C": ("MFU", RATIO),
                "Value #D": ("step time", SECONDS),
                "Value #E": ("vs baseline", RATIO),
                "Value #F": ("scaling efficiency", RATIO),
                "Value #G": ("goodput", RATIO),
            },
            links=[
                {
                    "targetBlank": False,
                    "title": "Training job dashboard",
                    "url": "/d/gpumon-training?${__url_time_range}&var-job_name=${__data.fields.job_name}",
                }
            ],
        ),
        timeseries(
            "Goodput by job (last hour)",
            "Share of each job's wall-clock over the trailing hour, all its ranks on every node, that became "
            "kept training progress; the rest went to restarts, redone steps, stalls, checkpoints, "
            "evaluation, data waits or slow steps (the training dashboard shows which). Below 50 % for 30 "
            "minutes, GpumonTrainingGoodputLow fires.",
            RATIO,
            Target(
                "max by (job_name) (job_name:gpumon_training_goodput:ratio_rate1h"
                f" and on(job_name) gpumon_training_rank_info{{{NODE}}})",
                "{{job_name}}",
            ),
            width=24,
            hi=1,
            steps=HIGHER_IS_BETTER,
        ),
    ]


def dashboard() -> Dashboard:
    return Dashboard(
        uid=UID,
        title="gpumon / Fleet",
        description="Every gpumon node and GPU at a glance: nodes and GPUs up or down, the utilisation "
        "distribution, errors, and the training jobs running.",
        variables=common_variables(),
        items=[*_overview(), *_utilisation(), *_errors(), *_jobs()],
        tags=("fleet",),
    )
