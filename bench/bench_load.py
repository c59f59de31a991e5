"""Load (issue 7): /metrics latency and sampler freshness under 100 concurrent scrapers while 8 ranks report
at 10x the SDK's rate; results go to docs/performance.md.

    python bench/bench_load.py [--seconds 60] [--markdown FILE]

Against a real `gpumon serve --simulate 8xH100-SXM` on loopback, the load from a separate process
(tests/support/load.py: one asyncio loop, raw HTTP/1.1 keep-alive connections), three scenarios one after
another on the same daemon:

  1. baseline: one scraper, back to back, nothing reporting;
  2. paced: 100 scrapers each scraping every 5 s (20 scrapes/s, as 100 Prometheus servers at a 5 s
     interval would), 8 ranks each posting a cumulative report every 100 ms (80 reports/s offered);
  3. saturating: 100 scrapers back to back (each always has a scrape in flight), the same 8 ranks.

For each: scrapes per second and their latency (p50/p99/max), the sample age at scrape time (when the answer
arrived minus gpumon_last_sample_timestamp_seconds, the newest sweep served: the sampler's freshness), the
reports per second that got through and their latency, every error (a status other than 200/204, a connection
failure or a 30 s timeout), and the daemon's CPU and RSS from /proc. The tests (tests/e2e/test_load.py) run
the saturating scenario for 10 s and assert that nothing fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_daemon import machine
from support import load
from support.helpers import start_daemon
from support.soak import footprint, parse, value

SCENARIOS = (
    # name, scrapers, seconds between a scraper's scrapes (0: back to back), ranks
    ("baseline: 1 scraper back to back, no ranks", 1, 0.0, 0),
    ("paced: 100 scrapers every 5 s, 8 ranks at 10 reports/s", 100, 5.0, 8),
    ("saturating: 100 scrapers back to back, 8 ranks at 10 reports/s", 100, 0.0, 8),
)


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def row(name: str, out: dict[str, Any], cpu: float, rss: int, sweeps: float) -> str:
    s = load.quantiles(out["scrape_seconds"])
    a = load.quantiles(out["sample_age"])
    seconds = out["seconds"]
    scrapes = len(out["scrape_seconds"])
    reports = len(out["report_seconds"])
    bad = sum(n for code, n in out["scrape_status"].items() if code != "200")
    bad += sum(n for code, n in out["report_status"].items() if code != "204")
    bad += sum(out["errors"].values())
    if bad:
        print(
            f"  errors in {name}: {out['scrape_status']} {out['report_status']} {out['errors']}", flush=True
        )
    if reports:
        r = load.quantiles(out["report_seconds"])
        reported = f"{reports / seconds:.1f}/s | {r['p50'] * 1000:.0f} / {r['p99'] * 1000:.0f} ms"
    else:
        reported = "- | -"
    return (
        f"| {name} | {scrapes / seconds:.1f}/s | {s['p50'] * 1000:.0f} / {s['p99'] * 1000:.0f} / "
        f"{s['max'] * 1000:.0f} ms | {a['p50']:.2f} / {a['p99']:.2f} / {a['max']:.2f} s | {sweeps:.0f} | "
        f"{reported} | {bad} | {100 * cpu / seconds:.0f} % | {rss / 2**20:.0f} MiB | "
        f"{100 * out['cpu_seconds'] / seconds:.0f} % |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="measured time per scenario (60)")
    p.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = p.parse_args()
    print(machine())
    load1 = os.getloadavg()[0]
    lines = [
        f"`python bench/bench_load.py --seconds {args.seconds:g}` ({time.strftime('%Y-%m-%d')}, host load "
        f"average {load1:.1f} at the start; other sessions share this VM):",
        "",
        "| scenario | scrapes | scrape p50 / p99 / max | sample age p50 / p99 / max | sweeps | reports "
        "through | report p50 / p99 | errors | daemon CPU | daemon RSS | generator CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    d = start_daemon("--simulate", "8xH100-SXM", "--sim-unreported-jobs")
    try:
        time.sleep(3.0)  # a few sweeps first: GPM and the process list need two
        for name, scrapers, every, ranks in SCENARIOS:
            before = parse(d.get("/metrics").text)
            cpu0 = cpu_seconds(d.proc.pid)
            out = load.generate(d.url, args.seconds, scrapers=scrapers, ranks=ranks, scrape_every=every)
            cpu = cpu_seconds(d.proc.pid) - cpu0
            after = parse(d.get("/metrics").text)
            sweeps = (value(after, "gpumon_samples_total") or 0) - (
                value(before, "gpumon_samples_total") or 0
            )
            lines.append(row(name, out, cpu, footprint(d.proc.pid).rss_bytes, sweeps))
            print(lines[-1], flush=True)
            time.sleep(2.0)
    finally:
        d.stop()
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
