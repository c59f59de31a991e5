"""The report a training (or inference) process sends to its node's gpumon daemon: wire format version 1.

Shared by the SDK (which writes it) and the daemon's ingest endpoint (which validates it), so the two cannot
drift. Standard library only: this module is imported inside training processes.

A report is one JSON object, POSTed to ``/v1/report`` (HTTP on loopback, or the daemon's unix socket):

``v``                 1
``job``               job name; 1-128 chars of ``[A-Za-z0-9_.:/@+=-]``, starting with a letter or digit
``rank``              global rank, 0 <= rank < world_size
``world_size``        number of ranks in the whole job (all nodes), >= 1
``local_rank``        rank on this node, or null
``kind``              "train" or "inference"
``workload``          model/config name for baselines, same charset as job, or null
``incarnation``       random id of this Reporter (this process): a restart is a new incarnation
``pid``               the reporting process's pid (to find its GPUs in NVML's process list)
``seq``               0, 1, 2, ... per incarnation; a report with a seq already seen is ignored
``time``              unix seconds when the report was built
``started``           unix seconds when the Reporter was created
``devices``           GPUs this rank uses: NVML UUIDs ("GPU-…", "MIG-…") or NVML indexes as decimal strings
``dtype``             one of DTYPES, or null
``flops_per_token``   model FLOPs per token (training: forward + backward), or null
``flops_convention``  one of CONVENTIONS, or null
``peak_flops``        a per-GPU peak FLOP/s the user asserts (overrides the daemon's table), or null
``totals``            cumulative {"steps", "tokens", "samples", "requests"} since the Reporter started
``updated``           unix seconds of the step()/request() call that last changed ``totals``, or null
``anchor``            the totals right after the first step()/request() call and its time:
                      {"time", "steps", "tokens", "samples", "requests"}, or null before that call
``step_seconds``      cumulative histogram of the time between consecutive step() calls (the first call
                      starts the clock and observes nothing): {"counts": [one per BUCKETS + 1 for +Inf],
                      "sum": seconds}; counts are per bucket (not cumulative across buckets)
``request_seconds``   the same for request latencies (inference), or null
``phases``            cumulative seconds per phase name: {"data_wait": 12.5, ...}; names from PHASES or
                      label-safe custom names (at most MAX_PHASES)
``final``             true on the last report of a Reporter (close() or interpreter exit)

Optional fields (absent or null from SDKs older than the goodput ledger; the daemon accepts reports without
them, and an SDK whose report a daemon refuses for an unknown field resends without them):

``process_started``   unix seconds when the OS started this process (Linux /proc), so start-up time before
                      the Reporter existed counts; <= ``started``, at most MAX_STARTUP before it; sent by
                      a process's first Reporter only
``resumed_step``      the global step this process resumed from (the checkpoint's step); its own steps
                      continue from there. Steps up to the rank's earlier high-water mark are redone work
``open_phases``       seconds spent so far in phases entered but not yet left: {"checkpoint": 41.2}, so a
                      long checkpoint or evaluation counts while it runs. Not cumulative; may go down
``memory``            the caching allocator of the rank's CUDA device (torch.cuda.memory_stats), or null:
                      {"device", one of MEMORY_FIELDS: non-negative integers}
``predecessor``       the rank's previous process as the SDK's state file recorded it (GPUMON_STATE_DIR), or
                      null: {"incarnation", "step": its high-water global step, "last_step": unix seconds of
                      its last step}. A daemon that never saw that process (it ran on another node) books the
                      gap since ``last_step`` as the restart's and the steps up to ``step`` as redone;
                      a daemon follows it only when ``last_step`` is before ``started`` (5 s of clock skew
                      allowed) and at most MAX_RESTART_GAP before it, as it keeps a gone rank's ledger
``setup``             what the memory estimator needs, or null: {"model": the shape as MODEL_FIELDS,
                      "micro_batch", "zero_stage", and optionally "optimizer", "checkpointing",
                      "offload", "flash_attention", "tp", "sequence_parallel"}
``hostname``          the process's host name as it sees it (gethostname(): the pod's name in a container),
                      matching HOSTNAME_PATTERN: with ``pid``, it names the process's NCCL Inspector dump
                      (``<hostname>-pid<pid>.log``), whatever pid namespace the daemon sees it from

All counters are cumulative for the incarnation, so a lost or late report loses nothing: the next one carries
the totals. The daemon answers 204 on success, 4xx with ``{"detail": reason}`` otherwise (400/422 malformed,
401/403 token or origin, 413 too large, 429 cardinality limit); the SDK logs a 4xx once and keeps counting.
"""

from __future__ import annotations

VERSION = 1
PATH = "/v1/report"
DEFAULT_URL = "http://127.0.0.1:9478"
# upper bounds of the step-time and request-latency buckets, seconds; one more bucket (+Inf) follows
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
PHASES = ("data_wait", "forward_backward", "communication", "optimizer", "checkpoint", "evaluation")
# the optional fields above: what a daemon older than them refuses as unknown
EXTENSIONS = ("process_started", "resumed_step", "open_phases", "memory", "setup", "predecessor", "hostname")
HOSTNAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$"
# report key -> torch.cuda.memory_stats() key; the last two are counters, the rest bytes
MEMORY_FIELDS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "allocated_peak_bytes": "allocated_bytes.all.peak",
    "reserved_bytes": "reserved_bytes.all.current",
    "reserved_peak_bytes": "reserved_bytes.all.peak",
    "active_bytes": "active_bytes.all.current",
    "active_peak_bytes": "active_bytes.all.peak",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "alloc_retries": "num_alloc_retries",
    "ooms": "num_ooms",
}
# gpumon.client.model.ModelSpec's fields, as a report's setup.model carries them
MODEL_FIELDS = (
    "layers", "hidden", "heads", "vocab", "seq_len", "kv_heads", "head_dim", "ffn_hidden", "gated_mlp",
    "tied_embeddings", "biases", "learned_positions", "name",
)  # fmt: skip
SETUP_FLAGS = ("flash_attention", "sequence_parallel")  # true or false in a report's setup
SETUP_CHOICES = {
    "optimizer": ("adamw", "adam", "sgd", "none"),
    "checkpointing": ("none", "selective", "full"),
    "offload": ("none", "optimizer"),
}
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
CONVENTIONS = ("palm", "megatron", "user")
KINDS = ("train", "inference")
TOTALS = ("steps", "tokens", "samples", "requests")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/@+=-]{0,127}$"
PHASE_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
MAX_PHASES = 16
MAX_DEVICES = 16
MAX_BODY_BYTES = 64 * 1024
# Bounds both sides enforce, so that a value the SDK accepts can never make the daemon refuse every later
# report of the rank: one call adds at most MAX_PER_CALL to a count and MAX_PER_CALL_SECONDS to a time; totals
# stay below MAX_COUNT (exact in a float64) and MAX_SECONDS
MAX_PER_CALL = 1e12
MAX_PER_CALL_SECONDS = 1e6
MAX_COUNT = 2.0**53
MAX_SECONDS = 10.0 * 365 * 86400
MAX_STARTUP = 30.0 * 86400  # process_started at most this long before the Reporter
MAX_RESTART_GAP = 3600.0  # a predecessor's last step at most this long before its successor's Reporter
MAX_DIMENSION = 1 << 24  # a model's layers, width, heads, vocabulary or sequence length, a micro-batch
MAX_TP = 1 << 16
MAX_BYTES = 1 << 62  # an allocator figure
MIN_PEAK_FLOPS = 1e9  # a per-GPU peak below 1 GFLOP/s is a unit mistake (TFLOP/s given as FLOP/s)
MAX_FLOPS = 1e18
UUID_PATTERN = r"^(?:GPU|MIG)-[A-Za-z0-9/-]{1,96}$"  # NVML's, and old drivers' MIG-GPU-<uuid>/<gi>/<ci>
DEVICE_PATTERN = r"^(?:[0-9]{1,4}|(?:GPU|MIG)-[A-Za-z0-9/-]{1,96})$"  # an NVML index or a UUID
