"""Serving under scrape load (issue 16): /healthz, /metrics and SDK reports while 256 ranks report and 0 to
32 scrapers scrape back to back; this tree against another commit, side by side in one run.

    python bench/bench_serving.py --baseline REF [--seconds 10] [--markdown FILE]
    python bench/bench_serving.py --baseline REF --typical [--seconds 60] [--rounds 3]

Each tree runs `gpumon serve --simulate 8xH100-SXM --max-jobs 32 --max-ranks 256` on loopback (the other
commit from a temporary git worktree), and the same load generator (tests/support/load.py, its own process)
drives it: 256 ranks as 32 jobs of 8, each reporting once a second as the SDK does, a liveness probe that
opens a connection and GETs /healthz every 100 ms, and 0, 1, 8 or 32 scrapers on keep-alive connections,
each with a scrape always in flight. Per scenario: /healthz p50/p99, scrape p50/p99 and rate, reports per
second accepted, and the daemon's CPU. The trees alternate scenario by scenario, so a change in the host's
load hits both; the ratio column is this tree over the baseline.

--typical measures a node as most are run instead: `gpumon serve --simulate 8xH100-SXM`, one job of 8 ranks
reporting once a second, two Prometheus replicas scraping every 15 s and a probe every 10 s; the figure is
the daemon's CPU, the trees alternating for --rounds rounds of --seconds each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_daemon import machine
from bench_load import cpu_seconds
from support import load
from support.helpers import ROOT, Daemon, start_daemon

RANKS, PER_JOB = 256, 8
SCRAPERS = (0, 1, 8, 32)
DAEMON = ("--simulate", "8xH100-SXM", "--max-jobs", "32", "--max-ranks", str(RANKS))


def measure(d: Daemon, scrapers: int, seconds: float) -> dict[str, float]:
    cpu0 = cpu_seconds(d.proc.pid)
    out = load.generate(
        d.url, seconds, scrapers=scrapers, ranks=RANKS, rate=1.0, ranks_per_job=PER_JOB, probe_every=0.1
    )
    cpu = cpu_seconds(d.proc.pid) - cpu0
    probe, scrape = load.quantiles(out["probe_seconds"]), load.quantiles(out["scrape_seconds"])
    failed = sum(out["errors"].values()) + sum(
        n for code, n in {**out["probe_status"], **out["scrape_status"]}.items() if code != "200"
    )
    return {
        "probe_p50": probe["p50"] * 1000,
        "probe_p99": probe["p99"] * 1000,
        "scrape_p50": scrape["p50"] * 1000,
        "scrape_p99": scrape["p99"] * 1000,
        "scrapes": len(out["scrape_seconds"]) / out["seconds"],
        "reports": out["report_status"].get("204", 0) / out["seconds"],
        "cpu": 100 * cpu / out["seconds"],
        "failed": failed,
    }


def typical(daemons: dict[str, Daemon], seconds: float, rounds: int) -> dict[str, list[float]]:
    """Daemon CPU (% of a core) per round and tree under a typical node's load."""
    cpu: dict[str, list[float]] = {name: [] for name in daemons}
    for _ in range(rounds):
        for name, d in daemons.items():
            cpu0 = cpu_seconds(d.proc.pid)
            out = load.generate(
                d.url,
                seconds,
                scrapers=2,
                scrape_every=15.0,
                ranks=8,
                rate=1.0,
                ranks_per_job=8,
                probe_every=10,
            )
            cpu[name].append(100 * (cpu_seconds(d.proc.pid) - cpu0) / out["seconds"])
            print(
                f"typical, {name}: {cpu[name][-1]:.1f} % CPU, {len(out['scrape_seconds'])} scrapes",
                flush=True,
            )
    return cpu


def cell(new: float, old: float, fmt: str) -> str:
    ratio = f" ({new / old:.2f}x)" if old == old and old > 0 and new == new else ""  # NaN: no scrapes
    return f"{new:{fmt}} / {old:{fmt}}{ratio}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="the commit to compare with (the one before a change)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured time per scenario and tree (10)")
    p.add_argument("--markdown", type=Path, help="also write the table to this file")
    p.add_argument("--typical", action="store_true", help="a typical node's load instead (see above)")
    p.add_argument("--rounds", type=int, default=3, help="--typical: rounds per tree (3)")
    args = p.parse_args()
    if args.typical:
        return main_typical(args)
    print(machine(), flush=True)
    base = Path(tempfile.mkdtemp(prefix="gpumon-baseline-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=ROOT, check=True)
    daemons: dict[str, Daemon] = {}
    try:
        # trees before the coherent simulator load their GPUs by default; this one needs asking
        daemons = {
            "this": start_daemon(*DAEMON, "--sim-unreported-jobs"),
            "baseline": start_daemon(*DAEMON, tree=base),
        }
        for d in daemons.values():  # every rank admitted and a few sweeps done before anything is measured
            load.generate(d.url, 3.0, scrapers=0, ranks=RANKS, rate=1.0, ranks_per_job=PER_JOB)
        results: dict[int, dict[str, dict[str, float]]] = {}
        for n in SCRAPERS:
            results[n] = {}
            for name, d in daemons.items():
                results[n][name] = measure(d, n, args.seconds)
                print(f"{n} scrapers, {name}: {results[n][name]}", flush=True)
    finally:
        for d in daemons.values():
            d.stop()
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", args.baseline], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"`python bench/bench_serving.py --baseline {commit} --seconds {args.seconds:g}` "
        f"({time.strftime('%Y-%m-%d')}, host load average {os.getloadavg()[0]:.1f} at the end); each cell "
        f"is this tree / {commit} (ratio):",
        "",
        "| scrapers | /healthz p50 | /healthz p99 | scrape p50 | scrape p99 | scrapes/s | reports/s accepted "
        "| daemon CPU | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, r in results.items():
        new, old = r["this"], r["baseline"]
        lines.append(
            f"| {n} | {cell(new['probe_p50'], old['probe_p50'], '.1f')} ms "
            f"| {cell(new['probe_p99'], old['probe_p99'], '.1f')} ms "
            f"| {cell(new['scrape_p50'], old['scrape_p50'], '.0f')} ms "
            f"| {cell(new['scrape_p99'], old['scrape_p99'], '.0f')} ms "
            f"| {cell(new['scrapes'], old['scrapes'], '.1f')} "
            f"| {cell(new['reports'], old['reports'], '.0f')} "
            f"| {cell(new['cpu'], old['cpu'], '.0f')} % | {new['failed']:.0f} / {old['failed']:.0f} |"
        )
    print("\n".join(lines))
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")


def main_typical(args: argparse.Namespace) -> None:
    print(machine(), flush=True)
    base = Path(tempfile.mkdtemp(prefix="gpumon-baseline-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=ROOT, check=True)
    daemons: dict[str, Daemon] = {}
    node = ("--simulate", "8xH100-SXM")
    try:
        # trees before the coherent simulator load their GPUs by default; this one needs asking
        daemons = {
            "this": start_daemon(*node, "--sim-unreported-jobs"),
            "baseline": start_daemon(*node, tree=base),
        }
        for d in daemons.values():
            load.generate(d.url, 3.0, scrapers=0, ranks=8, rate=1.0, ranks_per_job=8)
        cpu = typical(daemons, args.seconds, args.rounds)
    finally:
        for d in daemons.values():
            d.stop()
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    this, old = statistics.median(cpu["this"]), statistics.median(cpu["baseline"])
    line = (
        f"`python bench/bench_serving.py --baseline {args.baseline} --typical --seconds {args.seconds:g} "
        f"--rounds {args.rounds}` ({time.strftime('%Y-%m-%d')}): daemon CPU, median of the rounds, this tree "
        f"{this:.1f} % vs {old:.1f} % ({this / old:.2f}x); rounds {cpu['this']} vs {cpu['baseline']}"
    )
    print(line)
    if args.markdown:
        args.markdown.write_text(line + "\n")


if __name__ == "__main__":
    main()
