"""What reading NCCL Inspector dumps costs the daemon: CPU per record read, a pass over a node's files with
nothing new, the diagnosis's window per rank, and what the read budget bounds. Results go to
docs/performance.md.

    python bench/bench_nccl.py [--records 20000]

Side by side in one run, on records written as the plugin writes them (tests/support/inspector.py):
  1. one pass that reads RECORDS new records from 8 files (an HGX node's 8 ranks): CPU per record, and the
     same records parsed without the directory (records.parse alone) for the reading's own share;
  2. a pass over the same 8 files when none grew (the daemon's pass every 5 s between dumps);
  3. the ledger's 60 s window for one rank (the diagnosis, per rank and evaluation), 200 passes kept;
  4. the CPU a second the 8 MiB budget per 5 s pass allows at most, from 1.'s figure.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.inspector import append, line, record  # noqa: E402

from gpumon.nccl import reader as R  # noqa: E402
from gpumon.nccl.ledger import NcclLedger  # noqa: E402
from gpumon.nccl.reader import InspectorReader  # noqa: E402
from gpumon.nccl.records import parse  # noqa: E402

PROCESSES = 8


def _write(directory: Path, per_process: int, start: int) -> int:
    size = 0
    for pid in range(1, PROCESSES + 1):
        recs = [
            record("node-1", pid, start + n, op=("AllReduce", "AllGather")[n % 2]) for n in range(per_process)
        ]
        size += append(directory, "node-1", pid, recs).stat().st_size
    return size


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=6_400, help="per round: within one pass's budget")
    a = p.parse_args()
    per = a.records // PROCESSES
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        r = InspectorReader(str(d), every=None)
        r.read_once()  # the first pass: files then present are read from their end
        rounds = []
        for k in range(3):
            written = _write(d, per, 1 + k * per)
            before = r.counts()[0]["counted"]
            t0 = time.process_time()
            r.read_once()
            rounds.append((time.process_time() - t0) / max(1, r.counts()[0]["counted"] - before))
            assert r.counts()[1] == 0, f"{written} bytes a round is over the budget: lower --records"
        counted = r.counts()[0]["counted"]
        t_idle = min(timeit.repeat(r.read_once, number=200, repeat=5)) / 200
        size = sum(f.stat().st_size for f in d.iterdir()) / counted
    raw = [line(record("node-1", 1, n)).rstrip(b"\n") for n in range(2000)]
    t_parse = min(timeit.repeat(lambda: [parse(x) for x in raw], number=5, repeat=5)) / 5 / len(raw)
    led = NcclLedger()
    # a pass every 5 s bringing 100 records of 2 operations: the window of 60 s holds 12 passes' points
    for n in range(20_000):
        led.add(parse(line(record("h", 1, n, op=("AllReduce", "AllGather")[n % 2]))), 1000.0 + 5 * (n // 100))
    end = 1000.0 + 5 * 199
    t_window = min(timeit.repeat(lambda: led.use("h", 1, end, 60.0), number=200, repeat=5)) / 200
    per_record = min(rounds)
    budget = R.BUDGET / size
    cpu = budget * per_record
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    print(f"machine: {machine}, Python {platform.python_version()}")
    print(f"records read: {counted} ({size:.0f} bytes each on disk)")
    shown = ", ".join(f"{x * 1e6:.1f}" for x in rounds)
    print(f"1. a pass reading new records: {per_record * 1e6:.1f} us CPU per record (rounds: {shown})")
    print(f"   records.parse alone: {t_parse * 1e6:.1f} us per record")
    print(f"2. a pass over 8 files, none grew: {t_idle * 1e6:.0f} us")
    print(f"3. one rank's 60 s window (200 passes kept, 2 operations): {t_window * 1e6:.0f} us")
    print(
        f"4. the budget: {R.BUDGET >> 20} MiB per {R.READ_EVERY:g} s pass = {budget:,.0f} records, "
        f"{cpu:.2f} s CPU per pass at most ({cpu / R.READ_EVERY:.1%} of a core)"
    )


if __name__ == "__main__":
    main()
