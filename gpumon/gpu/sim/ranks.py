"""The ranks of simulated training jobs (``--sim-job``): each one reports its steps through the real SDK.

The training flow's simulated source, as the GPU simulator is the GPU flow's: every rank is a real
``gpumon.client.Reporter`` (its own counters, sender thread, incarnation and keep-alive connection) posting
to this daemon's own ingest, so the reports, the validation, the store and the analysis are exactly what a
real training process meets. A Reporter per rank inside one process costs one idle sender thread each (at
most 64 simulated GPUs), cheaper than a process per rank and with nothing to reap if the daemon dies.

When to step is the simulator's business (gpumon/gpu/sim/jobs.py): one thread per job sleeps until the
job's next step ends on the simulated clock, then every rank adds that step's phase times and calls step().
Tokens per step are chosen so the rank's MFU on its simulated GPU is the job's (35-45 %, from its name):
tokens = MFU · peak bf16 FLOP/s · step time / model FLOPs per token. A slowed step carries the same tokens,
so tokens/s and MFU fall by the slowdown's factor while it lasts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from gpumon.client import Reporter
from gpumon.client.model import preset
from gpumon.gpu.sim import SimNvml
from gpumon.gpu.sim.catalog import SimModel
from gpumon.gpu.sim.jobs import (
    ALLOCATED_SHARE,
    CONVENTION,
    DTYPE,
    MICRO_BATCH,
    ZERO_STAGE,
    SimJob,
    SimJobSpec,
)
from gpumon.jobs import peaks

log = logging.getLogger("gpumon")

# MFU of the compute phase at most: below its tensor activity (dynamics: 0.62), as on a real GPU
MFU_PER_COMPUTE = 0.55
# longest sleep between looks at the clock: a slowdown removed from Python can bring a step's end forward
MAX_WAIT = 0.5


def flops_per_token(spec: SimJobSpec) -> int:
    return preset(spec.model).flops_per_token(train=True, convention=CONVENTION)


def tokens_per_step(spec: SimJobSpec, model: SimModel) -> int:
    """Tokens one rank on a ``model`` GPU processes per step, for the job's MFU. ValueError when the peak
    table has no bf16 figure for that GPU (there would be no MFU to aim for, nor to show)."""
    peak = peaks.peak_flops(model.nvml_name, DTYPE)
    if peak is None:
        raise ValueError(
            f"sim job {spec.text!r}: gpumon knows no {DTYPE} peak for {model.key} GPUs, so it cannot size "
            "the job's steps; put simulated jobs on another model"
        )
    t = spec.timing
    return max(1, round(step_mfu(spec) * peak * t.step_seconds / flops_per_token(spec)))


def step_mfu(spec: SimJobSpec) -> float:
    """The job's MFU over a whole step: its target, but never more than its compute phase can do. The tensor
    cores are active COMPUTE_TENSOR of the compute phase and idle in the others, and MFU cannot exceed what
    they did (the daemon calls that a wrong FLOPs figure): a job told to wait 45 % on data gets less."""
    t = spec.timing
    return min(t.mfu, MFU_PER_COMPUTE * max(0.0, 1.0 - t.data_wait - t.communication))


def check(specs: Sequence[SimJobSpec], models: Sequence[SimModel]) -> None:
    """What the configuration can check before anything starts: every rank's GPU has a known peak."""
    for spec in specs:
        for gpu in spec.gpus:
            tokens_per_step(spec, models[gpu])


class SimAllocator:
    """A PyTorch rank's caching allocator as its GPU's simulated memory implies it: reserved is 95 % of what
    NVML shows used (the rest is the CUDA context), allocated ALLOCATED_SHARE; peaks are the highest seen."""

    def __init__(self, sim: SimNvml, gpu: int) -> None:
        self.sim = sim
        self.gpu = gpu
        self.peaks = (0, 0)

    def read(self) -> dict[str, int]:
        used = self.sim.gpus[self.gpu].state.memory_used
        reserved, allocated = int(0.95 * used), int(ALLOCATED_SHARE * used)
        self.peaks = (max(self.peaks[0], allocated), max(self.peaks[1], reserved))
        return {
            "device": 0, "allocated_bytes": allocated, "allocated_peak_bytes": self.peaks[0],
            "reserved_bytes": reserved, "reserved_peak_bytes": self.peaks[1], "active_bytes": allocated,
            "active_peak_bytes": self.peaks[0], "inactive_split_bytes": int(0.02 * used), "alloc_retries": 0,
            "ooms": 0,
        }  # fmt: skip


@dataclass
class _Rank:
    reporter: Reporter
    tokens: int  # per step
    seq_len: int
    total: int = 0  # tokens so far, to count whole sequences as samples

    def step(self, seconds: float, data_wait: float, communication: float) -> None:
        r = self.reporter
        r.add_phase("data_wait", seconds * data_wait)
        r.add_phase("forward_backward", seconds * (1.0 - data_wait - communication))
        r.add_phase("communication", seconds * communication)
        before, self.total = self.total, self.total + self.tokens
        r.step(tokens=self.tokens, samples=self.total // self.seq_len - before // self.seq_len)


class JobRanks:
    """This node's ranks of one simulated job and the thread that steps them."""

    def __init__(self, sim: SimNvml, job: SimJob, url: str, token: str | None, interval: float = 1.0):
        self.sim = sim
        self.job = job
        spec = job.spec
        seq_len = preset(spec.model).seq_len
        self.ranks: list[_Rank] = []
        self._done: int | None = None  # the last step reported; steps before the ranks started are not theirs
        self._since = 0.0  # simulated time the ranks started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gpumon-simjob-{spec.name}", daemon=True)
        self._failed = False
        if not job.declared.fits:
            log.warning(
                "sim job %s: %s over %d ranks needs an estimated %.0f GiB per GPU even with the optimizer on "
                "the host, more than its GPUs hold; they show full HBM, and the daemon that the declared "
                "setup does not match (give a larger world size, NAME:GPUS:FIRST/WORLD)",
                spec.name, spec.model, spec.world_size, job.declared.allocated_bytes / 2**30,
            )  # fmt: skip
        try:
            for local, gpu in enumerate(spec.gpus):
                reporter = Reporter(
                    job=spec.name, rank=spec.rank(gpu), world_size=spec.world_size, local_rank=local,
                    device=sim.gpus[gpu].uuid, workload=spec.name, dtype=DTYPE, model=preset(spec.model),
                    flops_convention=CONVENTION, url=url, token=token or "", interval=interval, enabled=True,
                    micro_batch=MICRO_BATCH, zero_stage=ZERO_STAGE, setup=job.declared.setup,
                )  # fmt: skip
                reporter.memory_source = SimAllocator(sim, gpu).read
                self.ranks.append(_Rank(reporter, tokens_per_step(spec, sim.gpus[gpu].model), seq_len))
        except BaseException:
            self.close(0.0)
            raise

    def advance(self, now: float) -> int:
        """Report every step that ended by simulated time ``now``; how many there were."""
        k = self.job.steps_done(now)
        if self._done is None:
            self._done, self._since = k, now
            return 0
        t = self.job.timing
        for j in range(self._done + 1, k + 1):
            # the step in progress when the ranks started counts from then on, so that phase times cover
            # exactly the time the ranks have been reporting, and phase ratios are right from the start
            seconds = self.job.step_end(j) - max(self.job.step_end(j - 1), self._since)
            for rank in self.ranks:
                rank.step(seconds, t.data_wait, t.communication)
        reported, self._done = max(0, k - self._done), max(self._done, k)
        return reported

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.advance(self.sim.now())
                done = self._done or 0
                wait = self.job.step_end(done + 1) - self.sim.now()
            except Exception:
                # a rank must never take the daemon down: log once, keep trying at a slow pace
                if not self._failed:
                    log.warning("simulated job %s: stepping failed", self.job.spec.name, exc_info=True)
                    self._failed = True
                wait = MAX_WAIT
            self._stop.wait(min(max(wait, 0.0), MAX_WAIT))

    def close(self, timeout: float = 2.0) -> None:
        """Stop stepping and send every rank's final report, within about ``timeout`` seconds in all."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        share = timeout / max(1, len(self.ranks))
        for rank in self.ranks:
            rank.reporter.close(share)


class SimTraining:
    """Every simulated job of one daemon: started once its server accepts reports, closed before it stops."""

    def __init__(self, sim: SimNvml, url: str, token: str | None = None, interval: float = 1.0) -> None:
        self.sim = sim
        self.url = url
        self.token = token
        self.interval = interval
        self.jobs: list[JobRanks] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            for job in self.sim.jobs:
                try:
                    ranks = JobRanks(self.sim, job, self.url, self.token, self.interval)
                    ranks.start()
                except Exception:
                    log.exception("simulated job %s could not start; the daemon carries on", job.spec.name)
                    continue
                self.jobs.append(ranks)
                s = job.spec
                log.info(
                    "simulated job %s: ranks %d-%d of %d on GPUs %s, %s, step %.3fs, reporting to %s",
                    s.name, s.first_rank, s.first_rank + len(s.gpus) - 1, s.world_size,
                    ",".join(map(str, s.gpus)), s.model, s.timing.step_seconds, self.url,
                )  # fmt: skip

    def stop(self, timeout: float = 3.0) -> None:
        with self._lock:
            jobs, self.jobs = self.jobs, []
        for ranks in jobs:
            try:
                ranks.close(timeout / len(jobs))
            except Exception:
                log.warning("simulated job %s did not close cleanly", ranks.job.spec.name, exc_info=True)
