"""The diagnosis scenario suite (issue 28, item 6): how often, how soon and how steadily the daemon's verdict
is right, over labelled situations built from real SDK loops on simulated GPUs of real daemons.

    python bench/bench_diagnosis.py [--end 165] [--only NAME,NAME] [--markdown FILE] [--logs DIR]

tests/support/scenarios.py holds the scenarios and does the work (tests/e2e/test_diagnosis_scenarios.py runs
the same suite and asserts the targets): every scenario at once, on one simulated 24-GPU node (the README
walkthrough on a second daemon, started as the README starts it), polled every 2 s for about three minutes.
Prints the machine, a markdown table (scenario, expected verdict, accuracy after settling with the number of
polls scored, time to the right verdict from the onset, flaps per hour after it was first right, pass) with
totals, and each failing scenario's verdict timeline. Targets: right within 30 s, accuracy >= 0.9, no flaps.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_daemon import machine
from support import scenarios


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--end", type=float, default=scenarios.END, help="seconds the suite runs")
    p.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    p.add_argument("--markdown", type=Path, help="also write the report to this file")
    p.add_argument("--logs", type=Path, help="daemon and loop logs here (default: a temporary directory)")
    args = p.parse_args()
    chosen = [s for s in scenarios.SCENARIOS if not args.only or s.name in args.only.split(",")]
    if not chosen:
        p.error(f"no scenario named {args.only!r}; known: {', '.join(s.name for s in scenarios.SCENARIOS)}")
    started = time.monotonic()
    results = scenarios.run_suite(chosen, end=args.end, logdir=args.logs, say=print)
    m = machine()
    out = [
        f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, {m['os']}; "
        f"{len(chosen)} scenarios, {time.monotonic() - started:.0f} s wall clock.",
        "",
        scenarios.table(results),
    ]
    failing = scenarios.failures(results)
    if failing:
        out += ["", "Failing scenarios (time line from the onset; ✗: not what was expected):", "", failing]
    text = "\n".join(out)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
