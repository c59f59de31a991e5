"""The daemon's footprint as deployed: CPU and memory of a real `gpumon serve` process; results go to
docs/performance.md, and the Kubernetes DaemonSet's requests and limits and the systemd unit's MemoryMax
are sized from them.

    python bench/bench_footprint.py [--seconds 60]

Each scenario starts `gpumon serve --simulate ...` as a subprocess on loopback, lets it warm up, then
scrapes it for ``--seconds`` while reading its CPU time and memory from /proc (the daemon alone: the
simulator's dynamics and simulated ranks run inside it, reports posted by this benchmark do not count):

  1. one GPU, nothing reporting, scraped every second;
  2. eight GPUs, nothing reporting, scraped every second;
  3. eight GPUs and one 8-rank simulated job (--sim-job), scraped every second;
  4. eight GPUs and 256 ranks (32 jobs of 8, the default --max-ranks) each reporting once a second over
     HTTP, scraped every 15 s as Prometheus would.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_daemon import machine
from support.helpers import free_port
from support.reports import report

ROOT = Path(__file__).resolve().parent.parent
WARMUP_SECONDS = 10.0


@dataclass
class Usage:
    cpu_seconds: float
    rss_bytes: int
    peak_bytes: int


def usage(pid: int) -> Usage:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    status = Path(f"/proc/{pid}/status").read_text()

    def kib(name: str) -> int:
        m = re.search(rf"^{name}:\s+(\d+) kB", status, re.M)
        return int(m.group(1)) * 1024 if m else 0

    return Usage(ticks / os.sysconf("SC_CLK_TCK"), kib("VmRSS"), kib("VmHWM"))


class Reporters:
    """``jobs`` x 8 ranks posting cumulative reports once a second, one connection per job."""

    def __init__(self, port: int, jobs: int) -> None:
        self.port = port
        self.jobs = jobs
        self.stop = threading.Event()
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._post, args=(j,), daemon=True) for j in range(jobs)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def _post(self, job: int) -> None:
        started = time.time() - 3600
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        seq = 0
        while not self.stop.is_set():
            seq += 1
            for rank in range(8):
                body = report(
                    seq * 10 + 2, started=started, step_seconds=0.3, job=f"job{job}", rank=rank, world_size=8,
                    local_rank=rank, devices=[str(rank)], t=time.time(), seq=seq,
                )  # fmt: skip
                try:
                    conn.request("POST", "/v1/report", json.dumps(body), {"Content-Type": "application/json"})
                    response = conn.getresponse()
                    response.read()
                    status = response.status
                except (OSError, http.client.HTTPException):
                    conn.close()
                    status = 0
                with self.lock:
                    self.statuses[status] = self.statuses.get(status, 0) + 1
            self.stop.wait(1.0)


def scenario(
    name: str, spec: str, seconds: float, scrape_every: float, extra: list[str], jobs: int = 0
) -> str:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "gpumon",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--simulate",
        spec,
        "--sim-unreported-jobs",  # a node at work, as the figures in docs/performance.md were taken
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    reporters = Reporters(port, jobs) if jobs else None
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{name}: the daemon did not start") from None
                time.sleep(0.2)
        if reporters is not None:
            reporters.start()
        time.sleep(WARMUP_SECONDS)
        before = usage(proc.pid)
        t0 = time.monotonic()
        scrapes, size, slowest = 0, 0, 0.0
        while time.monotonic() - t0 < seconds:
            s = time.monotonic()
            size = len(urllib.request.urlopen(url, timeout=10).read())
            slowest = max(slowest, time.monotonic() - s)
            scrapes += 1
            time.sleep(scrape_every)
        after = usage(proc.pid)
        elapsed = time.monotonic() - t0
    finally:
        if reporters is not None:
            reporters.close()
        proc.terminate()
        proc.wait(15)
    cpu = 100 * (after.cpu_seconds - before.cpu_seconds) / elapsed
    refused = "" if reporters is None else f" | {sum(v for k, v in reporters.statuses.items() if k != 204)}"
    return (
        f"| {name} | {cpu:.1f} % | {after.rss_bytes / 2**20:.0f} MiB | {after.peak_bytes / 2**20:.0f} MiB | "
        f"{size / 1024:.0f} KiB | {slowest * 1000:.0f} ms | {scrapes}{refused or ' | -'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="measured time per scenario (60)")
    args = parser.parse_args()
    print(machine())
    print()
    print(
        "| scenario | CPU (of one core) | RSS | peak RSS | exposition | slowest scrape | scrapes "
        "| reports not 204 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    base = ["--profiling", "gpm"]
    rows = [
        ("1 GPU, idle, scraped every 1 s", "1xH100-SXM", 1.0, base, 0),
        ("8 GPUs, idle, scraped every 1 s", "8xH100-SXM", 1.0, base, 0),
        ("8 GPUs, an 8-rank job, scraped every 1 s", "8xH100-SXM", 1.0, [*base, "--sim-job", "llama:0-7"], 0),
        ("8 GPUs, 256 ranks reporting 1/s, scraped every 15 s", "8xH100-SXM", 15.0, base, 32),
    ]
    for name, spec, every, extra, jobs in rows:
        print(scenario(name, spec, args.seconds, every, extra, jobs), flush=True)


if __name__ == "__main__":
    main()
