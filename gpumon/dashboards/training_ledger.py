"""The training dashboard's goodput ledger and allocator sections: where a job's wall-clock went across its
restarts, and what the framework's allocator holds on each rank (docs/training.md)."""

from __future__ import annotations

from gpumon.dashboards.builder import Panel, Row, Target
from gpumon.dashboards.panels import (
    BYTES,
    COUNT,
    HIGHER_IS_BETTER,
    RATIO,
    ZERO_IS_GOOD,
    stat,
    timeseries,
)
from gpumon.dashboards.training_ranks import JOB, RANK, RAW, rule

# all of a job's rank-seconds per second over 5 minutes: goodput plus every badput cause
_WALL = (
    f"(job_name:gpumon_training_goodput_seconds:rate5m{{{JOB}}}"
    f" + sum by (job_name) (job_name_cause:gpumon_training_badput_seconds:rate5m{{{JOB}}}))"
)


def goodput() -> list[Panel | Row]:
    badput_share = (
        f"job_name_cause:gpumon_training_badput_seconds:rate5m{{{JOB}}} / on (job_name) group_left () {_WALL}"
    )
    per_rank = "sum by (job_name, rank, instance)"

    def per_interval(counter: str, legend: str) -> Target:
        # these counters are absent until a rank's first event: a job without one reads 0, not "no data"
        return Target(
            f"sum by (job_name) (increase(gpumon_training_{counter}_total{{{RAW}}}[$__rate_interval]))"
            f" or 0 * count by (job_name) (gpumon_training_steps_total{{{RAW}}})",
            legend,
        )

    return [
        Row("Goodput: where the job's time goes"),
        stat(
            "Goodput (last hour)",
            "Share of the job's wall-clock over the last hour, all ranks on every node, that became kept "
            "training progress; the rest is badput by cause. Below 50 % for 30 minutes, "
            "GpumonTrainingGoodputLow fires.",
            RATIO,
            Target(rule("goodput:ratio_rate1h"), "{{job_name}}"),
            steps=HIGHER_IS_BETTER,
        ),
        timeseries(
            "Where the time goes (goodput ledger)",
            "Each 5 minutes of the job's wall-clock, all ranks, by bucket: goodput (steps kept), then badput "
            "by cause: startup, restart (a dead process's last step to its successor's first), checkpoint, "
            "evaluation, data_wait, stall, lost_progress (steps redone after resuming from an older "
            "checkpoint), slow_steps (excess over the baseline step time). The stack adds up to 100 %; a "
            "restart lands when the successor's first report arrives.",
            RATIO,
            Target(
                f"job_name:gpumon_training_goodput_seconds:rate5m{{{JOB}}} / {_WALL}", "{{job_name}} goodput"
            ),
            Target(badput_share, "{{job_name}} {{cause}}"),
            width=14,
            stack=True,
            hi=1,
        ),
        timeseries(
            "Restarts and steps redone",
            "Processes of the job's ranks that came back as new processes, and the steps they computed again "
            "because they resumed from a checkpoint older than the rank's furthest step, per rate interval.",
            COUNT,
            per_interval("restarts", "{{job_name}} restarts"),
            per_interval("steps_redone", "{{job_name}} steps redone"),
            width=6,
        ),
        Row("Allocator memory (PyTorch ranks on CUDA)"),
        timeseries(
            "Allocated and reserved by rank",
            "What each rank's caching allocator has handed out to tensors (allocated) and holds from the "
            "driver (reserved, used or cached), from torch.cuda.memory_stats(). NVML's per-process figure "
            "adds the CUDA context. GET /v1/jobs/NAME sets them against the estimate.",
            BYTES,
            Target(f"{per_rank} (gpumon_training_allocator_allocated_bytes{{{RAW}}})", f"allocated {RANK}"),
            Target(f"{per_rank} (gpumon_training_allocator_reserved_bytes{{{RAW}}})", f"reserved {RANK}"),
            width=10,
        ),
        timeseries(
            "Fragmentation by rank",
            "Share of each rank's reserved memory that holds no tensor (1 - allocated/reserved). High "
            "together with allocation retries: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
            RATIO,
            Target(
                f"1 - {per_rank} (gpumon_training_allocator_allocated_bytes{{{RAW}}})"
                f" / ({per_rank} (gpumon_training_allocator_reserved_bytes{{{RAW}}}) > 0)",
                RANK,
            ),
            width=7,
            hi=1,
        ),
        timeseries(
            "Allocation retries and OOMs",
            "Allocations that made the allocator flush its cache and synchronise the device (each costs "
            "milliseconds), and out-of-memory errors, summed over the job's ranks per rate interval. Any "
            "makes a memory finding in gpumon diagnose.",
            COUNT,
            per_interval("allocator_retries", "{{job_name}} retries"),
            per_interval("allocator_ooms", "{{job_name}} OOMs"),
            width=7,
            steps=ZERO_IS_GOOD,
        ),
    ]
