"""The training dashboard's per-node and per-rank sections: where the time goes, the diagnosis, stragglers."""

from __future__ import annotations

from gpumon.dashboards.builder import Panel, Row, Target
from gpumon.dashboards.node_network import nic_utilization
from gpumon.dashboards.panels import (
    BYTES_PER_S,
    COUNT,
    HIGHER_IS_BETTER,
    NONE,
    RATIO,
    SECONDS,
    bargauge,
    table,
    timeseries,
)

JOB = 'job_name=~"$job_name"'  # recording-rule series: job_name only, they span nodes and scrape jobs
RAW = 'job=~"$job",instance=~"$instance",job_name=~"$job_name"'
NODE_OF_JOB = 'instance=~"$instance",job_name=~"$job_name"'  # instance_job_name: rules
RANK = "{{job_name}} {{node}} rank {{rank}}"
_NODE_SELECTION = 'job=~"$job",instance=~"$instance"'
NODE = "{{job_name}} {{node}}"


def named(expr: str) -> str:
    """``expr`` with the node's name joined in by instance (gpumon series carry no node label), so a legend
    says gpu-017 where the instance is 10.0.3.17:9478."""
    return f"({expr}) * on (instance) group_left (node) instance:gpumon_node:info"


def rule(name: str) -> str:
    """A job-level recording rule (alerts/recording.rules.yml) for the selected jobs."""
    return f"job_name:gpumon_training_{name}{{{JOB}}}"


def diagnosis() -> list[Panel | Row]:
    gpus = f"max by (job, instance, uuid, job_name) (gpumon_training_rank_gpu_info{{{RAW}}})"
    return [
        Row("Where the time goes"),
        timeseries(
            "Phase shares",
            "Share of wall time in each reported phase, mean over the job's ranks: data_wait is input-bound, "
            "communication is network-bound.",
            RATIO,
            Target(rule("phase:ratio"), "{{job_name}} {{phase}}"),
            stack=True,
        ),
        table(
            "Diagnosed bottleneck by node",
            "The daemon's verdict for the job on each node (docs/training.md, Diagnosis); the evidence is in "
            "gpumon diagnose --job NAME on that node.",
            NONE,
            Target(f"gpumon_training_job_bottleneck{{{RAW}}} == 1"),
            hide=("Time", "__name__", "job", "Value"),
        ),
        timeseries(
            "Nodes by bottleneck",
            "How many of the job's nodes each verdict holds over time: a change of verdict is when the job's "
            "behaviour changed.",
            COUNT,
            Target(
                f"count by (job_name, bottleneck) (gpumon_training_job_bottleneck{{{RAW}}} == 1)",
                "{{job_name}} {{bottleneck}}",
            ),
            stack=True,
        ),
        timeseries(
            "Utilisation of the job's GPUs",
            "Mean GPU utilisation of the GPUs the job's ranks run on, per node.",
            RATIO,
            Target(
                named(
                    "avg by (job_name, instance)"
                    f' (gpumon_gpu_utilization_ratio{{job=~"$job",instance=~"$instance"}}'
                    f" * on(job, instance, uuid) group_right() {gpus})"
                ),
                NODE,
            ),
            hi=1,
        ),
        timeseries(
            "NIC use of the job's ranks",
            "Per rank, the busiest of the RDMA NICs nearest its GPUs (gpumon_gpu_nic_affinity_info), its "
            "busier direction as a share of line rate over the rate interval. Set against the phase shares: "
            "ranks long in communication with their NICs near line rate while communicating are "
            "network-bound; with their NICs low they wait for a slower peer (the stragglers below).",
            RATIO,
            Target(
                named(
                    f"max by (job_name, instance, rank) ({nic_utilization(_NODE_SELECTION)}"
                    " * on (job, instance, device) group_right ()"
                    f" max by (job, instance, job_name, rank, device) (gpumon_training_rank_gpu_info{{{RAW}}}"
                    " * on (job, instance, uuid) group_left (device) gpumon_gpu_nic_affinity_info))"
                ),
                RANK,
            ),
            hi=1,
        ),
        timeseries(
            "NCCL bus bandwidth",
            "NCCL's own bus bandwidth per operation and node, from its Inspector plugin's dumps "
            "(--nccl-inspector-dir): bus bytes over execution time, the figure nccl-tests compares with the "
            "fabric's expected bandwidth. A collective's time includes the wait for its slowest rank: low "
            "with idle NICs is a wait on a peer, low with busy NICs a slow network.",
            BYTES_PER_S,
            Target(
                named(
                    f"sum by (job_name, instance, operation) ({_rate('nccl_bus_bytes_total')})"
                    f" / sum by (job_name, instance, operation) ({_rate('nccl_seconds_total')})"
                ),
                "{{job_name}} {{node}} {{operation}}",
            ),
        ),
    ]


def _rate(counter: str) -> str:
    return f"rate(gpumon_training_{counter}{{{RAW}}}[$__rate_interval])"


def stragglers() -> list[Panel | Row]:
    per_rank = "sum by (job, instance, job_name, rank)"

    def rate(counter: str, more: str = "") -> str:
        return f"rate(gpumon_training_{counter}{{{RAW}{more}}}[$__rate_interval])"

    communication = rate("phase_seconds_total", ',phase="communication"')

    return [
        Row("Stragglers"),
        timeseries(
            "Node throughput vs job median",
            "Each node's per-GPU tokens/s over the median of the job's nodes: a node well below 100 % holds "
            "the whole synchronous job back.",
            RATIO,
            Target(
                named(f"instance_job_name:gpumon_training_throughput_vs_job_median:ratio{{{NODE_OF_JOB}}}"),
                NODE,
            ),
            width=8,
            steps=HIGHER_IS_BETTER,
        ),
        timeseries(
            "Node busy time per step vs job median",
            "Each node's busy time per step (its median rank's step time less communication) over the "
            "median of the job's nodes. In synchronous training every node has the same step time, and the "
            "others wait in the collective for the straggler: its busy time is the one above 100 %.",
            RATIO,
            Target(
                named(
                    f"instance_job_name:gpumon_training_busy_step_time_vs_job_median:ratio{{{NODE_OF_JOB}}}"
                ),
                NODE,
            ),
            width=8,
        ),
        bargauge(
            "Per-GPU tokens/s by node",
            "Tokens/s per GPU of the job's ranks on each node, now.",
            COUNT,
            Target(
                named(f"instance_job_name:gpumon_training_tokens_per_second_per_gpu:ratio{{{NODE_OF_JOB}}}"),
                NODE,
                instant=True,
            ),
            width=8,
        ),
        timeseries(
            "Rank busy time per step vs job median",
            "Each rank's busy time per step (step time less communication, over a minute) over "
            "the median rank of its job across all nodes: 125 % and more for five minutes is a straggler "
            "(GpumonTrainingStragglerRank, or GpumonTrainingStragglerNode when its whole node is). Ranks "
            "that report no communication phase have no busy time.",
            RATIO,
            Target(
                named(
                    "instance_job_name_rank:gpumon_training_busy_step_time_vs_job_median:ratio"
                    f"{{{NODE_OF_JOB}}}"
                ),
                RANK,
            ),
        ),
        timeseries(
            "Rank time per token vs job median",
            "Ranks that report no communication phase: each one's time per token (over a minute) over the "
            "median such rank of its job across all nodes; 125 % and more for five minutes is a straggler.",
            RATIO,
            Target(
                named(
                    "instance_job_name_rank:gpumon_training_time_per_token_vs_job_median:ratio"
                    f"{{{NODE_OF_JOB}}}"
                ),
                RANK,
            ),
        ),
        table(
            "Ranks",
            "Each rank now, from its counters over the rate interval: tokens/s, mean step time, share of "
            "wall time in communication, and seconds since its last step.",
            COUNT,
            Target(f"{per_rank} ({rate('tokens_total')})"),
            Target(
                f"{per_rank} ({rate('step_duration_seconds_sum')})"
                f" / ({per_rank} ({rate('step_duration_seconds_count')}) > 0)"
            ),
            Target(f"{per_rank} ({communication})"),
            Target(f"{per_rank} (time() - gpumon_training_last_progress_timestamp_seconds{{{RAW}}})"),
            columns={
                "Value #A": ("tokens/s", COUNT),
                "Value #B": ("step time", SECONDS),
                "Value #C": ("communication", RATIO),
                "Value #D": ("since last step", SECONDS),
            },
        ),
    ]
