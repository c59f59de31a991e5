"""Baselines: the recorded reference figures matching each job on this node, and the job against them.

A job matches the baseline with the same workload, GPU model, GPU count, dtype and FLOPs convention
(``gpumon baseline``; docs/baselines.md). Jobs without one have none of these series, so a rule comparing
against a baseline simply does not evaluate for them. Ratios compare this node's share of the job; the
recording rules in alerts/ do the same across nodes.
"""

from __future__ import annotations

from gpumon.metrics.registry import metric, section
from gpumon.metrics.training import JOB

section("Training jobs against their baseline")
BASELINE_INFO = metric(
    "gpumon_training_baseline_info",
    "gauge",
    "The baseline matching the job: its name and the key it was matched on; 1.",
    (*JOB, "baseline", "workload", "gpu_model", "gpus", "dtype", "flops_convention"),
    source="baseline library",
)
BASELINE_TOKENS = metric(
    "gpumon_training_baseline_tokens_per_second_per_gpu",
    "gauge",
    "Tokens per second per GPU recorded in the job's baseline.",
    JOB,
    source="baseline library",
)
BASELINE_STEP_TIME = metric(
    "gpumon_training_baseline_step_time_seconds",
    "gauge",
    "Step time recorded in the job's baseline.",
    JOB,
    "seconds",
    "baseline library",
)
BASELINE_MFU = metric(
    "gpumon_training_baseline_mfu_ratio",
    "gauge",
    "MFU recorded in the job's baseline.",
    JOB,
    "ratio",
    "baseline library",
)
BASELINE_TPJ = metric(
    "gpumon_training_baseline_tokens_per_joule",
    "gauge",
    "Tokens per joule recorded in the job's baseline.",
    JOB,
    source="baseline library",
)
SCALING_BASELINE = metric(
    "gpumon_training_scaling_baseline_tokens_per_second_per_gpu",
    "gauge",
    "Per-GPU tokens per second of the baseline with the fewest GPUs for the job's workload, GPU model, "
    "dtype and convention (ideally one GPU; `gpus` says how many): the denominator of scaling efficiency.",
    (*JOB, "gpus"),
    source="baseline library",
)
THROUGHPUT_RATIO = metric(
    "gpumon_training_throughput_baseline_ratio",
    "gauge",
    "The job's tokens per second per GPU on this node over its baseline's (1 = as recorded, below 1 = "
    "slower).",
    JOB,
    "ratio",
    "job tokens/s / GPUs / baseline",
)
MFU_RATIO = metric(
    "gpumon_training_mfu_baseline_ratio",
    "gauge",
    "The job's MFU on this node over its baseline's.",
    JOB,
    "ratio",
    "job MFU / baseline",
)
STEP_TIME_RATIO = metric(
    "gpumon_training_step_time_baseline_ratio",
    "gauge",
    "The job's mean step time on this node over its baseline's (above 1 = slower steps).",
    JOB,
    "ratio",
    "step time / baseline",
)
TPJ_RATIO = metric(
    "gpumon_training_tokens_per_joule_baseline_ratio",
    "gauge",
    "The job's tokens per joule on this node over its baseline's.",
    JOB,
    "ratio",
    "tokens/J / baseline",
)
LIBRARY_ENTRIES = metric(
    "gpumon_training_baseline_library_entries",
    "gauge",
    "Baselines in the library file the daemon last loaded successfully.",
    (),
    source="--baselines file",
)
LIBRARY_OK = metric(
    "gpumon_training_baseline_library_ok",
    "gauge",
    "1 when the baseline file was read (or is absent), 0 when the last read failed; the daemon then keeps "
    "the baselines it had and logs why.",
    (),
    source="--baselines file",
)
