"""What training and inference processes report through the SDK, and what the daemon derives from it.

Every series is per ``job_name`` (not ``job``: Prometheus owns that label for the scrape job) and, except
the job-level rows, per ``rank`` (the global rank). Which GPUs a rank uses is in
``gpumon_training_rank_gpu_info``; join GPU series with
``* on(uuid) group_left(job_name, rank) gpumon_training_rank_gpu_info``.

Per rank, by default, only the facts a rule cannot derive: counters (steps, tokens, samples, phase seconds,
the ledger, the step-time sum and count) and a few gauges. What the daemon derives per rank over its window
is per job on the node, and the rank-rates detail adds it back per rank. Counters of events most ranks
never see (a badput cause, restarts, redone steps, allocator retries and OOMs) are absent until the first
one, then served at 0 for two renders before their value (gpumon/zerofirst.py), so
rate() and increase() see the first occurrence; a rule that needs a number where there is none adds
``or vector(0)``.
"""

from __future__ import annotations

from gpumon.metrics.registry import metric, section

JOB = ("job_name",)
RANK = ("job_name", "rank")

section("Training and inference jobs: reported by the SDK")
RANK_INFO = metric(
    "gpumon_training_rank_info",
    "gauge",
    "A rank reporting to this node's daemon, with what it declared; 1 while it reports.",
    (*RANK, "world_size", "local_rank", "kind", "workload", "dtype", "flops_convention"),
    source="SDK report",
)
RANK_GPU_INFO = metric(
    "gpumon_training_rank_gpu_info",
    "gauge",
    "A GPU (or MIG device, mig_uuid) a rank uses, from the device it reported (via device or mig) or "
    "NVML's process list by its pid (via process); 1. Absent for a rank that is gone (final report, pid "
    "gone, or silent for 4 report intervals): its counters stay, its GPUs leave the job's count.",
    (*RANK, "gpu", "uuid", "mig_uuid", "via"),
    source="SDK report devices / nvmlDeviceGetComputeRunningProcesses",
)
LAST_REPORT = metric(
    "gpumon_training_last_report_timestamp_seconds",
    "gauge",
    "Unix time of the rank's latest report.",
    RANK,
    "seconds",
    "SDK report",
    detail="rank-detail",
)
LAST_PROGRESS = metric(
    "gpumon_training_last_progress_timestamp_seconds",
    "gauge",
    "Unix time of the rank's latest step (or request): a rank that reports but makes no progress is stuck.",
    RANK,
    "seconds",
    "SDK step() / request()",
)
RESTARTS = metric(
    "gpumon_training_restarts_total",
    "counter",
    "Times the rank came back as a new process (a new SDK incarnation); counters continue across restarts. "
    "A process that follows one on another node (the SDK's state directory) counts too. Absent until the "
    "first restart, then 0 for two renders.",
    RANK,
    source="SDK report incarnation",
)
STEPS = metric("gpumon_training_steps_total", "counter", "Optimizer steps.", RANK, source="SDK step()")
TOKENS = metric(
    "gpumon_training_tokens_total",
    "counter",
    "Tokens processed (training) or generated (inference).",
    RANK,
    source="SDK step(tokens=) / request(tokens=)",
)
SAMPLES_TOTAL = metric(
    "gpumon_training_samples_total", "counter", "Samples (sequences) processed.", RANK, source="SDK step()"
)
REQUESTS = metric(
    "gpumon_training_requests_total", "counter", "Inference requests served.", RANK, source="SDK request()"
)
STEP_DURATION = metric(
    "gpumon_training_step_duration_seconds",
    "summary",
    "Time between consecutive optimizer steps (the first step of a process only starts the clock, so the "
    "count is steps less one per process start): its sum and count, what the straggler rules read; a "
    "histogram with buckets under --collect rank-step-buckets (per job: "
    "gpumon_training_job_step_duration_seconds).",
    RANK,
    "seconds",
    "SDK step()",
)
REQUEST_DURATION = metric(
    "gpumon_training_request_duration_seconds",
    "histogram",
    "Inference request latency as the server measured it.",
    RANK,
    "seconds",
    "SDK request(latency=)",
)
PHASE_SECONDS = metric(
    "gpumon_training_phase_seconds_total",
    "counter",
    "Host wall time spent in each phase of the step (data_wait, forward_backward, communication, "
    "optimizer, checkpoint, or a custom name). A rank exports at most 32 names over all its processes; "
    "the seconds of any later name count under the phase _other, so no series ever goes back.",
    (*RANK, "phase"),
    "seconds",
    "SDK phase()",
)

section("Training and inference jobs: derived by the daemon per rank (opt-in: rank-rates)")
TOKENS_RATE = metric(
    "gpumon_training_tokens_per_second",
    "gauge",
    "Tokens per second over the sliding window (--rate-window); 0 when no step landed in it.",
    RANK,
    source="window over reported totals",
    detail="rank-rates",
)
SAMPLES_RATE = metric(
    "gpumon_training_samples_per_second",
    "gauge",
    "Samples per second over the sliding window.",
    RANK,
    source="window over reported totals",
    detail="rank-rates",
)
STEP_TIME = metric(
    "gpumon_training_step_time_seconds",
    "gauge",
    "Mean time between steps over the sliding window.",
    RANK,
    "seconds",
    "window over the step histogram",
    detail="rank-rates",
)
PHASE_RATIO = metric(
    "gpumon_training_phase_ratio",
    "gauge",
    "Share of wall time spent in the phase over the sliding window (data-wait share, communication share).",
    (*RANK, "phase"),
    "ratio",
    "window over phase seconds",
    detail="rank-rates",
)
FLOPS = metric(
    "gpumon_training_flops_per_second",
    "gauge",
    "Achieved model FLOP/s: tokens per second times the reported FLOPs per token.",
    RANK,
    source="tokens/s x flops_per_token",
    detail="rank-rates",
)
PEAK_FLOPS = metric(
    "gpumon_training_peak_flops_per_second",
    "gauge",
    "Dense peak FLOP/s of the rank's GPUs for its dtype, the denominator of MFU; absent for GPUs not in the "
    "peak table (set --peak-tflops).",
    RANK,
    source="peak table by GPU name and dtype, or override",
    detail="rank-rates",
)
MFU = metric(
    "gpumon_training_mfu_ratio",
    "gauge",
    "Model FLOPs utilisation: achieved FLOP/s over the GPUs' dense peak.",
    RANK,
    "ratio",
    "flops / peak",
    detail="rank-rates",
)
TOKENS_PER_JOULE = metric(
    "gpumon_training_tokens_per_joule",
    "gauge",
    "Tokens per joule of the rank's GPUs' energy over the sliding window (a GPU shared by several ranks "
    "is split evenly among them).",
    RANK,
    source="tokens/s over nvmlDeviceGetTotalEnergyConsumption rate",
    detail="rank-rates",
)
BOTTLENECK = metric(
    "gpumon_training_bottleneck",
    "gauge",
    "The rank's diagnosed bottleneck, one-hot (1 for the verdict, 0 for the others); evidence in "
    "GET /v1/jobs/{job} and `gpumon diagnose`.",
    (*RANK, "bottleneck"),
    source="diagnosis",
    detail="rank-rates",
)
STRAGGLER = metric(
    "gpumon_training_straggler_score",
    "gauge",
    "How much slower the rank is than the median of its job's ranks on this node, 0 (at or faster than "
    "the median) to 1: 1 - median/own of the busy time per step (step time less communication and "
    "data wait, where reported), else of the time per token.",
    RANK,
    source="diagnosis",
    detail="rank-rates",
)

section("Training jobs: the goodput ledger, derived by the daemon")
GOODPUT = metric(
    "gpumon_training_goodput_seconds_total",
    "counter",
    "Wall-clock seconds of the rank that became kept training progress: steps that completed and were not "
    "redone, less their excess over the job's baseline step time. With the badput causes it adds up to the "
    "rank's wall-clock since its first process started, across restarts; docs/training.md says which cause "
    "wins when two apply.",
    RANK,
    "seconds",
    "SDK steps, phases, process start and resumed step",
)
BADPUT = metric(
    "gpumon_training_badput_seconds_total",
    "counter",
    "Wall-clock seconds of the rank that did not become training progress, by cause: startup (process "
    "start to first step), restart (a finished process's final report, or a killed one's last step, to its "
    "successor's first step, on another node too where the SDK has a state directory), checkpoint, "
    "evaluation, data_wait, stall (no step, beyond those phases, for 4 recent mean step times, at least "
    "10 s), lost_progress (steps redone after resuming from an older checkpoint), slow_steps (excess over "
    "the baseline step time). A cause is absent until the rank's first second of it, then 0 for two "
    "renders (sum them with `or vector(0)` where a rule needs a number).",
    (*RANK, "cause"),
    "seconds",
    "SDK steps, phases, process start and resumed step",
)
STEPS_REDONE = metric(
    "gpumon_training_steps_redone_total",
    "counter",
    "Steps the rank computed again after resuming from a checkpoint older than its high-water step; absent "
    "until the first, then 0 for two renders.",
    RANK,
    source="SDK resumed_step",
)

section("Training and inference jobs: the allocator's view of memory (PyTorch ranks on CUDA)")
ALLOCATOR_ALLOCATED = metric(
    "gpumon_training_allocator_allocated_bytes",
    "gauge",
    "Bytes in tensors the rank's caching allocator has handed out (torch.cuda.memory_allocated).",
    RANK,
    "bytes",
    "torch.cuda.memory_stats() allocated_bytes.all.current",
)
ALLOCATOR_ALLOCATED_PEAK = metric(
    "gpumon_training_allocator_allocated_peak_bytes",
    "gauge",
    "Peak of allocated bytes since the process started or last reset its peaks "
    "(torch.cuda.max_memory_allocated).",
    RANK,
    "bytes",
    "torch.cuda.memory_stats() allocated_bytes.all.peak",
    detail="rank-detail",
)
ALLOCATOR_RESERVED = metric(
    "gpumon_training_allocator_reserved_bytes",
    "gauge",
    "Bytes the caching allocator holds from the driver, used or cached (torch.cuda.memory_reserved); NVML's "
    "per-process figure adds the CUDA context and libraries to it.",
    RANK,
    "bytes",
    "torch.cuda.memory_stats() reserved_bytes.all.current",
)
ALLOCATOR_RESERVED_PEAK = metric(
    "gpumon_training_allocator_reserved_peak_bytes",
    "gauge",
    "Peak of reserved bytes (torch.cuda.max_memory_reserved).",
    RANK,
    "bytes",
    "torch.cuda.memory_stats() reserved_bytes.all.peak",
    detail="rank-detail",
)
ALLOCATOR_FRAGMENTATION = metric(
    "gpumon_training_allocator_fragmentation_ratio",
    "gauge",
    "Share of reserved memory not holding tensors: 1 - allocated/reserved. High with retries means the "
    "cache is fragmented (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).",
    RANK,
    "ratio",
    "allocated / reserved",
    detail="rank-detail",
)
ALLOCATOR_RETRIES = metric(
    "gpumon_training_allocator_retries_total",
    "counter",
    "Allocations that failed, made the allocator free its cache and synchronise, then succeeded; each costs "
    "milliseconds. Across restarts; absent until the first, then 0 for two renders.",
    RANK,
    source="torch.cuda.memory_stats() num_alloc_retries",
)
ALLOCATOR_OOMS = metric(
    "gpumon_training_allocator_ooms_total",
    "counter",
    "CUDA out-of-memory errors the allocator raised, across restarts; absent until the first, then 0 for "
    "two renders.",
    RANK,
    source="torch.cuda.memory_stats() num_ooms",
)

section("Training and inference jobs: per job on this node")
JOB_RANKS = metric(
    "gpumon_training_job_ranks",
    "gauge",
    "Ranks of the job reporting to this node; ranks lists them as runs (8-15, or 0-3,6), so an alert "
    "can name a node's share of a job.",
    (*JOB, "ranks"),
    source="SDK",
)
JOB_TOKENS_RATE = metric(
    "gpumon_training_job_tokens_per_second",
    "gauge",
    "Tokens per second of the job's ranks on this node (sum; sum across nodes in PromQL).",
    JOB,
    source="sum of ranks",
)
JOB_MFU = metric(
    "gpumon_training_job_mfu_ratio",
    "gauge",
    "MFU of the job's ranks on this node: their achieved FLOP/s over their GPUs' summed peak.",
    JOB,
    "ratio",
    "sum flops / sum peak",
)
JOB_FLOPS = metric(
    "gpumon_training_job_flops_per_second",
    "gauge",
    "Achieved model FLOP/s of the job's running ranks on this node that report their FLOPs per token and "
    "have a known peak (sum), so that it matches the peak below.",
    JOB,
    source="sum of ranks' tokens/s x flops_per_token",
)
JOB_PEAK_FLOPS = metric(
    "gpumon_training_job_peak_flops_per_second",
    "gauge",
    "Dense peak FLOP/s of the GPUs of the same ranks: the job's MFU across nodes is the sum of the FLOP/s "
    "over the sum of these.",
    JOB,
    source="peak table by GPU name and dtype, or override",
)
JOB_STEP_DURATION = metric(
    "gpumon_training_job_step_duration_seconds",
    "histogram",
    "Time between consecutive optimizer steps of the job's training ranks on this node, every rank's steps "
    "in one histogram (the heatmap and quantiles of a job's step time). It keeps what ranks that left "
    "the node counted, so it never goes back while the job is listed.",
    JOB,
    "seconds",
    "sum of the ranks' step histograms",
)
JOB_BOTTLENECK = metric(
    "gpumon_training_job_bottleneck",
    "gauge",
    "The job's diagnosed bottleneck on this node: 1 with the verdict's bottleneck label, and no series for "
    "the others (a change of verdict ends the old series).",
    (*JOB, "bottleneck"),
    source="diagnosis",
)

RANKS_LOST = metric(
    "gpumon_training_ranks_lost_total",
    "counter",
    "Ranks of the job that stopped reporting without a final report (a crash, an OOM kill, a hang, a lost "
    "node) and were dropped after --rank-ttl. 0 from the job's first report, so increase() sees the first "
    "loss; kept for an hour after the job's last rank is gone.",
    JOB,
    source="job store expiry",
)

section("NCCL's own measure of the collectives: its Inspector's dumps (--nccl-inspector-dir)")
NCCL_OPERATIONS = metric(
    "gpumon_training_nccl_operations_total",
    "counter",
    "Collectives and point-to-point operations of the job's ranks on this node that NCCL's Inspector "
    "recorded with a bus bandwidth and gpumon read, by NCCL's name for the operation (AllReduce, "
    "AllGather, ReduceScatter, Send, ...; past 12 names per process, _other). A sample where the plugin "
    "drops operations (NCCL 2.28 and older write one per dump) or gpumon skips a backlog: rate the "
    "bandwidth, not the count. Only with --nccl-inspector-dir and an SDK that reports its hostname.",
    (*JOB, "operation"),
    source="NCCL Inspector coll_perf / p2p_perf",
)
NCCL_SECONDS = metric(
    "gpumon_training_nccl_seconds_total",
    "counter",
    "Execution time of those operations (overlapping communicators count each).",
    (*JOB, "operation"),
    "seconds",
    "NCCL Inspector coll_exec_time_us / p2p_exec_time_us",
)
NCCL_BUS_BYTES = metric(
    "gpumon_training_nccl_bus_bytes_total",
    "counter",
    "NCCL's bus bandwidth times the execution time of those operations: rate() of this over rate() of "
    "gpumon_training_nccl_seconds_total is NCCL's bus bandwidth, the figure nccl-tests compares with a "
    "fabric's expected bandwidth.",
    (*JOB, "operation"),
    "bytes",
    "NCCL Inspector coll_busbw_gbs / p2p_busbw_gbs",
)
NCCL_RECORDS = metric(
    "gpumon_training_nccl_records_total",
    "counter",
    "Inspector records read, by outcome: counted, duplicate (a sequence number read already), unmeasured "
    "(no bus bandwidth), stats (the plugin's own dump_stats), invalid (not an output format v4 record), "
    "foreign (a process other than its file's name).",
    ("outcome",),
    source="--nccl-inspector-dir",
)
NCCL_SKIPPED = metric(
    "gpumon_training_nccl_skipped_bytes_total",
    "counter",
    "Bytes of the dumps left unread: a file that gained more than 8 MiB between two reads, what a read "
    "met past the 4 MiB it parses (each line counts 256 bytes at least), and lines over 64 KiB.",
    (),
    "bytes",
    "--nccl-inspector-dir",
)
NCCL_FILES = metric(
    "gpumon_training_nccl_files",
    "gauge",
    "Inspector dump files (<hostname>-pid<pid>.log) of the processes ranks report to this daemon: read "
    "(the 1,024 most recently written), and unread (beyond them, or beyond 65,536 dump files listed).",
    ("state",),
    source="--nccl-inspector-dir",
)

section("Ingest")
INGEST_REPORTS = metric(
    "gpumon_ingest_reports_total",
    "counter",
    "Reports received, by outcome (accepted, duplicate, or the reason for refusing: invalid, "
    "unauthorized, forbidden, too_large, timeout: a body slower than 5 s, job_limit, rank_limit, "
    "conflict: a second live process "
    "reporting as the same job and rank).",
    ("outcome",),
    source="POST /v1/report",
)
INGEST_EXPIRED = metric(
    "gpumon_ingest_expired_ranks_total",
    "counter",
    "Ranks dropped after not reporting for --rank-ttl (or after their final report).",
    (),
    source="job store",
)
