"""The bottleneck flow of REFERENCE.md made operational: signals in, one verdict out, with its evidence.

Order matters and is the flow's: a job that makes no progress is idle or stalled whatever else is true;
a job waiting on input or on its peers is not limited by its GPUs' arithmetic; throttling and memory
capacity are checked before the GPU's own activity says whether memory bandwidth or compute is the limit.
Every signal is reported with its value and threshold, met or not, so a verdict can be checked by hand.
Missing signals (no phases reported, no profiling counters) are said to be missing, never treated as 0.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

BOTTLENECKS = (
    "gpu_down",
    "idle",
    "stalled",
    "input",
    "communication",
    "throttled",
    "memory_capacity",
    "memory_bandwidth",
    "compute",
    "undetermined",
)


@dataclass(frozen=True)
class Thresholds:
    """Documented in docs/training.md; each can be set with --threshold NAME=VALUE (or the config file)."""

    idle_utilization: float = 0.05  # GPU busier than this while no step lands: stalled, not idle
    low_utilization: float = 0.70  # seed 002: below this the GPU waits on input or communication
    data_wait_share: float = 0.15  # share of wall time in data_wait that makes a job input-bound
    communication_share: float = 0.30  # share of wall time in communication that makes it network-bound
    link_busy: float = 0.70  # NVLink or PCIe use, of its peak, that counts as saturated
    sm_idle: float = 0.50  # SM activity below this while links are saturated: waiting on the network
    throttled_share: float = 0.25  # share of samples with a thermal or hardware clock reason
    memory_pressure: float = 0.90  # HBM used, of total (seed 003: > 80 % may become, > 90 % is one)
    dram_busy: float = 0.60  # DRAM activity that makes a kernel mix bandwidth-bound ...
    tensor_low: float = 0.30  # ... when tensor cores are this idle
    tensor_busy: float = 0.40  # tensor activity that makes a job compute-bound
    sm_busy: float = 0.80  # SM activity that makes a job compute-bound without tensor data
    utilization_busy: float = 0.90  # without profiling counters, GPU utilisation that suggests compute


def parse_thresholds(items: Sequence[str] | dict[str, Any]) -> Thresholds:
    """``["data_wait_share=0.2", ...]`` or a TOML table → Thresholds; ValueError says what to fix."""
    known = {f.name for f in fields(Thresholds)}
    pairs: dict[str, Any] = {}
    if isinstance(items, dict):
        pairs = dict(items)
    else:
        for item in items:
            for part in str(item).split(","):
                if not part.strip():
                    continue
                name, sep, value = part.partition("=")
                if not sep:
                    raise ValueError(
                        f"threshold {part!r}: expected NAME=VALUE (names: {', '.join(sorted(known))})"
                    )
                pairs[name.strip()] = value.strip()
    values: dict[str, float] = {}
    for name, value in pairs.items():
        if name not in known:
            raise ValueError(f"unknown threshold {name!r} (known: {', '.join(sorted(known))})")
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"threshold {name}: expected a number between 0 and 1, got {value!r}") from None
        if not 0 <= x <= 1:
            raise ValueError(f"threshold {name}: expected a number between 0 and 1, got {value!r}")
        values[name] = x
    return Thresholds(**values)


@dataclass(frozen=True, slots=True)
class Signals:
    """What the diagnosis looks at, for one rank or a whole job on this node. None: not measured."""

    progressing: bool | None  # a step landed recently (None: nothing reported yet)
    gpu_down: str | None = None  # a GPU of the rank that NVML lost, and why
    utilization: float | None = None
    data_wait_share: float | None = None
    communication_share: float | None = None
    nvlink_utilization: float | None = None
    pcie_utilization: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    throttled_share: float | None = None
    memory_used_ratio: float | None = None
    mfu: float | None = None
    alloc_retries: float | None = None  # the caching allocator's retries in the window (PyTorch ranks)
    ooms: float | None = None  # and its out-of-memory errors
    # every rank sent its final report: no step since is the end of the run, not a stall
    finished: bool = False


@dataclass(frozen=True, slots=True)
class Evidence:
    signal: str
    value: float | None
    threshold: float | None
    op: str  # ">=" or "<"
    met: bool | None  # None: the signal is not measured
    unit: str = "ratio"  # or "count"

    def json(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "value": self.value,
            "threshold": self.threshold,
            "op": self.op,
            "met": self.met,
            "unit": self.unit,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    bottleneck: str
    summary: str
    advice: str
    evidence: tuple[Evidence, ...]
    findings: tuple[str, ...]  # other conditions that hold (e.g. memory pressure under a compute verdict)

    def json(self) -> dict[str, Any]:
        return {
            "bottleneck": self.bottleneck,
            "summary": self.summary,
            "advice": self.advice,
            "findings": list(self.findings),
            "evidence": [e.json() for e in self.evidence],
        }


def _check(signal: str, value: float | None, threshold: float, op: str, unit: str = "ratio") -> Evidence:
    met = None if value is None else (value >= threshold if op == ">=" else value < threshold)
    return Evidence(signal, value, threshold, op, met, unit)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


ADVICE = {
    "gpu_down": "A GPU this rank runs on stopped answering NVML (lost, fallen off the bus, or a hung "
    "driver call): its numbers are gone and the job will fail or hang on it. Check the XID errors "
    "(gpumon_gpu_xid_errors_total, docs/xid.md) and dmesg; drain the node if it does not come back.",
    "idle": "Nothing is running on the GPU and no step completed: the job is between phases, finished, or "
    "waiting on something outside the GPU (a checkpoint upload, a scheduler).",
    "stalled": "The GPU is busy but no step completed in the window: look for a hung collective (NCCL "
    "timeout, a rank that died), a deadlock, or a step far longer than the window.",
    "input": "The loop waits on data while the GPU idles: raise DataLoader num_workers, pin_memory, "
    "prefetch_factor; move decoding/augmentation off the critical path; check storage throughput and CPU.",
    "communication": "Time goes to collectives: overlap communication with compute (bucket sizes, "
    "gradient accumulation), check the interconnect (NVLink/InfiniBand health, NCCL topology), reduce "
    "data-parallel traffic (ZeRO stage, gradient compression), or scale up before scaling out.",
    "throttled": "Clocks are held down by thermal limits or a hardware slowdown: check cooling and inlet "
    "temperatures, the power supply and brake signals (nvidia-smi -q -d PERFORMANCE), and dmesg for XIDs.",
    "memory_capacity": "HBM is nearly full, or the caching allocator had to flush its cache (retries) or "
    "failed (OOMs): each retry synchronises the device and costs milliseconds, and an OOM is close. Set "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation; use activation checkpointing, "
    "a smaller micro-batch with accumulation, or a higher ZeRO stage (the rank's memory section compares the "
    "allocator with the estimate and names a stage that fits).",
    "memory_bandwidth": "DRAM is busy while tensor cores idle: kernels are bandwidth-bound. Fuse "
    "elementwise ops (torch.compile), use FlashAttention, lower precision (bf16/fp8), larger batches.",
    "compute": "The GPU's arithmetic units are the limit, which is where a training job should be. Gains "
    "now come from kernel efficiency and precision (fp8, fused kernels) and from MFU; compare MFU with the "
    "baseline.",
    "undetermined": "No signal crosses its threshold. Report phases (data_wait, communication) from the "
    "training loop and enable profiling counters (GPM on Hopper, or DCGM) so gpumon can tell.",
}


def _link(s: Signals) -> float | None:
    return max((x for x in (s.nvlink_utilization, s.pcie_utilization) if x is not None), default=None)


def diagnose(s: Signals, t: Thresholds) -> Verdict:
    link = _link(s)
    activity = s.sm_active if s.sm_active is not None else s.utilization
    ev = {
        "utilization_idle": _check("gpu_utilization", s.utilization, t.idle_utilization, "<"),
        "utilization_low": _check("gpu_utilization", s.utilization, t.low_utilization, "<"),
        "data_wait": _check("data_wait_share", s.data_wait_share, t.data_wait_share, ">="),
        "communication": _check("communication_share", s.communication_share, t.communication_share, ">="),
        "link": _check("link_utilization", link, t.link_busy, ">="),
        "sm_idle": _check(
            "sm_active" if s.sm_active is not None else "gpu_utilization", activity, t.sm_idle, "<"
        ),
        "throttled": _check("throttled_share", s.throttled_share, t.throttled_share, ">="),
        "memory": _check("memory_used_ratio", s.memory_used_ratio, t.memory_pressure, ">="),
        # one retry is a cache flush and a device synchronisation; one OOM is a failed step or a crash
        "retries": _check("alloc_retries", s.alloc_retries, 1, ">=", "count"),
        "ooms": _check("ooms", s.ooms, 1, ">=", "count"),
        "dram": _check("dram_active", s.dram_active, t.dram_busy, ">="),
        "tensor_low": _check("tensor_active", s.tensor_active, t.tensor_low, "<"),
        "tensor_busy": _check("tensor_active", s.tensor_active, t.tensor_busy, ">="),
        "sm_busy": _check("sm_active", s.sm_active, t.sm_busy, ">="),
        "util_busy": _check("gpu_utilization", s.utilization, t.utilization_busy, ">="),
    }
    compute = bool(ev["tensor_busy"].met or ev["sm_busy"].met) or (
        s.tensor_active is None and s.sm_active is None and bool(ev["util_busy"].met)
    )
    conditions = [
        (
            "input",
            bool(ev["data_wait"].met) and ev["utilization_low"].met is not False,
            ("data_wait", "utilization_low"),
        ),
        (
            "communication",
            bool(ev["communication"].met) or (bool(ev["link"].met) and bool(ev["sm_idle"].met)),
            ("communication", "link", "sm_idle"),
        ),
        ("throttled", bool(ev["throttled"].met), ("throttled",)),
        ("memory_capacity", _memory_trouble(ev) and not compute, ("memory", "retries", "ooms")),
        ("memory_bandwidth", bool(ev["dram"].met) and bool(ev["tensor_low"].met), ("dram", "tensor_low")),
        ("compute", compute, ("tensor_busy", "sm_busy", "util_busy")),
    ]
    used: tuple[str, ...]
    if s.gpu_down is not None:
        verdict, used = "gpu_down", ()
    elif (s.progressing is False or s.progressing is None) and not s.finished:
        verdict = "stalled" if ev["utilization_idle"].met is False else "idle"
        used = ("utilization_idle",)
    else:
        verdict, used = next(((name, keys) for name, ok, keys in conditions if ok), ("undetermined", ()))
    findings = tuple(name for name, ok, _ in conditions if ok and name != verdict)
    if _memory_trouble(ev) and "memory_capacity" not in findings and verdict != "memory_capacity":
        findings += ("memory_capacity",)
    if s.mfu is not None and s.mfu > 1.0:  # not a bottleneck: the reported FLOPs per token or dtype is wrong
        findings += ("mfu_above_peak",)
    evidence = tuple(dict.fromkeys(ev[k] for k in (*used, *ev)))
    return Verdict(verdict, _summary(verdict, s), ADVICE[verdict], evidence, findings)


def _memory_trouble(ev: dict[str, Evidence]) -> bool:
    """HBM nearly full, or the allocator retrying or running out: a memory finding either way."""
    return bool(ev["memory"].met or ev["retries"].met or ev["ooms"].met)


def _allocator_note(s: Signals) -> str:
    if s.alloc_retries is None:
        return ""
    return f"; {s.alloc_retries:.0f} allocation retries and {s.ooms or 0:.0f} OOMs in the window"


# one line per verdict, formatted only for the verdict reached (every rank, every scrape)
_SUMMARIES: dict[str, Callable[[Signals], str]] = {
    "gpu_down": lambda s: f"a GPU is down ({s.gpu_down})",
    "idle": lambda s: f"no recent step and the GPU is idle (utilisation {_pct(s.utilization)})",
    "stalled": lambda s: f"no recent step while the GPU is busy (utilisation {_pct(s.utilization)})",
    "input": lambda s: (
        f"input-bound: {_pct(s.data_wait_share)} of wall time waiting for data, GPU "
        f"utilisation {_pct(s.utilization)}"
    ),
    "communication": lambda s: (
        f"communication-bound: {_pct(s.communication_share)} of wall time in "
        f"communication, link use {_pct(_link(s))}"
    ),
    "throttled": lambda s: (
        f"throttled: thermal or hardware clock limits active in {_pct(s.throttled_share)} of samples"
    ),
    "memory_capacity": lambda s: (
        f"memory capacity: {_pct(s.memory_used_ratio)} of HBM in use{_allocator_note(s)}"
    ),
    "memory_bandwidth": lambda s: (
        f"memory-bandwidth-bound: DRAM active {_pct(s.dram_active)}, tensor cores {_pct(s.tensor_active)}"
    ),
    "compute": lambda s: (
        f"compute-bound: tensor cores {_pct(s.tensor_active)}, SMs {_pct(s.sm_active)}, "
        f"utilisation {_pct(s.utilization)}, MFU {_pct(s.mfu)}"
    ),
    "undetermined": lambda s: (
        "no bottleneck signal crosses its threshold (utilisation "
        f"{_pct(s.utilization)}, data wait {_pct(s.data_wait_share)}, communication "
        f"{_pct(s.communication_share)})"
    ),
}


def _summary(verdict: str, s: Signals) -> str:
    return _SUMMARIES[verdict](s)


def straggler_scores(costs: Sequence[float | None]) -> list[float | None]:
    """1 - median/own for each rank's cost (busy seconds per step, or seconds per token); 0 at or below
    the median, toward 1 as a rank falls behind. Fewer than two measured ranks: no straggler to speak of."""
    known = [c for c in costs if c is not None and c > 0]
    if len(known) < 2:
        return [0.0 if c is not None else None for c in costs]
    median = statistics.median(known)
    return [None if c is None else (0.0 if c <= 0 else max(0.0, 1.0 - median / c)) for c in costs]
