"""The soak run shared by tests/e2e/test_soak.py (CI: a few simulated hours in about a minute) and
bench/bench_soak.py (a simulated day in a few minutes, figures for docs/performance.md).

A real ``gpumon serve --simulate 8xH100-SXM --sim-unreported-jobs --sim-speed S --rank-ttl 3s`` plays
accelerated time: the node's jobs start and stop (their processes with them), GPUs are lost and come back,
calls hang and fail, XIDs of several codes arrive (``--sim-fault``, spread over the active part of the run).
Meanwhile real training processes report through the SDK (``gpumon.client.Reporter``), one job after another,
each with a job name of its own; some close cleanly, some are SIGKILLed (lost ranks). The daemon is scraped
once a second as Prometheus would.

Its footprint (VmRSS, threads, open fds from /proc) and its series (every name and label set in /metrics)
are taken at two quiet points: after warm-up, before any SDK job and any fault, and at the end, once every
fault is over, every SDK rank has expired and the node runs a job on every GPU again. ``problems()`` says
what differs between the two beyond what is cumulative by design (``checks()`` by topic), and
``figures()`` what was measured.

Run one job's ranks by hand:
``python tests/support/soak.py job URL NAME RANKS SECONDS FIRST_GPU INTERVAL close`` (or ``crash``).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
GPUS = 8
RANK_TTL = 3.0
# families whose series may legitimately be added between the quiet points: each is cumulative by design
# and bounded by what happened (see checks()), never by how long the daemon ran
XID_FAMILIES = (
    "gpumon_gpu_xid_errors_total",  # one per (GPU, XID code) seen
    "gpumon_gpu_xid_last_timestamp_seconds",  # likewise
    "gpumon_xid_info",  # one per XID code seen on the node
)
EVENT_LAST = "gpumon_gpu_last_event_timestamp_seconds"  # one per (GPU, event type) seen
ERRORS = "gpumon_errors_total"  # one per (GPU, NVML call, error kind) seen
RANKS_LOST = "gpumon_training_ranks_lost_total"  # one per job seen within the last hour (LOST_RETAIN)
# a gone training rank's goodput ledger, frozen, while its counters are retained (RETAIN_OFFSETS, at most
# --max-ranks of them): a successor's restart gap lands on series Prometheus has
LEDGER = (
    "gpumon_training_goodput_seconds_total",
    "gpumon_training_badput_seconds_total",
    "gpumon_training_steps_redone_total",
)
# the hardware's counters of rare trouble, absent until their first rise (gpumon/gpu/collector.py RARE): one
# per GPU and reason or type at most, however long the run
RARE = (
    "gpumon_gpu_throttle_seconds_total",
    "gpumon_gpu_ecc_errors_total",
    "gpumon_gpu_remapped_rows_total",
    "gpumon_nic_errors_total",
)
CUMULATIVE = (*XID_FAMILIES, EVENT_LAST, ERRORS, RANKS_LOST, *LEDGER, *RARE)
MAX_JOBS = 32  # the daemon's default --max-jobs: the lost-ranks counters it keeps are at most 4x that
MAX_RANKS = 256  # the daemon's default --max-ranks: the gone ranks' ledgers it exports are at most that


# -- the plan ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedFault:
    text: str  # the --sim-fault
    kind: str
    gpu: int
    xid: int | None = None


# (kind, GPU, OP=ARG or XID code, start, duration) with start and duration as shares of the active span:
# GPUs lost and back (GPU 3 twice), a hung call that returns, an NVML error, a driver reload, a slowdown,
# and XIDs of five codes (79 twice on GPU 1). No XID lands on a GPU while it is lost.
_FAULTS: tuple[tuple[str, int, str, float, float], ...] = (
    ("lost", 3, "", 0.05, 0.08),
    ("xid", 1, "79", 0.10, 0.0),
    ("hang", 2, "nvmlDeviceGetUtilizationRates", 0.15, 0.08),
    ("lost", 5, "", 0.25, 0.10),
    ("error", 0, "nvmlDeviceGetTemperature=Unknown", 0.30, 0.06),
    ("xid", 2, "48", 0.35, 0.0),
    ("xid", 6, "94", 0.40, 0.0),
    ("slowdown", 4, "2", 0.45, 0.10),
    ("lost", 3, "", 0.55, 0.06),
    ("uninitialized", 7, "", 0.60, 0.05),
    ("xid", 1, "79", 0.65, 0.0),
    ("xid", 4, "13", 0.75, 0.0),
    ("lost", 6, "", 0.80, 0.08),
    ("xid", 0, "31", 0.90, 0.0),
)


@dataclass(frozen=True)
class Plan:
    """Real seconds are counted from the daemon's "listening" line, which comes after the simulator started:
    so simulated time then is at least ``real * speed`` (faults are over by then) and at most a second or
    two of real time more (the warm-up point is taken well before the first fault)."""

    speed: float  # --sim-speed
    active: tuple[float, float]  # real seconds in which faults happen and SDK jobs start
    settle: float  # real seconds after the active span before the end point may be taken
    job_seconds: float  # how long each SDK job reports
    ranks: int  # per SDK job
    crash_every: int  # every n-th job is SIGKILLed instead of closed
    concurrency: int = 1  # SDK jobs running at once
    report_interval: float = 0.25  # the Reporters' interval (the SDK's default is 1 s)
    interval: str = "1s"  # the daemon's --interval
    # the daemon's --timeout: most of the interval, so that a read slowed by a busy host rarely misses it
    # (a hang lasts seconds: it misses it all the same)
    timeout: str = "900ms"

    def faults(self) -> list[PlannedFault]:
        a, b = self.active
        span = (b - a) * self.speed
        out = []
        for kind, gpu, arg, at, length in _FAULTS:
            start = round(a * self.speed + at * span)
            when = f"@{start}" + (f"+{round(length * span)}" if length else "")
            if kind == "xid":
                out.append(PlannedFault(f"xid:{gpu}:{arg}{when}", kind, gpu, int(arg)))
            elif kind == "slowdown":
                out.append(PlannedFault(f"slowdown:{gpu}={arg}{when}", kind, gpu))
            else:
                out.append(PlannedFault(f"{kind}:{gpu}{':' + arg if arg else ''}{when}", kind, gpu))
        return out

    def daemon_args(self) -> list[str]:
        args = ["--simulate", f"{GPUS}xH100-SXM", "--sim-unreported-jobs", "--sim-speed", f"{self.speed:g}"]
        args += ["--rank-ttl", f"{RANK_TTL:g}s", "--interval", self.interval, "--timeout", self.timeout]
        for f in self.faults():
            args += ["--sim-fault", f.text]
        return args

    @property
    def simulated_hours(self) -> float:
        return (self.active[1] + self.settle) * self.speed / 3600


# -- what the daemon looks like at one moment ----------------------------------------------------------------
@dataclass(frozen=True)
class Footprint:
    rss_bytes: int
    threads: int
    fds: int
    cpu_seconds: float  # user + system since the process started


def footprint(pid: int) -> Footprint:
    status = Path(f"/proc/{pid}/status").read_text()
    stat = Path(f"/proc/{pid}/stat").read_text()
    ticks = stat[stat.rindex(")") + 2 :].split()[11:13]  # utime, stime

    def value(name: str) -> int:
        m = re.search(rf"^{name}:\s+(\d+)", status, re.M)
        assert m, f"/proc/{pid}/status has no {name}"
        return int(m.group(1))

    return Footprint(
        value("VmRSS") * 1024,
        value("Threads"),
        len(os.listdir(f"/proc/{pid}/fd")),
        sum(int(t) for t in ticks) / os.sysconf("SC_CLK_TCK"),
    )


Series = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels


@dataclass(frozen=True)
class Point:
    label: str
    wall: float  # real seconds since listening
    footprint: Footprint
    values: dict[Series, float]

    @property
    def series(self) -> set[Series]:
        return set(self.values)

    def family(self, name: str) -> dict[Series, float]:
        return {s: v for s, v in self.values.items() if s[0] == name}

    def value(self, name: str, **labels: str) -> float | None:
        return value(self.values, name, **labels)


def value(values: dict[Series, float], name: str, **labels: str) -> float | None:
    """The sample of ``name`` with exactly ``labels``, or None."""
    return values.get((name, tuple(sorted(labels.items()))))


def parse(text: str) -> dict[Series, float]:
    out: dict[Series, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


_LINE = re.compile(r"^(gpumon_gpu_up|gpumon_process_info|gpumon_training_rank_info)\{([^}]*)\} (\S+)", re.M)
_SERIES = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? ", re.M)  # every sample line: name and label set
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class Scraper:
    """GET /metrics over one keep-alive connection, as Prometheus does; counts every answer, and notes what
    came and went: GPUs seen down, node-job processes, SDK jobs seen reporting."""

    def __init__(self, url: str, pid: int) -> None:
        self.pid = pid
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.conn: http.client.HTTPConnection | None = None
        self.statuses: Counter[int] = Counter()
        self.slowest = 0.0
        self.down: set[str] = set()  # GPUs seen down
        self.pids: set[tuple[str, str]] = set()  # (GPU, pid) of the node's job processes
        self.sdk_jobs: set[str] = set()  # SDK jobs seen with series
        self.trace: list[tuple[float, Footprint, int]] = []  # (monotonic, footprint, series) per scrape
        # churn: series that appeared or went between consecutive scrapes, by family
        self.live: set[tuple[str, str]] | None = None
        self.created: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    def observe(self, text: str) -> None:
        now = set(_SERIES.findall(text))
        for name, labels, value in _LINE.findall(text):
            got = dict(_LABEL.findall(labels))
            if name == "gpumon_gpu_up" and float(value) == 0:
                self.down.add(got["gpu"])
            elif name == "gpumon_process_info":
                self.pids.add((got["gpu"], got["pid"]))
            elif name == "gpumon_training_rank_info":
                self.sdk_jobs.add(got["job_name"])
        if self.live is not None:
            self.created.update(name for name, _ in now - self.live)
            self.dropped.update(name for name, _ in self.live - now)
        self.live = now

    def get(self) -> str | None:
        t0 = time.monotonic()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            self.conn.request("GET", "/metrics")
            response = self.conn.getresponse()
            body = response.read().decode()
            status = response.status
        except (OSError, http.client.HTTPException):
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            body, status = "", 0
        self.statuses[status] += 1
        self.slowest = max(self.slowest, time.monotonic() - t0)
        if status != 200:
            return None
        self.observe(body)
        series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
        self.trace.append((time.monotonic(), footprint(self.pid), series))
        return body

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


# -- the training side ---------------------------------------------------------------------------------------
@dataclass
class JobRun:
    name: str
    ranks: int
    crashed: bool
    exit_code: int | None = None
    warnings: list[str] = field(default_factory=list)  # what the SDK logged (a refused or failed report)
    flushed: int = 0  # final flushes the daemon accepted (clean jobs: one per rank)


class TrainingDriver:
    """SDK jobs one after another (``concurrency`` at a time), each a real process with ``ranks`` Reporters
    and a job name of its own; every ``crash_every``-th is SIGKILLed instead of closing (ranks lost)."""

    def __init__(self, url: str, plan: Plan) -> None:
        self.url = url
        self.plan = plan
        self.jobs: list[JobRun] = []
        self._stop_at = math.inf
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._lane, args=(lane,), name=f"soak-driver-{lane}", daemon=True)
            for lane in range(plan.concurrency)
        ]
        self._count = 0

    def start(self, stop_at: float) -> None:
        """Start jobs until monotonic time ``stop_at``."""
        self._stop_at = stop_at
        for t in self._threads:
            t.start()

    def join(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def _lane(self, lane: int) -> None:
        while time.monotonic() + self.plan.job_seconds < self._stop_at:
            with self._lock:
                n = self._count
                self._count += 1
            crashed = (n + 1) % self.plan.crash_every == 0
            job = JobRun(f"soak-{n:03d}-{'crash' if crashed else 'clean'}", self.plan.ranks, crashed)
            with self._lock:
                self.jobs.append(job)
            self._run(job, first_gpu=(lane * self.plan.ranks) % GPUS)

    def _run(self, job: JobRun, first_gpu: int) -> None:
        cmd = [
            sys.executable,
            __file__,
            "job",
            self.url,
            job.name,
            str(job.ranks),
            f"{self.plan.job_seconds:g}",
        ]
        cmd += [str(first_gpu), f"{self.plan.report_interval:g}", "crash" if job.crashed else "close"]
        # a crashed job dies by SIGKILL without its final report: the daemon must count its ranks lost
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            out, err = proc.communicate(timeout=self.plan.job_seconds + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        job.exit_code = proc.returncode
        job.warnings = [line for line in err.splitlines() if line.strip()]
        if out.strip():
            job.flushed = json.loads(out.strip().splitlines()[-1])["flushed"]

    def problems(self) -> list[str]:
        out = []
        for job in self.jobs:
            expected = -signal.SIGKILL if job.crashed else 0
            if job.exit_code != expected:
                out.append(f"SDK job {job.name} exited {job.exit_code}, expected {expected}")
            if not job.crashed and job.flushed != job.ranks:
                out.append(f"SDK job {job.name}: {job.flushed} of {job.ranks} flushes accepted")
            if job.warnings:
                out.append(f"SDK job {job.name} logged: {job.warnings[:3]}")
        return out


def run_job(
    url: str, name: str, ranks: int, seconds: float, first_gpu: int, interval: float, crash: bool
) -> None:
    """One training job's ranks in this process: step every 50 ms for ``seconds``, then flush and close, or
    with ``crash`` flush and die by SIGKILL: no final report, no exit handler, as an OOM kill. Right after a
    flush, so that no report is on the wire: a kill at a random moment may cut one off mid-body, which the
    daemon counts as an invalid report."""
    from gpumon.client import Reporter

    reporters = [
        Reporter(
            job=name,
            rank=r,
            world_size=ranks,
            local_rank=r,
            device=str((first_gpu + r) % GPUS),
            workload="soak",
            dtype="bf16",
            flops_per_token=6e9,
            url=url,
            interval=interval,
        )
        for r in range(ranks)
    ]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for r in reporters:
            r.add_phase("data_wait", 0.004)
            r.add_phase("forward_backward", 0.04)
            r.add_phase("communication", 0.006)
            r.step(tokens=4096, samples=2)
        time.sleep(0.05)
    flushed = sum(r.flush(5.0) for r in reporters)
    if crash:
        os.kill(os.getpid(), signal.SIGKILL)
    for r in reporters:
        r.close(5.0)
    print(json.dumps({"flushed": flushed}))


# -- the run -------------------------------------------------------------------------------------------------
@dataclass
class Result:
    plan: Plan
    start: Point
    mid: Point
    end: Point
    jobs: list[JobRun]
    scraper: Scraper
    daemon_log: list[str]
    driver_problems: list[str]
    wall_seconds: float

    def problems(self) -> list[str]:
        return [p for found in checks(self).values() for p in found]

    def figures(self) -> dict[str, object]:
        s, m, e = self.start, self.mid, self.end
        return {
            "speed": self.plan.speed,
            "wall_s": round(self.wall_seconds, 1),
            "simulated_h": round(self.plan.simulated_hours, 1),
            "rss_mib": [round(p.footprint.rss_bytes / 2**20, 1) for p in (s, m, e)],
            "threads": [p.footprint.threads for p in (s, m, e)],
            "fds": [p.footprint.fds for p in (s, m, e)],
            "series": [len(p.values) for p in (s, m, e)],
            "sweeps": e.value("gpumon_samples_total"),
            "daemon_cpu_percent": round(
                100 * (e.footprint.cpu_seconds - s.footprint.cpu_seconds) / max(1e-9, e.wall - s.wall), 1
            ),
            "sdk_jobs": len(self.jobs),
            "sdk_jobs_killed": sum(j.crashed for j in self.jobs),
            "node_processes_seen": len(self.scraper.pids),
            "gpus_seen_down": sorted(self.scraper.down),
            "scrapes": sum(self.scraper.statuses.values()),
            "scrapes_not_200": sum(n for code, n in self.scraper.statuses.items() if code != 200),
            "slowest_scrape_ms": round(self.scraper.slowest * 1000),
            "reports_accepted": e.value("gpumon_ingest_reports_total", outcome="accepted"),
            "reports_refused": sum(
                v
                for (name, labels), v in e.values.items()
                if name == "gpumon_ingest_reports_total" and ("outcome", "accepted") not in labels
            ),
            "rss_growth_second_half_mib": round(self.rss_growth_second_half() / 2**20, 2),
            "cumulative_series_added": self.cumulative_added(),
            "series_created": sum(self.scraper.created.values()),
            "series_dropped": sum(self.scraper.dropped.values()),
            "churn_by_family": dict(self.scraper.created.most_common(12)),
            "problems": len(self.problems()),
        }

    def cumulative_added(self) -> dict[str, int]:
        """Series of the cumulative families that the end has and the start had not, per family."""
        added = self.end.series - self.start.series
        return dict(sorted(Counter(n for n, _ in added if n in CUMULATIVE).items()))

    def rss_growth_second_half(self) -> float:
        """Bytes of RSS the daemon gained from the mid point to the end."""
        return self.end.footprint.rss_bytes - self.mid.footprint.rss_bytes


def quiet(values: dict[Series, float]) -> bool:
    """A point to compare: every GPU up and running one node-job process, no SDK rank on the books."""
    up = [v for (name, _), v in values.items() if name == "gpumon_gpu_up"]
    procs = Counter(dict(labels)["gpu"] for (name, labels) in values if name == "gpumon_process_info")
    ranks = [1 for (name, _) in values if name == "gpumon_training_rank_info"]
    return len(up) == GPUS and all(up) and len(procs) == GPUS and set(procs.values()) == {1} and not ranks


def run(plan: Plan, log_file: Path | None = None) -> Result:
    """The whole soak against a fresh daemon; raises only when the daemon cannot be started or read."""
    from support.helpers import start_daemon

    t0 = time.monotonic()
    daemon = start_daemon(*plan.daemon_args(), ready=False, log_file=log_file)
    listening = time.monotonic()

    def wall() -> float:
        return time.monotonic() - listening

    scraper = Scraper(daemon.url, daemon.proc.pid)
    driver = TrainingDriver(daemon.url, plan)
    try:
        start = _wait_point(daemon.proc.pid, scraper, "start", wall, until=plan.active[0] - 2.0, sweeps=5)
        driver.start(stop_at=listening + plan.active[1])
        mid_at = (plan.active[0] + plan.active[1]) / 2
        _scrape_until(scraper, lambda: wall() >= mid_at)
        mid = _point(daemon.proc.pid, scraper, "mid", wall)
        _scrape_until(scraper, lambda: not driver.running or wall() > plan.active[1] + 60)
        driver.join(30)
        end_from = plan.active[1] + plan.settle
        _scrape_until(scraper, lambda: wall() >= end_from)
        end = _wait_point(daemon.proc.pid, scraper, "end", wall, until=end_from + 30.0, sweeps=0)
        alive = daemon.proc.poll() is None
    finally:
        scraper.close()
        code = daemon.stop()
    log = list(daemon.log)
    if not alive:
        raise AssertionError(f"the daemon died (exit {code}):\n" + "\n".join(log[-40:]))
    return Result(
        plan,
        start,
        mid,
        end,
        list(driver.jobs),
        scraper,
        log,
        driver.problems(),
        time.monotonic() - t0,
    )


def _scrape_until(scraper: Scraper, done: object, every: float = 1.0) -> None:
    assert callable(done)
    while not done():
        scraper.get()
        time.sleep(every)


def _point(pid: int, scraper: Scraper, label: str, wall: object) -> Point:
    assert callable(wall)
    text = scraper.get()
    if text is None:
        raise AssertionError(f"{label}: /metrics did not answer 200")
    # the footprint right after the scrape, so the two describe the same moment
    return Point(label, wall(), footprint(pid), parse(text))


def _wait_point(pid: int, scraper: Scraper, label: str, wall: object, until: float, sweeps: int) -> Point:
    """The first quiet moment (after ``sweeps`` sweeps), scraping once a second until real time ``until``."""
    assert callable(wall)
    while True:
        point = _point(pid, scraper, label, wall)
        done = (point.value("gpumon_samples_total") or 0) >= sweeps
        if done and quiet(point.values):
            return point
        if wall() > until:
            raise AssertionError(
                f"{label}: no quiet moment by {until:.0f} s (every GPU up with one process, no SDK rank): "
                f"{_describe(point.values)}"
            )
        time.sleep(1.0)


def _describe(values: dict[Series, float]) -> str:
    up = {dict(labels)["gpu"]: v for (name, labels), v in values.items() if name == "gpumon_gpu_up"}
    procs = Counter(dict(labels)["gpu"] for (name, labels) in values if name == "gpumon_process_info")
    ranks = sorted({dict(labels)["job_name"] for (n, labels) in values if n == "gpumon_training_rank_info"})
    return f"up={up} processes={dict(procs)} ranks of {ranks}"


# -- what must hold ---------------------------------------------------------------------------------------
RSS_SLACK = 8 * 2**20  # generous: Python's allocator alone moves RSS by a few MiB; a leak per sweep or per
# report over the run's second half (tens of sweeps, hundreds of reports) of real size shows above it


def checks(r: Result) -> dict[str, list[str]]:
    """Everything that is not flat between the two quiet points beyond what is cumulative by design, and
    everything else that went wrong, by topic."""
    e = r.end
    faults = r.plan.faults()
    bad_log = [
        line for line in r.daemon_log if "Traceback" in line or " ERROR " in line or " CRITICAL " in line
    ]
    return {
        "footprint": _check_footprint(r),
        "series": _check_series(r.start, e),
        "xids": _check_xids(e, faults),
        "errors": _check_errors(e, faults),
        "jobs": _check_jobs(r),
        "ingest": _check_ingest(e) + r.driver_problems,
        "daemon": [f"the daemon logged errors: {bad_log[:3]}"] if bad_log else [],
        "scrapes": []
        if set(r.scraper.statuses) == {200}
        else [f"scrapes answered {dict(r.scraper.statuses)}"],
        "exercised": _check_exercised(r),
    }


def _check_footprint(r: Result) -> list[str]:
    """Threads and open fds exactly as after warm-up: the daemon's threads are fixed (the event loop, the
    sampler, one worker per GPU, the event watcher; FastAPI's worker threads serve only the sync endpoints,
    which the soak does not call), and at both points the only client connection is the scraper's."""
    out = []
    s, m, e = r.start.footprint, r.mid.footprint, r.end.footprint
    if e.threads != s.threads:
        out.append(f"threads {s.threads} -> {e.threads}")
    if e.fds != s.fds:
        out.append(f"open fds {s.fds} -> {e.fds}")
    if e.rss_bytes - m.rss_bytes > RSS_SLACK:
        grew = (e.rss_bytes - m.rss_bytes) / 2**20
        out.append(f"RSS grew {grew:.1f} MiB from the mid point to the end (more than {RSS_SLACK >> 20} MiB)")
    return out


def per_process(series: Iterable[Series]) -> set[str]:
    """Families whose series follow the node's processes (labelled by pid) or their owners."""
    return {"gpumon_process_info", "gpumon_gpu_owner_info"} | {
        name for name, labels in series if any(k == "pid" for k, _ in labels)
    }


def _check_series(s: Point, e: Point) -> list[str]:
    """The same series at both points, but for the cumulative families (checked on their own) and the
    per-process ones, whose pids change with the node's jobs: those must keep their shape, one per GPU."""
    out = []
    churn = per_process(s.series | e.series)
    shape = Counter(name for name, _ in s.series if name in churn)
    after = Counter(name for name, _ in e.series if name in churn)
    if after != shape:
        out.append(f"per-process series changed shape: {dict(shape)} -> {dict(after)}")
    gone = sorted(x for x in s.series - e.series if x[0] not in churn)
    if gone:
        out.append(f"{len(gone)} series went: {gone[:5]}")
    added = sorted(x for x in e.series - s.series if x[0] not in churn and x[0] not in CUMULATIVE)
    if added:
        out.append(f"{len(added)} series appeared: {added[:8]}")
    return out


def _check_exercised(r: Result) -> list[str]:
    """The run did what it claims: GPUs went down, the node's jobs churned, every SDK job showed."""
    out = []
    downed = {str(f.gpu) for f in r.plan.faults() if f.kind in ("lost", "hang", "uninitialized")}
    if not downed <= r.scraper.down:
        out.append(
            f"GPUs {sorted(downed - r.scraper.down)} were never seen down, though faults took them down"
        )
    if len({pid for gpu, pid in r.scraper.pids if gpu == "0"}) < 3:
        out.append(f"the node's jobs did not churn: processes seen on GPU 0: {sorted(r.scraper.pids)[:8]}")
    unseen = sorted(j.name for j in r.jobs if j.name not in r.scraper.sdk_jobs)
    if unseen:
        out.append(f"SDK jobs never seen in /metrics: {unseen}")
    if len(r.jobs) < 3:
        out.append(f"only {len(r.jobs)} SDK jobs ran")
    return out


def _gpu_of(e: Point) -> dict[str, str]:
    """uuid -> gpu index, from gpumon_gpu_info."""
    return {
        dict(labels)["uuid"]: dict(labels)["gpu"] for name, labels in e.series if name == "gpumon_gpu_info"
    }


def _check_xids(e: Point, faults: Iterable[PlannedFault]) -> list[str]:
    out = []
    planned = Counter((str(f.gpu), str(f.xid)) for f in faults if f.kind == "xid")
    seen = {
        (dict(labels)["gpu"], dict(labels)["xid"]): v
        for (name, labels), v in e.values.items()
        if name == "gpumon_gpu_xid_errors_total"
    }
    if seen != {k: float(n) for k, n in planned.items()}:
        out.append(f"XIDs counted {seen}, injected {dict(planned)}")
    last = {
        (dict(lb)["gpu"], dict(lb)["xid"])
        for n, lb in e.series
        if n == "gpumon_gpu_xid_last_timestamp_seconds"
    }
    if last != set(planned):
        out.append(f"XID timestamps for {sorted(last)}, injected {sorted(planned)}")
    codes = {dict(lb)["xid"] for n, lb in e.series if n == "gpumon_xid_info"}
    if codes != {code for _, code in planned}:
        out.append(f"gpumon_xid_info for codes {sorted(codes)}, injected {sorted({c for _, c in planned})}")
    events = {(dict(lb)["gpu"], dict(lb)["event"]) for n, lb in e.series if n == EVENT_LAST}
    if events != {(gpu, "xid") for gpu, _ in planned}:
        out.append(f"{EVENT_LAST} for {sorted(events)}: only the GPUs that had XIDs should have one")
    return out


def _check_errors(e: Point, faults: Iterable[PlannedFault]) -> list[str]:
    """Error counters exist only for what went wrong: the GPUs a call fault hit (a few calls each), and, on a
    starved machine, a read that missed its deadline on any GPU (the daemon saying so honestly)."""
    hit = {str(f.gpu) for f in faults if f.kind in ("lost", "hang", "error", "uninitialized")}
    found = [dict(lb) for n, lb in e.series if n == ERRORS]
    stray = [x for x in found if x["gpu"] not in hit and x["error"] != "deadline_exceeded"]
    out = [f"{ERRORS} for GPUs no fault touched: {stray[:5]}"] if stray else []
    per_gpu = Counter(x["gpu"] for x in found)
    many = {gpu: n for gpu, n in per_gpu.items() if n > 8}
    if many:
        out.append(f"{ERRORS}: more than 8 kinds of error on one GPU: {many}")
    return out


def _check_jobs(r: Result) -> list[str]:
    """No series of an ended SDK job remains, except its lost-ranks counter and its ranks' goodput ledgers
    (kept an hour by design, the ledgers for at most --max-ranks ranks)."""
    out = []
    e = r.end
    ended = {j.name: j for j in r.jobs}
    ledgers = set()
    for name, labels in e.series:
        job = dict(labels).get("job_name")
        if job is None:
            continue
        if name in LEDGER:
            ledgers.add((job, dict(labels)["rank"]))
        elif name != RANKS_LOST:
            out.append(f"{name}{dict(labels)} of an ended SDK job remains")
        if job not in ended:
            out.append(f"{name} for a job nobody ran: {job}")
    if len(ledgers) > MAX_RANKS:
        out.append(f"{len(ledgers)} gone ranks' ledgers exported: the store exports at most {MAX_RANKS}")
    lost = {dict(lb)["job_name"]: v for (n, lb), v in e.values.items() if n == RANKS_LOST}
    for job in r.jobs:
        # a killed job's ranks are all lost; a job that closed cleanly lost none (its 0 may be kept or not)
        got, want = lost.get(job.name), float(job.ranks) if job.crashed else 0.0
        if got != want and not (got is None and not job.crashed):
            out.append(f"{RANKS_LOST}{{job_name={job.name}}} is {got}, expected {want:g}")
    if len(lost) > 4 * MAX_JOBS:
        out.append(f"{len(lost)} lost-ranks counters: the store keeps at most {4 * MAX_JOBS}")
    return out


def _check_ingest(e: Point) -> list[str]:
    refused = {
        dict(lb)["outcome"]: v
        for (n, lb), v in e.values.items()
        if n == "gpumon_ingest_reports_total" and dict(lb)["outcome"] != "accepted" and v
    }
    return [f"reports refused: {refused}"] if refused else []


def markdown(results: list[Result]) -> str:
    """The soak table for docs/performance.md."""
    lines = [
        "| run | simulated | wall | sweeps | daemon CPU | SDK jobs (killed) | RSS start / mid / end "
        "| threads | open fds | series start / end | scrapes (not 200) | reports accepted (refused) "
        "| problems |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        f = r.figures()
        rss, threads, fds, series = f["rss_mib"], f["threads"], f["fds"], f["series"]
        assert isinstance(rss, list) and isinstance(threads, list) and isinstance(fds, list)
        assert isinstance(series, list)
        lines.append(
            f"| {f['speed']:g}x | {f['simulated_h']} h | {f['wall_s']} s | {f['sweeps']:.0f} | "
            f"{f['daemon_cpu_percent']} % | "
            f"{f['sdk_jobs']} ({f['sdk_jobs_killed']}) | {rss[0]} / {rss[1]} / {rss[2]} MiB | "
            f"{threads[0]} / {threads[1]} / {threads[2]} | {fds[0]} / {fds[1]} / {fds[2]} | "
            f"{series[0]} / {series[2]} | {f['scrapes']} ({f['scrapes_not_200']}) | "
            f"{f['reports_accepted']:.0f} ({f['reports_refused']:.0f}) | {f['problems']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 9 and sys.argv[1] == "job" and sys.argv[8] in ("close", "crash"):
        _, _, url, name, ranks, seconds, first, interval, end = sys.argv
        run_job(url, name, int(ranks), float(seconds), int(first), float(interval), end == "crash")
    else:
        sys.exit(f"usage: {sys.argv[0]} job URL NAME RANKS SECONDS FIRST_GPU INTERVAL close|crash")
