"""Soak (issue 7): a simulated day of churn against a real daemon, in a few minutes; its footprint and series
at the end against after warm-up. Results go to docs/performance.md.

    python bench/bench_soak.py [--hours 24] [--speed 480] [--markdown FILE]

tests/support/soak.py does the work (tests/e2e/test_soak.py runs a shorter form in CI): `gpumon serve
--simulate 8xH100-SXM --sim-unreported-jobs --sim-speed SPEED --rank-ttl 3s` with GPUs lost and back, a hung
call, NVML errors, a driver reload, a slowdown and XIDs of five codes spread over the day; the node's own jobs
start and stop every 20-60 simulated minutes (their processes with them); two SDK jobs at a time, each a real
process of 8 Reporters with a name of its own, report for 6 s and close (every fourth is SIGKILLed: its ranks
are lost). Scraped once a second. Printed: RSS, threads, open fds and series at the start, mid point and end,
the sweeps done, every error, and each problem found (a non-flat figure or a stale series), and how RSS moved
over the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_daemon import machine
from support import soak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hours", type=float, default=24.0, help="simulated hours (24)")
    p.add_argument("--speed", type=float, default=480.0, help="--sim-speed (480: a day in 3 minutes)")
    p.add_argument("--markdown", type=Path, help="also write the table to this file")
    args = p.parse_args()
    total = args.hours * 3600 / args.speed  # real seconds
    plan = soak.Plan(
        speed=args.speed,
        active=(15.0, total - 15.0),
        settle=15.0,
        job_seconds=6.0,
        ranks=8,
        crash_every=4,
        concurrency=2,
    )
    print(machine())
    load1 = os.getloadavg()[0]
    print(f"{plan}\nfaults: {' '.join(f.text for f in plan.faults())}", flush=True)
    r = soak.run(plan)
    lines = [
        f"`python bench/bench_soak.py --hours {args.hours:g} --speed {args.speed:g}` "
        f"({time.strftime('%Y-%m-%d')}, host load average {load1:.1f} at the start):",
        "",
        soak.markdown([r]),
    ]
    figures = r.figures()
    lines += [
        "",
        "Series the end has and the start had not (cumulative by design, bounded by what happened):",
    ]
    lines += [f"- `{name}`: {n}" for name, n in r.cumulative_added().items()]
    created, dropped = r.scraper.created, r.scraper.dropped
    lines += [
        "",
        f"Churn over the run: {sum(created.values())} series created and {sum(dropped.values())} dropped "
        "between consecutive scrapes; created, by family:",
    ]
    lines += [f"- `{name}`: {n}" for name, n in created.most_common()]
    trace = r.scraper.trace
    if trace:
        t0 = trace[0][0]
        step = max(1, len(trace) // 10)
        lines += ["", "RSS over the run (real seconds, MiB, threads, fds, series):"]
        lines.append(
            ", ".join(
                f"{t - t0:.0f} s: {fp.rss_bytes / 2**20:.1f} / {fp.threads} / {fp.fds} / {n}"
                for t, fp, n in trace[::step]
            )
        )
    problems = r.problems()
    lines += ["", f"Problems: {len(problems)}"] + [f"- {x}" for x in problems]
    print("\n".join(lines))
    print(figures)
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
