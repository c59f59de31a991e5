"""The training job dashboard: a job across all its nodes against its baseline, then per node and rank.

Job-level panels read the ``job_name:`` recording rules (alerts/recording.rules.yml), which sum or average
over every node of a job: the per-node ``gpumon_training_job_*`` gauges only see the ranks reporting to one
daemon. Per-node and per-rank panels read the raw series and so also follow the job/node/instance selection.
"""

from __future__ import annotations

from gpumon.dashboards.builder import Dashboard, Panel, Row, Target
from gpumon.dashboards.panels import (
    COUNT,
    FLOPS,
    HIGHER_IS_BETTER,
    NONE,
    PER_SECOND,
    RATIO,
    SECONDS,
    dashed,
    heatmap,
    stat,
    table,
    timeseries,
)
from gpumon.dashboards.training_ledger import goodput
from gpumon.dashboards.training_ranks import JOB, NODE, RAW, diagnosis, named, rule, stragglers
from gpumon.dashboards.variables import common_variables, query_variable

UID = "gpumon-training"
BASE = 'job=~"$job",job_name=~"$job_name"'  # baseline gauges: the same on every node of a job
# a job's steps on each node in one histogram (the per-rank buckets are opt-in: rank-step-buckets)
STEP_BUCKETS = f"gpumon_training_job_step_duration_seconds_bucket{{{RAW}}}"


def baseline(metric: str) -> str:
    # every node of a job exposes the same baseline figure: one per job
    return f"max by (job_name) (gpumon_training_baseline_{metric}{{{BASE}}})"


def _overview() -> list[Panel | Row]:
    return [
        Row("Job overview (all nodes)"),
        stat(
            "Tokens/s",
            "Tokens per second of the whole job, summed over its nodes and ranks.",
            COUNT,
            Target(rule("tokens_per_second:sum"), "{{job_name}}"),
        ),
        stat(
            "GPUs",
            "GPUs the job runs on across its nodes (each MIG device counts as one).",
            COUNT,
            Target(rule("gpus:count"), "{{job_name}}"),
        ),
        stat(
            "Throughput vs baseline",
            "Per-GPU tokens/s over the baseline recorded for this workload, GPU model, GPU count and dtype "
            "(gpumon baseline). Sustained below 90 %, the throughput-below-baseline alert fires.",
            RATIO,
            Target(rule("throughput_baseline:ratio"), "{{job_name}}"),
            steps=HIGHER_IS_BETTER,
        ),
        stat(
            "MFU",
            "Model FLOPs utilisation of the job: achieved FLOP/s over the dense peak of its GPUs.",
            RATIO,
            Target(rule("mfu:ratio"), "{{job_name}}"),
        ),
        stat(
            "Tokens per joule",
            "Tokens per joule of GPU energy, the whole job.",
            COUNT,
            Target(rule("tokens_per_joule:ratio"), "{{job_name}}"),
            decimals=2,
        ),
        stat(
            "Scaling efficiency",
            "Job tokens/s over (GPUs x per-GPU tokens/s of the smallest baseline of the same workload): "
            "100 % is perfect linear scaling. No data until a baseline at a smaller scale than the job is "
            "recorded (one GPU or one node; docs/baselines.md).",
            RATIO,
            Target(rule("scaling_efficiency:ratio"), "{{job_name}}"),
            steps=HIGHER_IS_BETTER,
        ),
        table(
            "Baseline in use",
            "The baseline each job is compared with and the key it matched on (docs/baselines.md).",
            NONE,
            Target(
                "max by (job_name, baseline, workload, gpu_model, gpus, dtype, flops_convention)"
                f" (gpumon_training_baseline_info{{{BASE}}})"
            ),
            width=24,
            height=5,
            hide=("Time", "Value"),
        ),
    ]


def _throughput() -> list[Panel | Row]:
    return [
        Row("Throughput and efficiency"),
        timeseries(
            "Tokens/s per GPU vs baseline",
            "Per-GPU tokens/s of the job across its nodes (solid) and its baseline's (dashed).",
            COUNT,
            Target(rule("tokens_per_second_per_gpu:ratio"), "{{job_name}}"),
            Target(baseline("tokens_per_second_per_gpu"), "{{job_name}} baseline"),
            overrides=[dashed(".* baseline")],
        ),
        timeseries(
            "Tokens/s by node",
            "Tokens/s of the job's ranks on each node, stacked: the top is the total of the selected jobs "
            "on the selected nodes.",
            COUNT,
            Target(
                named(f"sum by (job_name, instance) (gpumon_training_job_tokens_per_second{{{RAW}}})"),
                NODE,
            ),
            stack=True,
        ),
        timeseries(
            "Against the baseline",
            "Throughput, MFU, step time and tokens per joule of the job over its baseline's. 100 % is as "
            "recorded; step time above 100 % means slower steps.",
            RATIO,
            *[
                Target(rule(f"{what}_baseline:ratio"), f"{what.replace('_', ' ')} {{{{job_name}}}}")
                for what in ("throughput", "mfu", "step_time", "tokens_per_joule")
            ],
        ),
        timeseries(
            "Scaling efficiency over time",
            "Job tokens/s over GPUs x the per-GPU tokens/s of the baseline with the fewest GPUs.",
            RATIO,
            Target(rule("scaling_efficiency:ratio"), "{{job_name}}"),
        ),
        timeseries(
            "MFU vs baseline",
            "Model FLOPs utilisation of the job (solid) and its baseline's (dashed). MFU above 100 % means "
            "the reported FLOPs per token or dtype is wrong.",
            RATIO,
            Target(rule("mfu:ratio"), "{{job_name}}"),
            Target(baseline("mfu_ratio"), "{{job_name}} baseline"),
            width=8,
            overrides=[dashed(".* baseline")],
        ),
        timeseries(
            "Tokens per joule vs baseline",
            "Tokens per joule of GPU energy (solid) and the baseline's (dashed): performance per watt.",
            COUNT,
            Target(rule("tokens_per_joule:ratio"), "{{job_name}}"),
            Target(baseline("tokens_per_joule"), "{{job_name}} baseline"),
            width=8,
            overrides=[dashed(".* baseline")],
        ),
        timeseries(
            "Achieved FLOP/s by node",
            "Model FLOP/s of the job's ranks on each node: tokens/s x FLOPs per token (ranks on GPUs with "
            "a known peak).",
            FLOPS,
            Target(
                named(f"max by (job_name, instance) (gpumon_training_job_flops_per_second{{{RAW}}})"),
                NODE,
            ),
            width=8,
        ),
    ]


def _steps() -> list[Panel | Row]:
    # A node's mean step time over its ranks (its job histogram's sum over its count); the slowest node is
    # the highest of these. Every node of the job, like the rules.
    hist = "gpumon_training_job_step_duration_seconds"
    node_step_time = (
        f"max by (job_name, instance) (rate({hist}_sum{{{JOB}}}[$__rate_interval]))"
        f" / (max by (job_name, instance) (rate({hist}_count{{{JOB}}}[$__rate_interval])) > 0)"
    )

    def quantile(q: float) -> Target:
        expr = f"histogram_quantile({q}, sum by (job_name, le) (rate({STEP_BUCKETS}[$__rate_interval])))"
        return Target(expr, f"p{round(q * 100)} {{{{job_name}}}}")

    return [
        Row("Step time"),
        timeseries(
            "Step time vs baseline",
            "Mean step time of the job over a minute (all its steps on every node), the slowest "
            "node's over the rate interval (the highest of the nodes' means over their ranks), and the "
            "baseline's (dashed).",
            SECONDS,
            Target(rule("step_time_seconds:avg"), "mean {{job_name}}"),
            Target(f"max by (job_name) ({node_step_time})", "slowest node {{job_name}}"),
            Target(baseline("step_time_seconds"), "{{job_name}} baseline"),
            overrides=[dashed(".* baseline")],
        ),
        timeseries(
            "Step duration quantiles",
            "Median, 90th and 99th percentile of the time between optimizer steps over the rate interval, "
            "from the step histograms of the job on the selected nodes (every rank's steps).",
            SECONDS,
            *[quantile(q) for q in (0.5, 0.9, 0.99)],
        ),
        heatmap(
            "Step duration distribution",
            "Steps per second by how long they took (gpumon_training_job_step_duration_seconds), over the "
            "rate interval. Each rank's steps count, and the histograms of every selected training job and "
            "node are summed into one: select a single job to see only its steps. A second band above the "
            "main one is a periodic stall: checkpoints, evaluation, a slow rank.",
            SECONDS,
            Target(f"sum by (le) (rate({STEP_BUCKETS}[$__rate_interval]))", "{{le}}", "heatmap"),
            cell_unit=PER_SECOND,
        ),
    ]


def dashboard() -> Dashboard:
    job_name = query_variable(
        "job_name", "Training job", 'label_values(gpumon_training_rank_info{job=~"$job"}, job_name)'
    )
    return Dashboard(
        uid=UID,
        title="gpumon / Training job",
        description="A training or inference job across all its nodes against its baseline: tokens/s, "
        "MFU, step time, phase shares, the diagnosed bottleneck, the goodput ledger, allocator memory, "
        "stragglers, tokens per joule, scaling efficiency.",
        variables=common_variables(job_name),
        items=[*_overview(), *_throughput(), *_steps(), *diagnosis(), *goodput(), *stragglers()],
        tags=("training",),
    )
