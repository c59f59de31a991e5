"""A fleet on loopback for tests/e2e/test_fleet.py: simulated nodes, a real Prometheus with the shipped rules,
a synchronous job's barrier, and the node processes that run its ranks (tests/support/sync_ranks.py).

Only timings are shortened, as in tests/e2e/test_stack.py: every ``for:``/``keep_firing_for:``, the scrape
and evaluation intervals. The expressions, labels and annotations are the shipped ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpumon import alerting
from support.helpers import ROOT, Daemon, start_daemon
from support.stack import Process, Prometheus, shortened_rules
from support.victoria import Vmalert

SYNC_RANKS = ROOT / "tests" / "support" / "sync_ranks.py"
# seconds: every for:/keep_firing_for: of the shipped rules, as test_stack.py shortens them (two scrapes and
# more, so a CPU-starved scrape on this shared machine is not an outage)
SHORT = 5
# up{job="gpumon"} is absent for the first seconds after Prometheus starts (test_stack.py): the shipped 10m
# of GpumonExporterAbsent covers that, 30 s does here
ABSENT_FOR = "30s"
# GpumonTrainingCommunicationBound waits 30 minutes where the straggler alerts wait 5: it defers to a firing
# straggler alert, which here fires about 50 s after the onset (the rules' one-minute rate, then SHORT). Its
# for: must outlast that, as the shipped one does, and still end inside the straggler phase (test_fleet's
# STRAGGLER_MIN), so that without the deferral it would fire and the test fail
COMMUNICATION_FOR = "50s"
SCRAPE = 2.0  # seconds between scrapes
PROMETHEUS_GLOBAL = {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "1s"}


def node_args(i: int, library: Path) -> list[str]:
    """A simulated 8-GPU node whose GPUs idle until SDK ranks drive them (no --sim-job)."""
    args = ["--simulate", "8xH100-SXM", "--seed", str(i), "--node-name", f"node-{i}"]
    # a 2 s sampling interval and a 10 s window as in the stack test: three daemons share two cores. The
    # rank TTL outlasts the test, so a killed rank's counters (its ledger) stay for the restart's accounting
    args += ["--interval", "2s", "--rate-window", "10s", "--rank-ttl", "10m", "--baselines", str(library)]
    # a restart's new counters show 0 for two scrapes (VictoriaMetrics scrapes too), then their value
    args += ["--counter-hold", "5s"]
    return args


def start_nodes(count: int, library: Path, work: Path) -> list[Daemon]:
    nodes: list[Daemon] = []
    try:
        for i in range(count):
            nodes.append(start_daemon(*node_args(i, library), log_file=work / f"node-{i}.log"))
    except BaseException:
        for n in nodes:
            n.stop()
        raise
    return nodes


def write_rules(work: Path) -> tuple[list[str], list[Path]]:
    """The shipped rule files with their timers shortened as test_stack.py shortens them, for Prometheus and
    as `python -m gpumon.alerting --vmalert` renders them for vmalert."""
    fors = {"GpumonExporterAbsent": ABSENT_FOR, "GpumonTrainingCommunicationBound": COMMUNICATION_FOR}
    paths, vmalert = [], []
    docs = shortened_rules(SHORT, fors)
    every = [g for _, doc in docs for g in doc["groups"]]  # the alerting rules read the recorded series
    for name, doc in docs:
        (work / name).write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
        paths.append(str(work / name))
        variant = work / f"vmalert-{name}"
        variant.write_text(alerting.dump({"groups": alerting.vmalert_groups(doc["groups"], every)}))
        vmalert.append(variant)
    return paths, vmalert


def prometheus_config(targets: list[str], rules: list[str]) -> dict[str, Any]:
    return {
        "global": PROMETHEUS_GLOBAL,
        "rule_files": rules,
        "scrape_configs": [{"job_name": "gpumon", "static_configs": [{"targets": targets}]}],
    }


def defined_rules() -> set[str]:
    """Names of every recording rule and alert in the shipped files."""
    groups = alerting.load_rules()
    return set(alerting.recording_names(groups)) | {r["alert"] for r in alerting.alert_rules(groups)}


class PromApi(Prometheus):
    """The stack test's Prometheus client, plus what the fleet test reads: one value, the samples a range
    held, and the active alerts with their annotations."""

    def scalar(self, expr: str, at: float | None = None) -> float | None:
        """The one value of ``expr``, or None when it has none (several series are an error)."""
        found = self.query(expr, at)
        assert len(found) <= 1, f"{expr}: {len(found)} series where one was expected: {found}"
        return float(found[0]["value"][1]) if found else None

    def values(
        self, selector: str, start: float, end: float
    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """Every raw sample (time, value) of the series ``selector`` names between start and end (wall
        clock): the series that ended in between too, which an instant query at ``end`` would not show."""
        seconds = max(1, int(end - start + 1))
        out = []
        for series in self.query(f"{selector}[{seconds}s]", at=end):
            points = [(float(t), float(v)) for t, v in series["values"] if float(t) >= start]
            if points:
                out.append((series["metric"], points))
        return out

    def samples(self, selector: str, start: float, end: float) -> list[tuple[dict[str, str], list[float]]]:
        """The times of those samples."""
        return [(metric, [t for t, _ in points]) for metric, points in self.values(selector, start, end)]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing) with their labels and rendered annotations."""
        return list(self.client.get("/api/v1/alerts").json()["data"]["alerts"])


class VictoriaApi(PromApi):
    """The same reads on VictoriaMetrics, its rules' health and active alerts from vmalert."""

    def __init__(self, vm: Process, vmalert: Process) -> None:
        super().__init__(vm)
        self.vmalert = Vmalert(vmalert)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        return self._query(expr, at, {"nocache": "1"})  # never an answer from before the last samples

    def alerts(self) -> list[dict[str, Any]]:
        return self.vmalert.alerts()

    def rule_health(self) -> list[str]:
        return self.vmalert.rule_health()

    def close(self) -> None:
        super().close()
        self.vmalert.close()


class Barrier:
    """The job's collective, served on loopback: each connected rank sends one line per step and gets "go"
    once every connected rank has sent its line (a generation). A rank that disconnects (its process died)
    leaves at once, so the others go on without it; one that connects joins the next generation it reaches,
    as a restarted rank rejoins the collective. Closing it ends every rank's loop."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self._cond = threading.Condition()
        self._members: set[int] = set()
        self._arrived: set[int] = set()
        self._generation = 0
        self._closed = False
        self._conns: list[socket.socket] = []
        self._accepter = threading.Thread(target=self._accept, name="barrier", daemon=True)
        self._accepter.start()

    @property
    def port(self) -> int:
        return int(self._server.getsockname()[1])

    def _accept(self) -> None:
        n = 0
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            n += 1
            threading.Thread(target=self._serve, args=(conn, n), daemon=True).start()

    def _serve(self, conn: socket.socket, me: int) -> None:
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._cond:
            if self._closed:
                conn.close()
                return
            self._members.add(me)
            self._conns.append(conn)
        try:
            for _ in conn.makefile("rb"):
                with self._cond:
                    generation = self._generation
                    self._arrived.add(me)
                    self._release()
                    while self._generation == generation and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                conn.sendall(b"go\n")
        except OSError:
            pass
        finally:
            with self._cond:
                self._members.discard(me)
                self._arrived.discard(me)
                self._release()
            conn.close()

    def _release(self) -> None:
        if self._arrived and self._arrived >= self._members:
            self._arrived = set()
            self._generation += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self._server.close()


class Control:
    """Each node's compute factor, read by the node processes at every step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.factors: dict[str, float] = {}
        self.set()

    def set(self, **factors: float) -> None:
        """``node_1=1.4``: node-1's ranks compute 1.4 times longer; nodes not named run at 1."""
        self.factors = {k.replace("_", "-"): v for k, v in factors.items()}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"factors": self.factors}))
        os.replace(tmp, self.path)  # whole or not at all: a reader never sees half a file


@dataclass
class NodeRanks:
    """One node process running some ranks (sync_ranks.py)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    ranks: list[int]
    stderr: Path

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)  # reaped: a zombie keeps its /proc entry

    def stop(self, timeout: float = 15.0) -> None:
        """After the barrier closed the ranks end by themselves (final reports); SIGTERM if they do not."""
        if self.proc.poll() is not None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def steps(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            with contextlib.suppress(ValueError):  # the line a SIGKILL cut short
                out.append(json.loads(line))
        return out

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.name}'s ranks exited with {self.proc.returncode}:\n{self.stderr.read_text()[-3000:]}"
            )


@dataclass
class Job:
    name: str
    world_size: int
    compute: float
    comm: float
    flops_per_token: float
    barrier: Barrier
    control: Control
    work: Path
    state_dir: Path
    load: float  # seconds of each process's start-up between its Reporters and its first step
    processes: list[NodeRanks] = field(default_factory=list)

    def start(
        self, label: str, node: str, url: str, ranks: dict[int, int], resumed_step: int | None = None
    ) -> NodeRanks:
        """A process on ``node`` (reporting to ``url``) running ``ranks`` (rank -> GPU)."""
        log = self.work / f"{label}.steps.jsonl"
        stderr = self.work / f"{label}.stderr"
        args = [
            sys.executable, str(SYNC_RANKS), "--url", url, "--barrier", str(self.barrier.port), "--control",
            str(self.control.path), "--node", node, "--log", str(log), "--job", self.name, "--world-size",
            str(self.world_size), "--compute", str(self.compute), "--comm", str(self.comm),
            "--flops-per-token", str(self.flops_per_token), "--load", str(self.load),
        ]  # fmt: skip
        for rank, gpu in ranks.items():
            args += ["--rank", f"{rank}:{gpu}"]
        if resumed_step is not None:
            args += ["--resumed-step", str(resumed_step)]
        # the state directory outlives the process wherever the rank restarts, as a checkpoint directory
        # does: the SDK links a restarted rank to its predecessor through it (docs/sdk.md)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUMON_STATE_DIR": str(self.state_dir)}
        with stderr.open("wb") as err:
            proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=self.work)
        p = NodeRanks(label, proc, log, sorted(ranks), stderr)
        self.processes.append(p)
        return p

    def stop(self) -> None:
        self.barrier.close()
        for p in self.processes:
            p.stop()


def busy_by_rank(steps: list[dict[str, Any]], start: float, end: float) -> dict[int, float]:
    """Each rank's mean busy seconds per step (outside the collective) over the steps between start and
    end: what the rules' busy time per step measures over the same window."""
    sums: dict[int, list[float]] = {}
    for s in steps:
        if start <= s["t"] <= end:
            acc = sums.setdefault(s["rank"], [0.0, 0.0])
            acc[0] += s["busy"]
            acc[1] += 1
    return {rank: total / n for rank, (total, n) in sums.items() if n}


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
