"""The load run shared by tests/e2e/test_load.py (CI: about 10 s) and bench/bench_load.py (longer, figures for
docs/performance.md): many concurrent scrapers of /metrics and ranks reporting at 10x the SDK's rate.

The load comes from a separate process (``python tests/support/load.py URL ...``: one asyncio loop, raw
HTTP/1.1 over keep-alive connections), so the generator never shares the daemon's interpreter lock. Each
scraper loops GET /metrics back to back on its own connection; each rank POSTs a report every 1/RATE s (paced:
a late report is sent at once, and the pace resumes from then) with cumulative totals as the wire protocol
says (gpumon/client/protocol.py). The output is one JSON object: every scrape's latency and sampler age (the
time the answer arrived minus ``gpumon_last_sample_timestamp_seconds``, the newest sweep it served), every
report's latency, and every status and connection error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: run as a script, it imports support

from support.reports import report

SWEEP = b"\ngpumon_last_sample_timestamp_seconds "
STEP_SECONDS = 0.01  # each rank "steps" 100 times a second: its totals grow with every report


@dataclass
class Stats:
    scrape_seconds: list[float] = field(default_factory=list)
    sample_age: list[float] = field(default_factory=list)  # seconds: answer received - newest sweep served
    scrape_status: Counter[str] = field(default_factory=Counter)
    scrapes_per_scraper: list[int] = field(default_factory=list)
    report_seconds: list[float] = field(default_factory=list)
    report_status: Counter[str] = field(default_factory=Counter)
    probe_seconds: list[float] = field(default_factory=list)  # GET /healthz, as a liveness probe would
    probe_status: Counter[str] = field(default_factory=Counter)
    last_steps: dict[str, int] = field(default_factory=dict)  # rank -> steps in its last report answered 204
    errors: Counter[str] = field(default_factory=Counter)  # connection errors, by kind
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the generator's own: a saturated generator measures itself, not the daemon

    def json(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Counter) else v) for k, v in self.__dict__.items()}


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return status, bytes(body)
            body += chunk[:-2]
    return status, await reader.readexactly(int(headers.get("content-length", "0")))


async def _scraper(host: str, port: int, end: float, every: float, offset: float, stats: Stats) -> None:
    request = f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    done = 0
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    due = time.monotonic() + offset
    while time.monotonic() < end:
        if every:  # paced, like Prometheus: one scrape every ``every`` seconds, whatever the last one took
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            due = max(due + every, time.monotonic())
        t0 = time.perf_counter()
        try:
            if conn is None:
                conn = await asyncio.open_connection(host, port)
            reader, writer = conn
            writer.write(request)
            status, body = await asyncio.wait_for(_response(reader), timeout=30)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
            stats.errors[f"scrape {type(exc).__name__}"] += 1
            if conn is not None:
                conn[1].close()
            conn = None
            await asyncio.sleep(0.1)
            continue
        received = time.time()
        stats.scrape_seconds.append(time.perf_counter() - t0)
        stats.scrape_status[str(status)] += 1
        done += 1
        at = body.find(SWEEP)
        if status == 200 and at >= 0:
            line_end = body.find(b"\n", at + len(SWEEP))
            stats.sample_age.append(received - float(body[at + len(SWEEP) : line_end]))
    if conn is not None:
        conn[1].close()
    stats.scrapes_per_scraper.append(done)


async def _probe(host: str, port: int, end: float, every: float, stats: Stats) -> None:
    """GET /healthz every ``every`` seconds on a new connection each time, as the kubelet probes."""
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
    while time.monotonic() < end:
        t0 = time.perf_counter()
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            status, _ = await asyncio.wait_for(_response(reader), timeout=30)
            writer.close()
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
            stats.errors[f"probe {type(exc).__name__}"] += 1
        else:
            stats.probe_seconds.append(time.perf_counter() - t0)
            stats.probe_status[str(status)] += 1
        await asyncio.sleep(every)


async def _rank(
    host: str, port: int, rank: int, ranks: int, rate: float, end: float, stats: Stats, per_job: int = 0
) -> None:
    started = time.time() - 100.0  # the incarnation started well before its first step, as a real one
    incarnation = os.urandom(8).hex()  # each run of the generator is a new process of each rank
    period = 1.0 / rate
    due = time.monotonic() + period * rank / ranks  # spread, as processes started apart report apart
    seq = 0
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while time.monotonic() < end:
        seq += 1
        steps = int((time.time() - started) / STEP_SECONDS) - 1  # only steps that ended before now
        phases = {
            "data_wait": steps * 0.001,
            "forward_backward": steps * 0.008,
            "communication": steps * 0.001,
        }
        job, job_rank, world = ("load", rank, ranks)
        if per_job:  # jobs of per_job ranks: load-0, load-1, ...
            job, job_rank, world = f"load-{rank // per_job}", rank % per_job, per_job
        body = json.dumps(
            report(
                steps,
                started=started,
                step_seconds=STEP_SECONDS,
                t=time.time(),
                seq=seq,
                job=job,
                rank=job_rank,
                world_size=world,
                local_rank=rank % 8,
                devices=[str(rank % 8)],
                phases=phases,
                incarnation=incarnation,
                pid=os.getpid(),
            )
        ).encode()
        head = (
            f"POST /v1/report HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        try:
            if conn is None:
                conn = await asyncio.open_connection(host, port)
            reader, writer = conn
            writer.write(head + body)
            status, _ = await asyncio.wait_for(_response(reader), timeout=30)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
            stats.errors[f"report {type(exc).__name__}"] += 1
            if conn is not None:
                conn[1].close()
            conn = None
            status = 0
        else:
            stats.report_seconds.append(time.perf_counter() - t0)
            stats.report_status[str(status)] += 1
        if status == 204:
            stats.last_steps[str(rank)] = steps
        due += period
        delay = due - time.monotonic()
        if delay < 0:  # behind (the daemon answered late): send now, and keep the pace from here
            due = time.monotonic()
        await asyncio.sleep(max(0.0, delay))
    if conn is not None:
        conn[1].close()


async def run(
    url: str,
    seconds: float,
    scrapers: int,
    ranks: int,
    rate: float,
    every: float,
    per_job: int = 0,
    probe_every: float = 0.0,
) -> Stats:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    stats = Stats()
    t0 = time.monotonic()
    end = t0 + seconds
    # paced scrapers start spread over their interval, as independent Prometheus servers would
    tasks = [_scraper(host, port, end, every, every * i / scrapers, stats) for i in range(scrapers)]
    tasks += [_rank(host, port, r, ranks, rate, end, stats, per_job) for r in range(ranks)]
    if probe_every:
        tasks.append(_probe(host, port, end, probe_every, stats))
    await asyncio.gather(*tasks)
    stats.seconds = time.monotonic() - t0
    return stats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url", help="the daemon, e.g. http://127.0.0.1:9478")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--scrapers", type=int, default=100)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--rate", type=float, default=10.0, help="reports per second per rank (the SDK: 1)")
    p.add_argument("--scrape-every", type=float, default=0.0, help="a scraper's interval (0: back to back)")
    p.add_argument("--ranks-per-job", type=int, default=0, help="jobs of this many ranks (0: one job)")
    p.add_argument("--probe-every", type=float, default=0.0, help="GET /healthz this often (0: never)")
    a = p.parse_args()
    stats = asyncio.run(
        run(a.url, a.seconds, a.scrapers, a.ranks, a.rate, a.scrape_every, a.ranks_per_job, a.probe_every)
    )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stats.cpu_seconds = usage.ru_utime + usage.ru_stime
    print(json.dumps(stats.json()))


# -- for the test and the benchmark --------------------------------------------------------------------------
def generate(
    url: str,
    seconds: float,
    scrapers: int = 100,
    ranks: int = 8,
    rate: float = 10.0,
    scrape_every: float = 0.0,
    ranks_per_job: int = 0,
    probe_every: float = 0.0,
) -> dict[str, Any]:
    """Run the generator in its own process; its JSON output."""
    import subprocess

    cmd = [sys.executable, __file__, url, f"--seconds={seconds:g}", f"--scrapers={scrapers}"]
    cmd += [f"--ranks={ranks}", f"--rate={rate:g}", f"--scrape-every={scrape_every:g}"]
    cmd += [f"--ranks-per-job={ranks_per_job}", f"--probe-every={probe_every:g}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if out.returncode != 0:
        raise RuntimeError(f"the load generator failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def quantiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max, in the values' unit."""
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    v = sorted(values)
    return {"p50": v[len(v) // 2], "p99": v[min(len(v) - 1, int(len(v) * 0.99))], "max": v[-1]}


if __name__ == "__main__":
    main()
