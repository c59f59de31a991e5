"""What one render costs per series: the GPU flow's families against the training flow's, side by side.

    python bench/bench_render.py [--ranks 256] [--per-job 8] [--repeats 40] [--profile]

In one process, with 8 simulated H100s and ``--ranks`` ranks in jobs of ``--per-job`` (the default
--max-ranks, 32 jobs of 8), each render as the daemon makes it (gpumon/web/scrape.py): the families built
from scratch (the GPU collector's for a new snapshot; the training collector's analysis and families, made
per render) and written by the daemon's renderer. The two alternate, so drift on a noisy machine hits both;
the figure is CPU time per series (time.thread_time), and the ratio is training over GPU.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bench_baselines import analysis
from bench_daemon import machine

from gpumon.gpu.collector import build_families
from gpumon.gpu.snapshot import Snapshot
from gpumon.jobs.analysis import Analysis
from gpumon.jobs.collector import IngestStats, TrainingCollector
from gpumon.web.exposition import Renderer


def node(ranks: int, per_job: int) -> tuple[Snapshot, Analysis]:
    a = analysis(ranks, ranks // per_job, phases={"forward": 3.0, "backward": 5.0, "data_wait": 0.5})
    snap = a.source()
    assert snap is not None
    return snap, a


def series(families: list) -> int:  # type: ignore[type-arg]
    return sum(len(f.samples) for f in families)


def cpu(fn: Callable[[], object]) -> float:
    t = time.thread_time()
    fn()
    return time.thread_time() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--per-job", type=int, default=8)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--profile", action="store_true", help="also print the training render's top functions")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    snap, analysis = node(args.ranks, args.per_job)
    training = TrainingCollector(analysis, IngestStats())
    gpu_renderer, training_renderer = Renderer(), Renderer()

    def gpu() -> bytes:
        return gpu_renderer.render(build_families(snap), openmetrics_format=False)

    def jobs() -> bytes:
        return training_renderer.render(training.collect(), openmetrics_format=False)

    n_gpu, n_training = series(build_families(snap)), series(list(training.collect()))
    gpu(), jobs()  # first renders format every series' name and labels; later ones reuse them
    gpu_s, training_s = [], []
    for _ in range(args.repeats):
        gpu_s.append(cpu(gpu))
        training_s.append(cpu(jobs))
    per_gpu = statistics.median(gpu_s) / n_gpu
    per_training = statistics.median(training_s) / n_training
    result = {
        "machine": machine(),
        "ranks": args.ranks,
        "gpu_series": n_gpu,
        "training_series": n_training,
        "gpu_render_ms_p50": 1e3 * statistics.median(gpu_s),
        "training_render_ms_p50": 1e3 * statistics.median(training_s),
        "gpu_us_per_series": 1e6 * per_gpu,
        "training_us_per_series": 1e6 * per_training,
        "training_over_gpu_per_series": per_training / per_gpu,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(lambda: [jobs() for _ in range(10)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
