"""Ingest throughput and its effect on /metrics latency; results go to docs/performance.md.

    python bench/bench_ingest.py [--seconds 10] [--connections 4]

Against a real `gpumon serve --simulate 8xH100-SXM` over loopback:
  1. /metrics latency (back-to-back scrapes, p50/p99) before any rank reports, then with 8 ranks reporting
     at the SDK's normal rate (one report per rank per second): the baseline;
  2. the same scrapes while a separate load process posts reports at a paced 2,000 reports/s over
     keep-alive connections (8 ranks of one job, increasing seq): the scrape p99 under that load as a
     ratio to the baseline, measured side by side in this run;
  3. the same with the load process posting as fast as the daemon answers: the most reports per second,
     and the daemon's CPU per report (its capacity per core, apart from the load generator that shares
     this machine's cores).
The target (issue 4): >= 2,000 reports/s with /metrics p99 unchanged.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_daemon import Daemon, machine, percentiles
from support.reports import report

RANKS = 8


# every report of a rank is one incarnation, started long enough ago that even the flood's step counts (1 ms
# each) and phases end before now, but after the node booted: the daemon refuses a start before boot
STARTED = max(psutil.boot_time() + 1.0, time.time() - 1e6)


def body(rank: int, seq: int, job: str = "llm", world: int = RANKS) -> bytes:
    r = report(
        seq + 2,
        job=job,
        started=STARTED,
        step_seconds=0.001,
        rank=rank,
        world_size=world,
        devices=[str(rank % RANKS)],
        t=time.time(),
    )
    r["seq"] = seq
    r["phases"] = {"data_wait": 0.01 * seq, "communication": 0.02 * seq}
    return json.dumps(r).encode()


def post_loop(
    url: str, rank: int, seconds: float, interval: float, out: list[int], job: str = "llm", world: int = RANKS
) -> None:
    """Post reports of one rank back to back, or one every ``interval`` seconds (paced, not slept), seq
    counting from 0 as the SDK's do (the daemon refuses a seq that leaps ahead: an impostor's move)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    start = time.monotonic()
    end = start + seconds
    seq = 0
    ok = 0
    due = start
    while time.monotonic() < end:
        seq += 1
        conn.request("POST", "/v1/report", body(rank, seq, job, world), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        ok += resp.status == 204
        if interval:
            due += interval
            time.sleep(max(0.0, due - time.monotonic()))
    conn.close()
    out.append(ok)


def flood(
    url: str, seconds: float, connections: int, job: str, queue: multiprocessing.Queue, rate: float = 0.0
) -> None:
    """``rate`` reports/s in all (0: as fast as the daemon answers), spread over ``connections``, each one
    rank of ``job``."""
    counts: list[int] = []
    interval = connections / rate if rate else 0.0
    threads = [
        threading.Thread(target=post_loop, args=(url, i, seconds, interval, counts, job, connections))
        for i in range(connections)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put(sum(counts))


def scrapes(d: Daemon, seconds: float) -> list[float]:
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        r = d.client.get("/metrics", headers={"Accept-Encoding": "identity"})
        times.append(time.perf_counter() - t0)
        assert r.status_code == 200
        time.sleep(0.02)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--rate", type=float, default=2000.0, help="offered reports/s of the paced run")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    results: dict[str, object] = {"machine": machine()}
    d = Daemon("--simulate", "8xH100-SXM", "--sim-unreported-jobs", "--max-ranks", "64")
    try:
        url = str(d.client.base_url)
        daemon = psutil.Process(d.proc.pid)
        time.sleep(1.0)
        no_ranks = scrapes(d, args.seconds)  # the same daemon before any rank reports: the cost of 8 ranks
        normal: list[int] = []
        reporters = [
            threading.Thread(target=post_loop, args=(url, r, 3 * args.seconds + 5, 1.0, normal))
            for r in range(RANKS)
        ]
        for t in reporters:
            t.start()
        time.sleep(2.0)
        baseline = scrapes(d, args.seconds)
        for name, rate in (("paced", args.rate), ("flood", 0.0)):
            queue: multiprocessing.Queue = multiprocessing.Queue()
            loader = multiprocessing.Process(
                target=flood, args=(url, args.seconds, args.connections, f"load-{name}", queue, rate)
            )
            cpu0 = sum(daemon.cpu_times()[:2])
            t0 = time.monotonic()
            loader.start()
            loaded = scrapes(d, args.seconds)
            accepted = queue.get(timeout=args.seconds + 30)
            elapsed = time.monotonic() - t0
            loader.join()
            cpu = sum(daemon.cpu_times()[:2]) - cpu0
            results[name] = {
                "offered_reports_per_second": rate or "as fast as answered",
                "reports_accepted": accepted,
                "reports_per_second": accepted / min(elapsed, args.seconds),
                "metrics_under_load": percentiles(loaded),
                "p99_ratio_vs_baseline": percentiles(loaded)["p99_ms"] / percentiles(baseline)["p99_ms"],
                # the daemon's CPU per accepted report (scrapes and sampling included): what one core of
                # the daemon could take if the load generator did not share this machine's cores
                "daemon_cpu_us_per_report": 1e6 * cpu / max(1, accepted),
                "reports_per_daemon_core_second": accepted / cpu if cpu else None,
                "scrapes": len(loaded),
            }
        for t in reporters:
            t.join()
        jobs = d.client.get("/v1/jobs").json()["jobs"]
        results["metrics_no_ranks"] = percentiles(no_ranks)
        results["metrics_baseline"] = percentiles(baseline)
        results["scrapes_baseline"] = len(baseline)
        results["connections"] = args.connections
        results["ranks_tracked"] = sum(j["ranks_on_node"] for j in jobs)
    finally:
        d.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
