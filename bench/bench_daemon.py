"""Benchmarks for the daemon core; results go to docs/performance.md.

    python bench/bench_daemon.py [--seconds 15] [--requests 2000]

Measures, on this machine, with 8 simulated GPUs:
  1. sampler CPU per second of wall time at the default 1 s interval (fake NVML with zero latency,
     and the full simulator with dynamics);
  2. one sweep's wall time with realistic per-call latencies (1 ms per NVML call, 20 ms per PCIe throughput
     call), for GPUs with PCIe byte counters (H100) and without them (A100: the 20 ms fallback);
  3. /metrics latency p50/p99 over loopback against a real `gpumon serve` subprocess;
  4. the cost of our /metrics generation relative to a bare prometheus_client generate_latest over the same
     series, measured side by side in this run (a ratio, not an absolute).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpumon.gpu.attribution.owners import Attributor
from gpumon.gpu.attribution.proc import ProcessResolver
from gpumon.gpu.collector import SnapshotCollector, build_families
from gpumon.gpu.events import EventWatcher
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml
from gpumon.web.exposition import Renderer

ROOT = Path(__file__).resolve().parent.parent
REALISTIC = {"*": 0.001, "nvmlDeviceGetPcieThroughput": 0.020}


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "prometheus_client": version("prometheus-client"),
        "nvidia-ml-py": version("nvidia-ml-py"),
    }


def sampler_for(
    spec: str,
    *,
    static: bool,
    latency: dict[str, float] | None = None,
    interval: float = 1.0,
    deep: bool = True,
):
    """The sampler as ``gpumon serve`` builds it; ``deep=False`` leaves out GPM, processes and their
    owners, and the event watcher, to price them side by side."""
    sim = SimNvml(spec, seed=1, static=static, warmup=0 if static else 120.0)
    if latency:
        sim.faults.latency.update(latency)
    backend = NvmlBackend(sim, gpm=deep, processes=deep)
    sampler = Sampler(backend, interval=interval)
    sampler.open()
    if deep:
        atexit.register(sim.remove_proc_root)
        sampler.events = EventWatcher(sim, sampler.devices)
        sampler.attributor = Attributor(ProcessResolver(sim.proc_root()), sim.pod_owners)
    return sampler


def sampler_cpu(spec: str, *, static: bool, seconds: float, deep: bool = True) -> dict[str, float]:
    """CPU seconds the whole process spends per wall second while the sampler runs at a 1 s interval."""
    sampler = sampler_for(spec, static=static, deep=deep)
    sampler.sweep()  # first-sweep work (capability discovery) is not steady state
    sampler.start()
    time.sleep(1.5)
    cpu0, wall0, sweeps0 = time.process_time(), time.monotonic(), sampler.snapshot.sweep
    time.sleep(seconds)
    cpu1, wall1, sweeps1 = time.process_time(), time.monotonic(), sampler.snapshot.sweep
    sampler.stop()
    return {
        "cpu_percent_of_core": 100.0 * (cpu1 - cpu0) / (wall1 - wall0),
        "cpu_ms_per_sweep": 1000.0 * (cpu1 - cpu0) / max(1, sweeps1 - sweeps0),
        "sweeps": sweeps1 - sweeps0,
    }


def sweep_wall(
    spec: str, *, latency: dict[str, float] | None, n: int = 50, deep: bool = True
) -> dict[str, float]:
    sampler = sampler_for(spec, static=True, latency=latency, deep=deep)
    sampler.sweep()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        snap = sampler.sweep()
        times.append(time.perf_counter() - t0)
        assert all(g.up for g in snap.gpus), [g.down_reason for g in snap.gpus]
    sampler.stop()
    times.sort()
    return {
        "p50_ms": 1000 * statistics.median(times),
        "p90_ms": 1000 * times[int(len(times) * 0.9)],
        "max_ms": 1000 * times[-1],
    }


class Daemon:
    """``gpumon serve`` as a subprocess on an ephemeral loopback port."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpumon", "serve", "--listen", "127.0.0.1:0", *args],
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        found: list[str] = []
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                m = re.search(r"listening on (http://[\d.]+:\d+)", line)
                if m and not found:
                    found.append(m.group(1))
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        ready.wait(30)
        self.client = httpx.Client(base_url=found[0], timeout=5)
        while self.client.get("/readyz").status_code != 200:
            time.sleep(0.05)

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(10)


def percentiles(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        "p50_ms": 1000 * times[len(times) // 2],
        "p99_ms": 1000 * times[min(len(times) - 1, int(len(times) * 0.99))],
    }


def scrape(client: httpx.Client, headers: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = client.get("/metrics", headers=headers)
    elapsed = time.perf_counter() - t0
    assert r.status_code == 200
    return elapsed


FORMATS = {
    "text": {"Accept-Encoding": "identity"},
    "text+gzip": {"Accept-Encoding": "gzip"},
    "openmetrics": {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "identity"},
}


def metrics_latency(requests: int, runs: int, fresh: int) -> dict[str, object]:
    """Back-to-back scrapes (most reuse the families of the current snapshot), repeated to show the noise,
    and scrapes that each see a new snapshot, as Prometheus's do (a 15 s scrape, a 1 s sweep)."""
    out: dict[str, object] = {}
    for run in range(runs):
        d = Daemon("--simulate", "8xH100-SXM", "--sim-unreported-jobs")
        try:
            for name, headers in FORMATS.items():
                for _ in range(50):
                    scrape(d.client, headers)
                out[f"back_to_back_{name}_run{run + 1}"] = percentiles(
                    [scrape(d.client, headers) for _ in range(requests)]
                )
            if run == 0:
                body = d.client.get("/metrics", headers=FORMATS["text"]).content
                out["bytes"] = len(body)
                gz = d.client.get("/metrics", headers={"Accept-Encoding": "gzip"})
                out["bytes_gzip"] = gz.num_bytes_downloaded  # on the wire; .content is already inflated
                out["series"] = sum(len(f.samples) for f in text_string_to_metric_families(body.decode()))
        finally:
            d.close()
    d = Daemon("--simulate", "8xH100-SXM", "--sim-unreported-jobs", "--interval", "250ms")
    try:
        times = []
        for _ in range(fresh):
            time.sleep(0.26)  # past the next sweep: this scrape builds families from a new snapshot
            times.append(scrape(d.client, FORMATS["text"]))
        out["fresh_snapshot_text"] = percentiles(times)
    finally:
        d.close()
    return out


def bare_registry_like(text: str) -> CollectorRegistry:
    """A plain prometheus_client registry holding the same families, label sets and values."""
    registry = CollectorRegistry()
    for fam in text_string_to_metric_families(text):
        labels = sorted({k for s in fam.samples for k in s.labels})
        cls = Counter if fam.type == "counter" else Gauge
        metric = cls(fam.name, fam.documentation or fam.name, labels, registry=registry)
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            child = metric.labels(**{k: s.labels.get(k, "") for k in labels}) if labels else metric
            if cls is Counter:
                child.inc(s.value)
            else:
                child.set(s.value)
    return registry


def generation_ratio(rounds: int = 300) -> dict[str, float]:
    """Our /metrics body (collector + renderer) against a bare prometheus_client registry holding the same
    series, timed side by side in this run."""
    sampler = sampler_for("8xH100-SXM", static=False)
    snap = sampler.sweep()
    collector = SnapshotCollector(lambda: snap)
    ours = CollectorRegistry()
    ours.register(collector)
    bare = bare_registry_like(generate_latest(ours).decode())
    renderer = Renderer()

    def timed(fn) -> float:
        best = []
        for _ in range(5):  # best of 5 batches: the least disturbed estimate on a noisy machine
            t0 = time.perf_counter()
            for _ in range(rounds):
                fn()
            best.append((time.perf_counter() - t0) / rounds)
        return min(best)

    t_bare = timed(lambda: generate_latest(bare))
    t_lib = timed(lambda: generate_latest(ours))  # our collector, prometheus_client's encoder
    t_cached = timed(lambda: renderer.render(collector.collect(), openmetrics_format=False))
    t_fresh = timed(lambda: renderer.render(build_families(snap), openmetrics_format=False))
    sampler.stop()
    return {
        "bare_generate_latest_ms": 1000 * t_bare,
        "ours_via_generate_latest_ms": 1000 * t_lib,
        "ours_cached_ms": 1000 * t_cached,
        "ours_fresh_snapshot_ms": 1000 * t_fresh,
        "ratio_fresh_to_bare": t_fresh / t_bare,
        "ratio_cached_to_bare": t_cached / t_bare,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=15.0, help="wall time per sampler-CPU measurement")
    p.add_argument(
        "--requests", type=int, default=1000, help="/metrics requests per back-to-back measurement"
    )
    p.add_argument("--runs", type=int, default=3, help="daemon restarts for the back-to-back measurement")
    p.add_argument("--fresh", type=int, default=120, help="scrapes that each see a new snapshot")
    p.add_argument("--json", type=Path, help="also write the raw results here")
    args = p.parse_args()

    results = {"machine": machine()}
    results["cpu_fake_zero_latency"] = sampler_cpu("8xH100-SXM", static=True, seconds=args.seconds)
    results["cpu_sim_dynamics"] = sampler_cpu("8xH100-SXM", static=False, seconds=args.seconds)
    # deep telemetry (GPM, processes and owners, events) priced side by side with the core alone
    results["cpu_sim_dynamics_core_only"] = sampler_cpu(
        "8xH100-SXM", static=False, seconds=args.seconds, deep=False
    )
    results["sweep_realistic_h100_core_only"] = sweep_wall("8xH100-SXM", latency=REALISTIC, deep=False)
    results["sweep_zero_latency"] = sweep_wall("8xH100-SXM", latency=None)
    results["sweep_realistic_h100"] = sweep_wall("8xH100-SXM", latency=REALISTIC)
    results["sweep_realistic_a100_fallback"] = sweep_wall("8xA100", latency=REALISTIC)
    results["metrics_latency"] = metrics_latency(args.requests, args.runs, args.fresh)
    results["generation"] = generation_ratio()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
