"""What a verdict is made of: the thresholds, the signals, the evidence and the verdict itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

BOTTLENECKS = (
    "gpu_down",
    "exited",
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

    # GPU busier than this while no step lands: stalled, not idle. Well above what a loop waiting for data
    # reads (a few %: its copies and small kernels), or noise around it would hold the verdict between the two
    idle_utilization: float = 0.10
    low_utilization: float = 0.70  # seed 002: below this the GPU waits on input or communication
    data_wait_share: float = 0.15  # share of wall time in data_wait that makes a job input-bound
    communication_share: float = 0.30  # share of wall time in communication that makes it network-bound
    link_busy: float = 0.70  # NVLink or PCIe use, of its peak, that counts as saturated
    # the line rate the NICs nearest a rank's GPUs carry while it communicates (their use over the window
    # divided by its communication share) that makes the network busy: a rank in collectives across nodes
    # with its NICs below this waits for a slower peer rather than for the network
    nic_busy: float = 0.50
    # the transport's retries a second (RoCE timeouts, out-of-sequence and sequence errors) on those NICs
    # over the window that make the network the limit: a lossy fabric, whatever the throughput
    nic_retransmit_rate: float = 1.0
    # congestion notifications they slowed down for, a second: the fabric is congested towards the peers
    nic_cnp_rate: float = 100.0
    sm_idle: float = 0.50  # SM activity below this while links are saturated: waiting on the network
    throttled_share: float = 0.25  # share of samples with a thermal or hardware clock reason
    memory_pressure: float = 0.90  # HBM used, of total (seed 003: > 80 % may become, > 90 % is one)
    dram_busy: float = 0.60  # DRAM activity that makes a kernel mix bandwidth-bound ...
    tensor_low: float = 0.30  # ... when tensor cores are this idle
    tensor_busy: float = 0.40  # tensor activity that makes a job compute-bound
    sm_busy: float = 0.80  # SM activity that makes a job compute-bound without tensor data
    utilization_busy: float = 0.90  # without profiling counters, GPU utilisation that suggests compute
    # how much slower than its unthrottled self (or its baseline) a job must run for throttling to be its
    # bottleneck: clocks held down while the job keeps its speed is a finding, not a verdict
    throttle_impact: float = 0.05
    # MFU above the tensor cores' activity by more than this factor: the declared FLOPs per token is wrong
    mfu_over_tensor: float = 0.10
    # the allocator's peak off the declared setup's memory estimate by more than this share of it (and by
    # more than 2 GiB): the setup declared is not the one running
    setup_gap: float = 0.35


RATES = frozenset(("nic_retransmit_rate", "nic_cnp_rate"))  # events a second; the others are ratios 0-1
MAX_RATE = 1e9


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
        hi = MAX_RATE if name in RATES else 1.0
        what = f"expected a number between 0 and {hi:g}"
        try:
            if isinstance(value, bool):  # TOML's true is no threshold, though float() takes it
                raise TypeError
            x = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"threshold {name}: {what}, got {value!r}") from None
        if not 0 <= x <= hi:
            raise ValueError(f"threshold {name}: {what}, got {value!r}")
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
    # the process is gone (killed or exited without a final report), and how we know
    exited: str | None = None
    utilization_now: float | None = None  # the GPU's last sweep or two, not the window's mean
    # other jobs or processes on the rank's GPUs: then the GPU activity above is this process's own (NVML
    # per-process use) or unknown, and shared_utilization is the whole GPU's
    shared_with: tuple[str, ...] = ()
    shared_utilization: float | None = None
    own_utilization: bool = False  # the utilisation is the process's own, from NVML per-process samples
    # the job's slowdown against its unthrottled recent speed or its baseline (0.1: 10 % slower); None: no
    # reference to compare with yet
    slowdown: float | None = None
    slowdown_against: str | None = None  # "baseline" or "recent"
    # the rates and the GPU window cover enough time to set one against the other (cross-checks wait for it)
    settled: bool = True
    # the devices the rank named, none of which is a GPU of this node (a typo, another node's index)
    unknown_devices: tuple[str, ...] = ()
    # the declared setup's memory estimate per GPU (training), the allocator's peak, and the GPU's HBM
    # the longest phase running now and for how long (the loop is inside it: a dead data loader, a hung
    # collective, a long evaluation)
    open_phase: tuple[str, float] | None = None
    setup_estimate_bytes: float | None = None
    allocated_peak_bytes: float | None = None
    hbm_bytes: float | None = None
    # ranks of the job on other nodes (its world size less its ranks here): time in collectives may be a
    # wait for one of them, which this node cannot see
    peers_elsewhere: int = 0
    # the RDMA NICs nearest the rank's GPUs (gpumon/net), over the window: the busiest port's busier
    # direction as a share of its line rate, the error counters' growth, and the ports not ACTIVE now
    nics: tuple[str, ...] = ()
    nic_utilization: float | None = None
    nic_errors: float | None = None
    nics_down: tuple[str, ...] = ()
    nic_retransmit_rate: float | None = None  # RoCE transport retries a second (hw_counters), all ports
    nic_cnp_rate: float | None = None  # congestion notifications handled a second
    # NCCL's own measure of the rank's collectives over the window (its Inspector plugin, gpumon/nccl): bus
    # bandwidth in bytes per second, weighted by time, and the operation that took the most time
    nccl_bus_bandwidth: float | None = None
    nccl_operation: str | None = None

    @property
    def current_utilization(self) -> float | None:
        """The GPU's utilisation now, else over the window (a GPU read once has no "now" of its own)."""
        return self.utilization_now if self.utilization_now is not None else self.utilization


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
    notes: tuple[str, ...] = ()  # one sentence per finding that needs more than its name

    def json(self) -> dict[str, Any]:
        return {
            "bottleneck": self.bottleneck,
            "summary": self.summary,
            "advice": self.advice,
            "findings": list(self.findings),
            "notes": list(self.notes),
            "evidence": [e.json() for e in self.evidence],
        }
