"""The diagnosis scenario suite (issue 28, item 6): labelled training situations, built from real SDK loops on
simulated GPUs of real daemons, and the daemon's verdicts over time scored against their labels.

Each scenario is data (``Scenario``): the loops to run (``Loop``: a real process of
tests/support/scenario_loop.py, or any command, reporting with ``device=N`` to one daemon), the simulator's
faults and ``--sim-job`` specs it needs, when its situation begins (``onset``), and what the daemon must say
from then on (``Expect``: per job or rank, a bottleneck, findings it must have and must not have, and a few
extra checks). Every scenario runs at once on one simulated node (``MAIN_SPEC``; the README walkthrough on a
node of its own, started as the README starts it), so the suite takes about four minutes.

``run_suite()`` starts the daemons and loops, polls ``GET /v1/jobs?detail=true`` and ``GET /v1/gpus`` of
each daemon every ``POLL`` seconds, stops and reaps everything, and scores each scenario:

- **accuracy**: the share of polls from ``onset + settle`` to ``until`` at which every expectation holds;
- **time to right**: from the onset to the first poll at which every expectation holds (target <= 30 s);
- **flaps per hour**: changes of what the daemon says (each expectation's bottleneck and findings) after it
  first was right, per hour of the time scored (target 0).

Times are seconds since the suite's start ``t0`` (the main daemon ready to serve). A fault's ``@START`` is
written on the same line: gpumon counts it from its own start, a moment before t0, so a scenario that needs
the fault's real moment probes for it (``Probe``) in the daemon's own GPU readings.

Standard library and gpumon only: bench/bench_diagnosis.py imports it as tests/e2e/test_diagnosis_scenarios.py
does.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LOOP = Path(__file__).with_name("scenario_loop.py")
POLL = 2.0  # seconds between polls of each daemon
END = 165.0  # seconds after t0 the suite stops
SETTLE = 30.0  # after the onset, before accuracy counts
TTR_TARGET = 30.0  # seconds from the onset to the right verdict
ACCURACY_TARGET = 0.9
HW_SLOWDOWN = 0x8  # nvmlClocksEventReasonHwSlowdown: the simulator's slowdown fault raises it
IDLE_UTILIZATION = 0.05
# one simulated node for every scenario but the README's: GPU 0 in MIG mode (a --sim-job on it), 1-27 whole
MAIN_SPEC = "1xH100-SXM/mig=3g.40gb+2g.20gb+1g.10gb,27xH100-SXM"
# the README's quickstart (--simulate-if-no-gpu there; here always simulated, whatever the machine has)
README_ARGS = ("--simulate", "8xH100-SXM", "--sim-job", "llama-70b:0-5")
README_ARGS += ("--sim-job", "finetune:6-7:data_wait=0.45")


@dataclass(frozen=True)
class Loop:
    """One process reporting through the SDK. ``args``: scenario_loop.py options beyond the ones every loop
    gets (url, t0, until, job, rank, world size, device), as one string."""

    job: str
    device: int
    args: str = ""
    rank: int = 0
    world_size: int = 1
    start: float = 2.0  # seconds after t0
    kill_at: float | None = None  # SIGKILL at this moment (no final report)
    stop_at: float | None = None  # the loop ends by itself, with its final report (None: after the suite)
    program: str = "loop"  # or "train_tiny": examples/train_tiny.py as the README runs it


@dataclass(frozen=True)
class Expect:
    """What the daemon must say of one job (``rank`` None: the job's verdict) or one of its ranks."""

    job: str
    bottleneck: str | None  # None: any
    rank: int | None = None
    findings: tuple[str, ...] = ()  # must all be among the verdict's findings
    no_findings: tuple[str, ...] = ()  # must none be
    min_tokens_per_second: float | None = None
    straggler_rank: int | None = None  # this rank's straggler score stands out (>= 0.2, the others <= 0.1)
    no_busy_claim: bool = False  # never a busy verdict (stalled, compute, "busy") while the GPU reads idle


@dataclass(frozen=True)
class Probe:
    """When a fault really began, read off the daemon's GPUs: a hardware slowdown showing, or the GPU down."""

    kind: str  # "slowdown" or "down"
    gpu: int


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    expect: tuple[Expect, ...]
    loops: tuple[Loop, ...] = ()
    daemon: str = "main"
    onset: float | None = None  # None: when every expected job is first seen
    probe: Probe | None = None  # the onset is when this shows (else ``onset``)
    until: float | None = None  # seconds after the onset to score until (None: the end)
    settle: float = SETTLE
    faults: tuple[str, ...] = ()  # --sim-fault specs, @START in seconds after t0
    sim_jobs: tuple[str, ...] = ()  # --sim-job specs

    @property
    def expected(self) -> str:
        parts = []
        for e in self.expect:
            who = e.job if e.rank is None else f"{e.job}/{e.rank}"
            what = e.bottleneck or "any"
            if e.findings:
                what += " +" + ",".join(e.findings)
            if e.straggler_rank is not None:
                what = f"rank {e.straggler_rank} straggles"
            parts.append(f"{who}: {what}" if len(self.expect) > 1 else what)
        return "; ".join(parts)


def _steady(
    name: str, device: int, bottleneck: str, args: str = "", faults: tuple[str, ...] = (), **kw: Any
) -> Scenario:
    """One loop on one GPU from the start, one verdict for its job."""
    expect = Expect(name, bottleneck, **kw)
    description = " ".join([args or "compute only"] + [f"--sim-fault {f}" for f in faults])
    return Scenario(name, description, (expect,), (Loop(name, device, args),), faults=faults)


COMPUTE_CLEAN = ("flops_per_token_high", "mfu_above_peak", "gpu_shared", "finished")
DEMO_CLEAN = ("setup_mismatch", "flops_per_token_high", "mfu_above_peak")

SCENARIOS: tuple[Scenario, ...] = (
    _steady("compute", 1, "compute", no_findings=COMPUTE_CLEAN),
    _steady("input-60", 2, "input", "--phase data_wait=0.6"),
    _steady("input-25", 3, "input", "--phase data_wait=0.25"),
    _steady("communication-45", 4, "communication", "--phase communication=0.45"),
    Scenario(
        "memory-capacity",
        "HBM 97 % full, 2 allocator retries a step; the GPU not clearly compute-bound (23 % of each step in "
        "data wait and communication, 20 % in a checkpoint phase: SMs idle)",
        (Expect("memory-capacity", "memory_capacity"),),
        (
            Loop(
                "memory-capacity",
                5,
                "--step 1.0 --phase data_wait=0.08 --phase communication=0.15 --phase checkpoint=0.20 "
                "--memory 77:2",
            ),
        ),
    ),
    _steady("memory-under-compute", 6, "compute", "--memory 77:2", findings=("memory_capacity",)),
    Scenario(
        "throttled-impact",
        "slowdown fault x1.43 for 70 s from t=50; the loop's steps take 1.3x while the GPU shows it",
        (Expect("throttled-impact", "throttled"),),
        (Loop("throttled-impact", 7, "--slow-when-throttled 1.3"),),
        onset=50.0,
        probe=Probe("slowdown", 7),
        until=70.0,
        faults=("slowdown:7=1.43@50+70",),
    ),
    Scenario(
        "throttled-no-impact",
        "slowdown fault x1.43 for 18 s from t=70; the loop's step time does not change",
        (Expect("throttled-no-impact", "compute"),),
        (Loop("throttled-no-impact", 8),),
        onset=70.0,
        probe=Probe("slowdown", 8),
        settle=0.0,
        faults=("slowdown:8=1.43@70+18",),
    ),
    Scenario(
        "shared-gpu",
        "two jobs on GPU 9: one compute only, one 60 % data wait",
        (
            Expect("shared-compute", "compute", findings=("gpu_shared",)),
            Expect("shared-input", "input", findings=("gpu_shared",)),
        ),
        (Loop("shared-compute", 9), Loop("shared-input", 9, "--phase data_wait=0.6")),
    ),
    Scenario(
        "straggler",
        "4 ranks, 0.75 s steps; rank 3 computes 0.7 s (1.4x), the others 0.5 s and wait 0.25 s in "
        "communication",
        (Expect("straggler", None, straggler_rank=3),),
        tuple(
            Loop("straggler", 10 + r, f"--step 0.75 --phase communication={0.067 if r == 3 else 0.333}", r, 4)
            for r in range(4)
        ),
    ),
    Scenario(
        "stalled",
        "hangs inside forward_backward from t=60 (the GPU stays busy)",
        (Expect("stalled", "stalled"),),
        (Loop("stalled", 14, "--hang-at 60"),),
        onset=60.0,
    ),
    Scenario(
        "killed",
        "SIGKILLed at t=60 (no final report); the GPU goes idle",
        (Expect("killed", "exited", no_busy_claim=True),),
        (Loop("killed", 15, kill_at=60.0),),
        onset=60.0,
        until=55.0,  # the rank expires 60 s after its last report (--rank-ttl)
    ),
    Scenario(
        "finished",
        "ends normally at t=70 with its final report",
        (Expect("finished", "compute", findings=("finished",), min_tokens_per_second=1.0),),
        (Loop("finished", 16, stop_at=70.0),),
        onset=71.0,  # its last report lands within a second of its end
        until=26.0,  # a finished rank stays 30 s
        settle=3.0,
    ),
    Scenario(
        "restarted",
        "SIGKILLed at t=50 and started again as the same job and rank at t=53",
        (Expect("restarted", "compute"),),
        (Loop("restarted", 17, kill_at=50.0), Loop("restarted", 17, start=53.0)),
        onset=53.0,
    ),
    Scenario(
        "mig-slice",
        "a --sim-job on GPU 0, in MIG mode (SDK loops cannot drive a MIG GPU in the simulator)",
        (Expect("mig-slice", "compute"),),
        sim_jobs=("mig-slice:0:data_wait=0.03:comm=0.10",),
    ),
    # ranks of 16-rank jobs, two on this node: the simulated NICs carry their all-reduce, and tell a job
    # waiting for a slower peer elsewhere (its NICs idle) from one the network holds back
    Scenario(
        "network-bound",
        "a --sim-job on GPUs 24-25, 2 of 16 ranks, 45 % of each step in an all-reduce at line rate",
        (Expect("network-bound", "communication", no_findings=("waiting_on_peers",)),),
        sim_jobs=("network-bound:24-25:0/16:comm=0.45",),
    ),
    Scenario(
        "peer-wait",
        "a --sim-job on GPUs 26-27, 2 of 16 ranks, 45 % of each step in collectives, 35 % of it waiting for "
        "a slower peer elsewhere while the NICs idle",
        (Expect("peer-wait", "communication", findings=("waiting_on_peers",)),),
        sim_jobs=("peer-wait:26-27:0/16:comm=0.45:peer_wait=0.35",),
    ),
    _steady("inference", 18, "compute", "--kind inference --step 0.2"),
    Scenario(
        "idle",
        "alive and reporting, never steps; waits in data_wait, so its GPU idles",
        (Expect("idle", "idle"),),
        (Loop("idle", 19, "--idle"),),
    ),
    Scenario(
        "gpu-lost",
        "compute; its GPU falls off the bus at t=60 (lost fault)",
        (Expect("gpu-lost", "gpu_down"),),
        (Loop("gpu-lost", 20),),
        onset=60.0,
        probe=Probe("down", 20),
        faults=("lost:20@60",),
    ),
    _steady(
        "flops-per-token-high", 21, "compute", "--declare-fpt-factor 1.6", findings=("flops_per_token_high",)
    ),
    # clocks limited for 40 s that the loop does not pay for: how many checkpoints (or evaluations) a window
    # holds varies, and that must not read as the throttling's cost
    _steady("checkpoint-heavy", 22, "compute", "--every 20:checkpoint:3", faults=("slowdown:22=1.43@30+40",)),
    _steady("evaluation-heavy", 23, "compute", "--every 30:evaluation:8", faults=("slowdown:23=1.43@35+40",)),
    Scenario(
        "readme-walkthrough",
        "the README's demo node (llama-70b on 0-5, finetune on 6-7) and examples/train_tiny.py --device 0 "
        "--data-delay 0.2 on GPU 0",
        (
            Expect("train-tiny", "input", findings=("gpu_shared",)),
            # the demo is coherent: what its ranks declare is what their GPUs and allocators hold, and MFU
            # stays under the tensor activity
            Expect("llama-70b", "compute", no_findings=DEMO_CLEAN),
            Expect("finetune", "input", no_findings=DEMO_CLEAN),
        ),
        (Loop("train-tiny", 0, program="train_tiny"),),
        daemon="readme",
    ),
)


@dataclass
class Poll:
    t: float  # seconds after t0
    jobs: dict[str, dict[str, Any]]
    gpus: dict[int, dict[str, Any]]
    error: str | None = None


@dataclass
class Observation:
    t: float
    labels: tuple[str, ...]  # per expectation: bottleneck[findings], or "absent"
    verdicts: tuple[str, ...]  # per expectation: the bottleneck alone (a flap is a change of these, or of ok)
    ok: bool
    why: tuple[str, ...]  # what was wrong
    violations: tuple[str, ...] = ()


@dataclass
class Result:
    scenario: Scenario
    onset: float
    until: float
    timeline: list[Observation]
    accuracy: float | None
    scored: int
    time_to_right: float | None
    flaps: int | None
    flaps_per_hour: float | None
    violations: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems()

    def problems(self) -> list[str]:
        out = []
        if self.time_to_right is None:
            out.append("never right")
        elif self.time_to_right > TTR_TARGET:
            out.append(f"right only {self.time_to_right:.0f} s after the onset (target {TTR_TARGET:.0f} s)")
        if self.accuracy is None:
            out.append("no poll to score after settling")
        elif self.accuracy < ACCURACY_TARGET:
            out.append(f"accuracy {self.accuracy:.2f} after settling (target {ACCURACY_TARGET})")
        if self.flaps:
            out.append(f"{self.flaps} flap(s) after first right")
        if self.violations:
            out.append(f"{len(self.violations)} poll(s) claim a busy GPU that reads idle")
        return out

    def timeline_text(self) -> str:
        """Runs of the same labels: ``+4..+40 s compute; +42..+60 s input`` (relative to the onset)."""
        runs: list[list[Any]] = []
        for o in self.timeline:
            if runs and runs[-1][2] == o.labels and runs[-1][3] == o.ok:
                runs[-1][1] = o.t
            else:
                runs.append([o.t, o.t, o.labels, o.ok])
        parts = []
        for a, b, labels, ok in runs:
            span = f"{a - self.onset:+.0f}" if a == b else f"{a - self.onset:+.0f}..{b - self.onset:+.0f}"
            parts.append(f"{span} s {' / '.join(labels)}{'' if ok else ' ✗'}")
        return f"(onset t={self.onset:.0f} s) " + "; ".join(parts)


# ----------------------------------------------------------------------------------------------- scoring


def _rank_doc(entry: dict[str, Any], rank: int) -> dict[str, Any] | None:
    for r in entry.get("detail", {}).get("ranks", []):
        if r.get("rank") == rank:
            return r
    return None


def observe(expect: Expect, poll: Poll, before: Poll | None = None) -> tuple[str, str, list[str], list[str]]:
    """One expectation at one poll: its label, its bottleneck, what is wrong, and busy claims on a GPU that
    read idle at this poll and the one ``before`` it (the verdict and the GPU list are two requests, and a
    GPU that went idle between them is no wrong claim; one idle for a whole poll interval is)."""
    entry = poll.jobs.get(expect.job)
    if entry is None:
        return "absent", "absent", [f"{expect.job} absent"], []
    detail = entry.get("detail", {})
    who = expect.job
    if expect.rank is None:
        diag = detail.get("diagnosis", {})
        tps = entry.get("tokens_per_second")
        ranks = detail.get("ranks", [])
    else:
        rd = _rank_doc(entry, expect.rank)
        who = f"{expect.job}/{expect.rank}"
        if rd is None:
            return "absent", "absent", [f"{who} absent"], []
        diag = rd.get("diagnosis", {})
        tps = rd.get("rates", {}).get("tokens_per_second")
        ranks = [rd]
    bottleneck = diag.get("bottleneck")
    findings = list(diag.get("findings") or [])
    label = str(bottleneck) + (f"[{','.join(findings)}]" if findings else "")
    wrong: list[str] = []
    if expect.bottleneck is not None and bottleneck != expect.bottleneck:
        wrong.append(f"{who}: {bottleneck}, not {expect.bottleneck}")
    for f in expect.findings:
        if f not in findings:
            wrong.append(f"{who}: finding {f} missing")
    for f in expect.no_findings:
        if f in findings:
            wrong.append(f"{who}: finding {f}")
    if expect.min_tokens_per_second is not None and not (tps or 0) >= expect.min_tokens_per_second:
        wrong.append(f"{who}: {tps} tokens/s")
    if expect.straggler_rank is not None:
        scores = {r.get("rank"): r.get("straggler_score") for r in ranks}
        slow = scores.get(expect.straggler_rank)
        others = [s for k, s in scores.items() if k != expect.straggler_rank]
        label = "straggler scores " + " ".join(
            f"r{k}={'-' if s is None else f'{s:.1f}'}" for k, s in sorted(scores.items())
        )
        if slow is None or slow < 0.2 or not others or any(s is None or s > 0.1 for s in others):
            wrong.append(f"{who}: straggler scores {scores}")
    busy: list[str] = []
    if expect.no_busy_claim:
        summary = str(diag.get("summary", ""))
        claims = bottleneck in ("stalled", "compute") or "busy" in summary.lower()
        for r in ranks:
            for g in r.get("gpus", []):
                util = _utilization(poll, g.get("index"))
                earlier = _utilization(before, g.get("index")) if before is not None else None
                if (
                    claims
                    and util is not None
                    and util < IDLE_UTILIZATION
                    and (earlier is not None and earlier < IDLE_UTILIZATION)
                ):
                    busy.append(
                        f"t={poll.t:.0f}: {bottleneck} ({summary!r}), GPU {g.get('index')} reads {util}"
                    )
        if busy:
            wrong.append(f"{who}: claims a busy GPU")
    # a change of a bottleneck nobody asked about (``bottleneck`` None) is no flap
    return label, "" if expect.bottleneck is None else str(bottleneck), wrong, busy


def _utilization(poll: Poll, index: Any) -> float | None:
    util = ((poll.gpus.get(index) or {}).get("reading") or {}).get("utilization_ratio")
    return None if util is None else float(util)


def _probe_holds(probe: Probe, poll: Poll) -> bool:
    g = poll.gpus.get(probe.gpu)
    if g is None:
        return False
    if probe.kind == "down":
        return g.get("up") is False
    reasons = (g.get("reading") or {}).get("throttle_reasons") or 0
    return bool(int(reasons) & HW_SLOWDOWN)


def score(s: Scenario, polls: Sequence[Poll], end: float) -> Result:
    """A scenario's timeline, accuracy, time to right and flaps, from its daemon's polls."""
    polls = [p for p in polls if p.error is None]
    onset = s.onset
    if s.probe is not None:
        onset = next((p.t for p in polls if _probe_holds(s.probe, p)), s.onset)
    if onset is None:  # when every expected job is first seen
        jobs = {e.job for e in s.expect}
        onset = next((p.t for p in polls if jobs <= set(p.jobs)), end)
    until = end if s.until is None else min(end, onset + s.until)
    timeline = []
    for before, p in zip([None, *polls], polls, strict=False):
        labels, verdicts, why, busy = [], [], [], []
        for e in s.expect:
            label, verdict, wrong, claims = observe(e, p, before)
            labels.append(label)
            verdicts.append(verdict)
            why += wrong
            busy += claims
        timeline.append(Observation(p.t, tuple(labels), tuple(verdicts), not why, tuple(why), tuple(busy)))
    window = [o for o in timeline if onset <= o.t <= until]
    scored = [o for o in window if o.t >= onset + s.settle]
    first = next((o for o in window if o.ok), None)
    flaps = flaps_h = None
    if first is not None:
        after = [o for o in window if o.t >= first.t]
        flaps = sum(1 for a, b in itertools.pairwise(after) if a.verdicts != b.verdicts or a.ok != b.ok)
        hours = max(until - first.t, POLL) / 3600.0
        flaps_h = flaps / hours
    return Result(
        scenario=s,
        onset=onset,
        until=until,
        timeline=timeline,
        accuracy=(sum(o.ok for o in scored) / len(scored)) if scored else None,
        scored=len(scored),
        time_to_right=None if first is None else first.t - onset,
        flaps=flaps,
        flaps_per_hour=flaps_h,
        violations=[v for o in window for v in o.violations],
    )


# ----------------------------------------------------------------------------------------------- running


class Daemon:
    """``gpumon serve`` on an ephemeral loopback port; its log in ``log``."""

    def __init__(self, name: str, args: Sequence[str], logdir: Path) -> None:
        self.name = name
        self.url = ""
        self.log_path = logdir / f"daemon-{name}.log"
        self._found = threading.Event()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpumon", "serve", "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with self.log_path.open("w") as fh:
            for line in self.proc.stdout:
                fh.write(line)
                fh.flush()
                m = re.search(r"listening on (https?://[\d.]+:\d+)/metrics", line)
                if m and not self.url:
                    self.url = m.group(1)
                    self._found.set()
        self._found.set()

    def wait_listening(self, timeout: float = 60.0) -> None:
        if not self._found.wait(timeout) or not self.url:
            raise RuntimeError(f"daemon {self.name} did not start; see {self.log_path}")

    def wait_ready(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2.0) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"daemon {self.name} not ready; see {self.log_path}")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10.0) as resp:
            return json.load(resp)

    def poll(self, t: float) -> Poll:
        try:
            jobs = {j["job"]: j for j in self.get("/v1/jobs?detail=true")["jobs"]}
            gpus = {g["index"]: g for g in self.get("/v1/gpus")["gpus"]}
            return Poll(t, jobs, gpus)
        except (OSError, ValueError, KeyError) as exc:
            return Poll(t, {}, {}, f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def readme_loop(url: str, device: int, seconds: float, logdir: Path, common: list[str]) -> list[str]:
    """examples/train_tiny.py as the README runs it (``--device N --data-delay 0.2``), when torch imports;
    else the scenario loop as its stand-in, 0.2 s of data wait in 0.3 s steps. Either ends by itself: the
    example after as many steps as ``seconds`` holds at 0.2 s each, at most."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        example = str(ROOT / "examples" / "train_tiny.py")
        steps = str(int(seconds / 0.2) + 1)
        out = str(logdir / "train-tiny.json")
        argv = [sys.executable, example, "--device", str(device), "--data-delay", "0.2", "--url", url]
        return [*argv, "--steps", steps, "--out", out]
    stand_in = ["--job", "train-tiny", "--device", str(device), "--step", "0.3", "--phase", "data_wait=0.67"]
    return [sys.executable, str(LOOP), *common, *stand_in]


def _daemon_args(scenarios: Sequence[Scenario]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in scenarios:
        args = out.setdefault(
            s.daemon, ["--simulate", MAIN_SPEC] if s.daemon == "main" else list(README_ARGS)
        )
        for f in s.faults:
            args += ["--sim-fault", f]
        for j in s.sim_jobs:
            args += ["--sim-job", j]
    return out


@dataclass
class _Running:
    loop: Loop
    proc: subprocess.Popen[bytes]
    log: Any


def run_suite(
    scenarios: Sequence[Scenario] = SCENARIOS,
    *,
    end: float = END,
    poll_every: float = POLL,
    logdir: Path | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> list[Result]:
    """Run every scenario at once, poll, stop and reap everything (also on failure), and score."""
    logdir = Path(tempfile.mkdtemp(prefix="gpumon-scenarios-")) if logdir is None else logdir
    logdir.mkdir(parents=True, exist_ok=True)
    daemons: dict[str, Daemon] = {}
    running: list[_Running] = []
    polls: dict[str, list[Poll]] = {}
    try:
        for name, args in _daemon_args(scenarios).items():
            daemons[name] = Daemon(name, args, logdir)
        daemons["main" if "main" in daemons else next(iter(daemons))].wait_listening()
        t0 = time.time()  # faults count from the daemon's start, a moment before this
        for d in daemons.values():
            d.wait_listening()
            d.wait_ready()
        say(f"daemons ready {time.time() - t0:.1f} s after t0; logs in {logdir}")
        starts = sorted(((lp.start, s, lp) for s in scenarios for lp in s.loops), key=lambda x: x[0])
        kills = sorted(
            ((lp.kill_at, lp) for s in scenarios for lp in s.loops if lp.kill_at is not None),
            key=lambda x: x[0],
        )
        next_poll = 0.0
        while (now := time.time() - t0) < end:
            while starts and starts[0][0] <= now:
                _, s, lp = starts.pop(0)
                running.append(_start(lp, daemons[s.daemon], t0, end, logdir))
            while kills and kills[0][0] <= now:
                _, lp = kills.pop(0)
                for r in running:
                    if r.loop is lp and r.proc.poll() is None:
                        r.proc.kill()
                        say(f"t={now:.0f}: killed {lp.job}/{lp.rank} (pid {r.proc.pid})")
            if now >= next_poll:
                for name, d in daemons.items():
                    polls.setdefault(name, []).append(d.poll(time.time() - t0))
                next_poll += poll_every
            due = [next_poll] + [x[0] for x in starts[:1]] + [x[0] for x in kills[:1]]
            time.sleep(max(0.0, min(min(due), end) - (time.time() - t0)))
    finally:
        for r in running:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in running:
            try:
                r.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
            r.log.close()
        for d in daemons.values():
            d.stop()
    return [score(s, polls.get(s.daemon, []), end) for s in scenarios]


def _start(lp: Loop, d: Daemon, t0: float, end: float, logdir: Path) -> _Running:
    until = end + 5.0 if lp.stop_at is None else lp.stop_at
    common = ["--url", d.url, "--t0", str(t0), "--until", str(until)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if lp.program == "train_tiny":
        argv = readme_loop(d.url, lp.device, until - lp.start, logdir, common)
    else:
        argv = [sys.executable, str(LOOP), *common, "--job", lp.job, "--rank", str(lp.rank)]
        argv += ["--world-size", str(lp.world_size), "--device", str(lp.device), *lp.args.split()]
    log = (logdir / f"loop-{lp.job}-{lp.rank}-{lp.start:g}.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    return _Running(lp, proc, log)


# ----------------------------------------------------------------------------------------------- report


def _fmt(x: float | None, spec: str, unit: str = "") -> str:
    return "—" if x is None else f"{x:{spec}}{unit}"


def table(results: Sequence[Result]) -> str:
    """The markdown table: scenario, expected, accuracy, time to right, flaps per hour, pass; and totals."""
    lines = [
        "| scenario | expected | accuracy | time to right | flaps/h | pass |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.scenario.name} | {r.scenario.expected} | {_fmt(r.accuracy, '.2f')} ({r.scored}) | "
            f"{_fmt(r.time_to_right, '.0f', ' s')} | {_fmt(r.flaps_per_hour, '.0f')} | "
            f"{'yes' if r.passed else 'no'} |"
        )
    acc = [r.accuracy for r in results if r.accuracy is not None]
    ttr = [r.time_to_right for r in results if r.time_to_right is not None]
    flaps = sum(r.flaps or 0 for r in results)
    lines.append(
        f"| **total** ({len(results)}) | | mean {_fmt(sum(acc) / len(acc) if acc else None, '.2f')} | "
        f"max {_fmt(max(ttr) if ttr else None, '.0f', ' s')}, never {len(results) - len(ttr)} | "
        f"{flaps} flaps | {sum(r.passed for r in results)}/{len(results)} |"
    )
    return "\n".join(lines)


def failures(results: Sequence[Result]) -> str:
    out = []
    for r in results:
        if not r.passed:
            out.append(f"- **{r.scenario.name}** ({'; '.join(r.problems())}): {r.timeline_text()}")
    return "\n".join(out)
