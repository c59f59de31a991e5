"""Simulated training jobs on simulated GPUs (``--sim-job``): their specs, their timing, and their progress.

This is the simulator's half of a simulated job, and lives with the simulator because the GPUs it runs on
must show it: utilisation, power and NVLink follow the job's data-wait, compute and all-reduce phases (a
``SimJob`` is the workload of its GPUs' dynamics, in place of the node's job sequence). The other half, the
ranks that report each step through the real SDK, is gpumon/gpu/sim/ranks.py beside it: it needs the SDK, the
peak table and a running daemon, none of which the simulated NVML (this module included) may depend on; only
``gpumon serve`` and its settings import ranks.py.

A spec is ``NAME:GPUS[:FIRST_RANK/WORLD_SIZE][:KEY=VALUE...]``: ``llama-70b:0-7:8/24`` is ranks 8..15 of a
24-rank job on GPUs 0-7 of this node; ``bert-ft:0-3`` is ranks 0..3 of a 4-rank job. GPUS is a list of
indices and ranges (``0-3,6``); rank FIRST_RANK + i runs on the i-th GPU listed. Options: ``model=PRESET``
(gpumon.client.model; default: the preset the name mentions, else llama3-8b), ``step=SECONDS``,
``data_wait=SHARE``, ``comm=SHARE``, ``mfu=RATIO`` to override what the name gives, and ``peer_wait=SHARE``:
the part of the communication share spent waiting for a slower peer on another node.

A job whose WORLD_SIZE exceeds its ranks here spans nodes: its all-reduce crosses the node's NICs
(gpumon/net/simulated.py) at full speed, except while it waits for a peer (``peer_wait``): its GPUs still
spin in the collective, its NICs idle.

Timing comes from the NAME alone, never the seed, the node or the clock, so every daemon simulating ranks
of ``llama-70b`` agrees on its step time and phase shares. The job has been stepping since simulated time 0
(after loading) and never stops; its progress is a pure function of the time and of the ``slowdown``
windows on its GPUs (a synchronous job steps at the pace of its slowest rank).

Memory, declared and held: the ranks declare their setup to the daemon as a DeepSpeed or FSDP job would
(bf16, AdamW, micro-batch 1, ZeRO stage 3 over the job's world size, full activation checkpointing, flash
attention), so the daemon's memory estimate has something to check; and the job's GPUs hold what that
estimate says, so the check agrees: the allocator's peak (ALLOCATED_SHARE of what NVML shows used, as
ranks.py's SimAllocator reads it) is the estimate. Where the gradients and optimizer states would not fit in
HBM even sharded over the world size (llama3-70b on six GPUs needs ~190 GiB each), the job declares the
optimizer step on the host (ZeRO-Offload), as a real job of that size must. Where even that does not fit,
the GPUs hold MAX_FILL of their memory and the daemon says that the declared setup and the memory disagree,
as it would of a real one.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpumon.client.model import PRESETS, preset
from gpumon.estimate.breakdown import Setup, estimate
from gpumon.gpu.sim.dynamics import ALLREDUCE, COMPUTE, DATA_WAIT, LOADING, Job

Windows = Callable[[], Sequence[tuple[float, float, float]]]  # (start, end, factor), simulated time

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}$")  # the SDK's job names, without ":" "/" "="
# ASCII digits (\d takes any script's), at most 9 of them
_GPUS = re.compile(r"^[0-9]{1,9}(?:-[0-9]{1,9})?(?:,[0-9]{1,9}(?:-[0-9]{1,9})?)*$")
_RANKS = re.compile(r"^([0-9]{1,9})/([0-9]{1,9})$")
# far above any node's GPUs, checked before a range is built: found by review, 0-999999999 was a MemoryError
MAX_GPU_INDEX = 1023
MAX_WORLD_SIZE = 1 << 20  # as the daemon accepts in a report
_SIZE = re.compile(r"(\d+)b(?![a-z0-9])")
DEFAULT_MODEL = "llama3-8b"
# when a name gives only a size ("llama-70b"), the newest preset of that size
_BY_SIZE = ("llama3-70b", "llama3-8b", "llama2-70b", "llama2-13b", "llama2-7b", "mistral-7b")
# option → (lowest, highest) accepted
_LIMITS = {
    "step": (0.1, 600.0),
    "data_wait": (0.0, 0.8),
    "comm": (0.0, 0.8),
    "mfu": (0.01, 1.0),
    "peer_wait": (0.0, 0.8),
}
EXAMPLE = "llama-70b:0-7:8/24"


# -- what a job declares about its setup, and the HBM its GPUs hold for it ----------------------------
DTYPE = "bf16"
CONVENTION = "palm"
MICRO_BATCH = 1
ZERO_STAGE = 3
CHECKPOINTING = "full"
ALLOCATED_SHARE = 0.85  # of NVML's used bytes: the CUDA context, NCCL and the allocator's cache are the rest
MAX_FILL = 0.97  # of the HBM processes can hold


@dataclass(frozen=True)
class Declared:
    offload: str  # "none", or "optimizer": the optimizer step on the host
    allocated_bytes: float  # the estimate per GPU: what the allocator holds at its peak
    fits: bool

    @property
    def setup(self) -> dict[str, Any]:
        """The Reporter's ``setup`` (beside micro_batch and zero_stage)."""
        return {"checkpointing": CHECKPOINTING, "flash_attention": True, "offload": self.offload}

    def used_bytes(self, hbm_bytes: float) -> float:
        """What NVML shows used on a GPU of the job with ``hbm_bytes`` for processes."""
        return min(MAX_FILL * hbm_bytes, self.allocated_bytes / ALLOCATED_SHARE)


def declared(model: str, world_size: int, hbm_bytes: float) -> Declared:
    """The setup a job of ``model`` over ``world_size`` ranks declares on GPUs of ``hbm_bytes`` (the smallest
    of its GPUs): the optimizer on the GPU where it fits, else on the host."""
    spec = preset(model)
    total = 0.0
    for offload in ("none", "optimizer"):
        setup = Setup(
            batch=MICRO_BATCH,
            dtype=DTYPE,
            checkpointing=CHECKPOINTING,
            flash_attention=True,
            zero=ZERO_STAGE,
            dp=world_size,
            offload=offload,
            convention=CONVENTION,
        )
        total = estimate(spec, setup).train_total_bytes
        if total / ALLOCATED_SHARE <= MAX_FILL * hbm_bytes:
            return Declared(offload, total, True)
    return Declared("optimizer", total, False)


class SimJobError(ValueError):
    """A --sim-job spec is wrong; the message says what to fix."""


@dataclass(frozen=True)
class Timing:
    """What the name decides. Shares are of each step; MFU is of the GPU's dense bf16 peak, over the step."""

    step_seconds: float  # 0.8-1.6 s
    data_wait: float  # 2-8 %: the input pipeline keeps up, mostly
    communication: float  # 8-22 %: the all-reduce that ends each step
    mfu: float  # 35-45 %
    load_seconds: float  # 15-35 s of loading before the first step (simulated time)
    number: int  # the job's number in the simulated process list
    peer_wait: float = 0.0  # of the communication share, the time spent waiting for a peer elsewhere

    @property
    def compute(self) -> float:
        return 1.0 - self.data_wait - self.communication


def _unit(name: str, k: int) -> float:
    # hashlib, not hash(): the latter is salted per process, and every daemon must agree
    digest = hashlib.blake2b(f"{k}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def timing(name: str) -> Timing:
    """The timing every node derives for job ``name``."""
    u = [_unit(name, k) for k in range(7)]
    return Timing(
        step_seconds=round(0.8 + 0.8 * u[0], 3),
        data_wait=round(0.02 + 0.06 * u[1], 4),
        communication=round(0.08 + 0.14 * u[2], 4),
        mfu=round(0.35 + 0.10 * u[3], 4),
        load_seconds=15.0 + 20.0 * u[4],
        number=100 + int(900 * u[6]),
    )


def default_model(name: str) -> str:
    """The model preset a job name mentions (``gpt2-ft`` → gpt2, ``llama-70b`` → llama3-70b), else
    llama3-8b."""
    lower = name.lower()
    for key in PRESETS:
        if key in lower:
            return key
    for size in _SIZE.findall(lower):
        for key in _BY_SIZE:
            if key.endswith(f"-{size}b"):
                return key
    return DEFAULT_MODEL


@dataclass(frozen=True)
class SimJobSpec:
    text: str
    name: str
    gpus: tuple[int, ...]
    first_rank: int
    world_size: int
    model: str
    timing: Timing

    def rank(self, gpu: int) -> int:
        return self.first_rank + self.gpus.index(gpu)

    @property
    def network(self) -> float:
        """The share of its all-reduce its GPUs' traffic crosses the NICs (dynamics.Job.network)."""
        t = self.timing
        if self.world_size <= len(self.gpus) or t.communication <= 0:
            return 0.0
        return (t.communication - t.peer_wait) / t.communication


def _indices(text: str, field: str) -> tuple[int, ...]:
    if not _GPUS.match(field):
        raise SimJobError(f"sim job {text!r}: GPUS {field!r} is not like 0-7 or 0,2,4-5")
    out: list[int] = []
    for part in field.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if last > MAX_GPU_INDEX:
            raise SimJobError(f"sim job {text!r}: GPU {last} does not exist (at most {MAX_GPU_INDEX})")
        if last < first:
            raise SimJobError(f"sim job {text!r}: GPU range {part!r} runs backwards")
        out.extend(range(first, last + 1))
    if len(set(out)) != len(out):
        raise SimJobError(f"sim job {text!r}: a GPU is listed twice in {field!r}")
    return tuple(out)


def _option(text: str, key: str, value: str) -> float:
    lo, hi = _LIMITS[key]
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not lo <= number <= hi:  # NaN fails too
        raise SimJobError(f"sim job {text!r}: {key} must be a number from {lo:g} to {hi:g}, got {value!r}")
    return number


def parse_job(text: str) -> SimJobSpec:
    """One ``NAME:GPUS[:FIRST_RANK/WORLD_SIZE][:KEY=VALUE...]``; SimJobError says what to fix."""
    usage = f"expected NAME:GPUS[:FIRST_RANK/WORLD_SIZE][:KEY=VALUE...], e.g. {EXAMPLE}"
    parts = text.strip().split(":")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise SimJobError(f"bad sim job {text!r}: {usage}")
    name = parts[0]
    if not _NAME.match(name):
        raise SimJobError(
            f"sim job {text!r}: NAME must be 1-64 letters, digits and _.@+- starting with a letter or digit"
        )
    gpus = _indices(text, parts[1])
    first, world = 0, len(gpus)
    rest = parts[2:]
    if rest and "=" not in rest[0]:
        m = _RANKS.match(rest.pop(0))
        if not m:
            raise SimJobError(f"bad sim job {text!r}: {usage}")
        first, world = int(m[1]), int(m[2])
        if world > MAX_WORLD_SIZE:
            raise SimJobError(f"sim job {text!r}: WORLD_SIZE {world} is over {MAX_WORLD_SIZE}")
        if first + len(gpus) > world:
            raise SimJobError(
                f"sim job {text!r}: ranks {first}..{first + len(gpus) - 1} (one per GPU) do not fit in a "
                f"world size of {world}: raise WORLD_SIZE or lower FIRST_RANK"
            )
    model, values = default_model(name), {}
    seen: set[str] = set()
    for item in rest:
        key, sep, value = item.partition("=")
        if sep and (key in values or (key == "model" and "model" in seen)):
            raise SimJobError(f"sim job {text!r}: {key} is given twice")
        seen.add(key)
        if key == "model" and sep:
            if value.lower() not in PRESETS:
                raise SimJobError(f"sim job {text!r}: unknown model {value!r}; one of {', '.join(PRESETS)}")
            model = value.lower()
        elif key in _LIMITS and sep:
            values[key] = _option(text, key, value)
        else:
            known = ", ".join(("model", *_LIMITS))
            raise SimJobError(f"sim job {text!r}: unknown option {item!r}; options: {known}")
    t = timing(name)
    t = replace(
        t,
        step_seconds=values.get("step", t.step_seconds),
        data_wait=values.get("data_wait", t.data_wait),
        communication=values.get("comm", t.communication),
        mfu=values.get("mfu", t.mfu),
        peer_wait=values.get("peer_wait", 0.0),
    )
    if t.peer_wait and world <= len(gpus):
        raise SimJobError(
            f"sim job {text!r}: peer_wait is a wait for ranks on other nodes, and all {world} ranks are "
            "here: give FIRST_RANK/WORLD_SIZE with more ranks than GPUs listed"
        )
    if t.peer_wait > t.communication:
        raise SimJobError(
            f"sim job {text!r}: peer_wait {t.peer_wait:g} is part of the communication share, which is "
            f"{t.communication:g}: raise comm or lower peer_wait"
        )
    if t.compute < 0.1:
        raise SimJobError(f"sim job {text!r}: data_wait and comm leave under 10 % of a step for compute")
    return SimJobSpec(text.strip(), name, gpus, first, world, model, t)


def parse_jobs(texts: Iterable[str], gpu_count: int) -> list[SimJobSpec]:
    """Every spec, checked against each other and against a node of ``gpu_count`` simulated GPUs."""
    jobs: list[SimJobSpec] = []
    owner: dict[int, str] = {}
    for text in texts:
        job = parse_job(text)
        if any(j.name == job.name for j in jobs):
            raise SimJobError(f"sim job {text!r}: {job.name} is given twice; one spec per job and node")
        for gpu in job.gpus:
            if gpu >= gpu_count:
                raise SimJobError(
                    f"sim job {text!r}: GPU {gpu} does not exist; the simulated node has {gpu_count} "
                    f"(0-{gpu_count - 1})"
                )
            if gpu in owner:
                raise SimJobError(f"sim job {text!r}: GPU {gpu} already runs sim job {owner[gpu]}")
            owner[gpu] = job.name
        jobs.append(job)
    return jobs


class SimJob:
    """One job's progress on this node. Also the workload of its GPUs' dynamics (dynamics.Workload).

    Progress is nominal stepping seconds: it grows at 1/FACTOR while a slowdown of FACTOR holds on any of the
    job's GPUs here (the largest, when several do), else at 1. Step k (from 1) ends when progress reaches
    k·step_seconds; each step is data wait, then compute, then the all-reduce.
    """

    def __init__(self, spec: SimJobSpec, hbm_bytes: float, windows: Windows | None = None) -> None:
        """``hbm_bytes``: what processes can hold on the smallest of the job's GPUs."""
        self.spec = spec
        self.timing = t = spec.timing
        self._windows = windows
        self.declared = declared(spec.model, spec.world_size, hbm_bytes)
        used = self.declared.used_bytes(hbm_bytes)
        self.job = Job(
            t.number, 0.0, math.inf, t.load_seconds, t.step_seconds, t.communication, used / hbm_bytes,
            fill_bytes=used, network=spec.network,
        )  # fmt: skip

    def _pieces(self) -> list[tuple[float, float, float]]:
        """(from, to, factor) covering [load end, ∞) with the factor constant on each piece."""
        begin = self.timing.load_seconds
        windows = [w for w in (self._windows() if self._windows else ()) if w[1] > begin]
        edges = sorted({begin, *(x for s, e, _ in windows for x in (s, e) if begin < x < math.inf)})
        return [
            (a, b, max((f for s, e, f in windows if s <= a < e), default=1.0))
            for a, b in zip(edges, [*edges[1:], math.inf], strict=True)
        ]

    def progress(self, t: float) -> float:
        return sum((min(b, t) - a) / f for a, b, f in self._pieces() if a < t)

    def time_at(self, work: float) -> float:
        """The simulated time at which progress reaches ``work``."""
        for a, b, f in self._pieces():
            span = (b - a) / f
            if work <= span:
                return a + work * f
            work -= span
        return math.inf  # pragma: no cover - the last piece is unbounded

    def steps_done(self, t: float) -> int:
        return max(0, math.floor(self.progress(t) / self.timing.step_seconds + 1e-9))

    def step_end(self, k: int) -> float:
        return self.time_at(k * self.timing.step_seconds)

    # -- dynamics.Workload -------------------------------------------------------------------------------
    def job_at(self, t: float) -> Job | None:
        return self.job

    def phase(self, t: float) -> tuple[str, Job | None]:
        if t < self.timing.load_seconds:
            return LOADING, self.job
        into = (self.progress(t) / self.timing.step_seconds) % 1.0
        if into < self.timing.data_wait:
            return DATA_WAIT, self.job
        if into >= 1.0 - self.timing.communication:
            return ALLREDUCE, self.job
        return COMPUTE, self.job
