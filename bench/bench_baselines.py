"""What baselines add to a scrape and to the sampling thread; results go to docs/performance.md.

    python bench/bench_baselines.py [--ranks 256] [--jobs 8] [--repeats 30]

In one process, side by side in this run, with 8 simulated H100s and ``--ranks`` ranks over ``--jobs`` jobs
(the default --max-ranks):
  1. the training collector's families, rendered, without a baseline library and with one that matches every
     job (its gauges, ratios and scaling reference): the ratio of the two;
  2. one job-history sample (what the sampler's thread does every 10 s for `gpumon baseline record`), as a
     share of the 10 s it recurs in.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_daemon import machine
from support.reports import report

from gpumon.baselines import library as B
from gpumon.baselines.history import INTERVAL, JobHistory
from gpumon.baselines.jobfigures import job_figures
from gpumon.baselines.watch import LibraryWatch
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml
from gpumon.jobs.analysis import Analysis
from gpumon.jobs.collector import IngestStats, TrainingCollector
from gpumon.jobs.report import parse
from gpumon.jobs.store import JobStore


def analysis(ranks: int, jobs: int, phases: dict[str, float] | None = None) -> Analysis:
    """8 simulated H100s and ``ranks`` ranks over ``jobs`` jobs, two reports each; ``phases`` as reported."""
    sampler = Sampler(NvmlBackend(SimNvml("8xH100-SXM", static=True)))
    sampler.open()
    snap = sampler.sweep()
    now = time.time()
    store = JobStore(max_jobs=jobs, max_ranks=ranks, ttl=600.0, window=60.0)
    per_job = ranks // jobs
    for j in range(jobs):
        for r in range(per_job):
            common = {
                "job": f"job-{j}",
                "rank": r,
                "world_size": per_job,
                "devices": [str(r % 8)],
                "incarnation": f"i{j}x{r}",
                "workload": f"model-{j}",
                "local_rank": r,
                "phases": phases or {},
            }
            for steps in (50, 100):  # two points: a step time in the window
                store.ingest(parse(report(steps, started=now - 10.0, **common)), now)
    sampler.stop()
    return Analysis(store, lambda: snap, clock=lambda: now)


def timed(fn, repeats: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    a = analysis(args.ranks, args.jobs)
    path = Path(tempfile.mkdtemp()) / "baselines.toml"
    entries = []
    for j in a.jobs():
        key = job_figures(j).key
        assert key is not None, job_figures(j).why_no_key
        entries.append(B.Baseline(f"b-{j.job}", key, B.Figures(1000.0, 1.0, 0.4, 2.0)))
    B.save(str(path), B.Library(tuple(entries)))

    def scrape(watch: LibraryWatch | None):  # type: ignore[no-untyped-def]
        registry = CollectorRegistry()
        registry.register(TrainingCollector(a, IngestStats(), watch))
        return lambda: generate_latest(registry)

    without = scrape(None)
    with_library = scrape(LibraryWatch(str(path)))
    assert b"gpumon_training_throughput_baseline_ratio" in with_library()
    plain, based = [], []
    for _ in range(args.repeats):  # interleaved, so drift on this noisy machine hits both alike
        plain += timed(without, 1)
        based += timed(with_library, 1)
    history = JobHistory()
    sample = timed(lambda: history.record(a.jobs(), time.time()), args.repeats)
    result = {
        "machine": machine(),
        "ranks": args.ranks,
        "jobs": args.jobs,
        "scrape_ms_without_library_p50": 1e3 * statistics.median(plain),
        "scrape_ms_with_library_p50": 1e3 * statistics.median(based),
        "scrape_ratio_with_over_without": statistics.median(based) / statistics.median(plain),
        "history_sample_ms_p50": 1e3 * statistics.median(sample),
        "history_share_of_its_interval": statistics.median(sample) / INTERVAL,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
