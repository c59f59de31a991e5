"""What the NICs cost a node: sysfs parsing per port, a sweep's CPU with and without them, the diagnosis's
NIC window per rank, and the series. Results go to docs/performance.md.

    python bench/bench_nics.py [--sweeps 300]

Side by side in one run, on 8 simulated H100s (zero-latency simulated NVML, so the NICs' share shows):
  1. read_ports over the captured real trees (tests/fixtures/sysfs), per port, default and nic-detail;
  2. CPU per sweep: no NICs, the simulated HGX node's 8 NDR ports (read in line every sweep), and a captured
     tree read in line (the daemon reads a real tree on its own thread every 5 s; in line is the worst case);
  3. NicHistory: observing a reading of 8 ports, and one rank's window over them;
  4. the NIC series a scrape serves, default and nic-detail.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import timeit
from pathlib import Path

from gpumon.gpu.collector import build_families
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml
from gpumon.net.history import NicHistory
from gpumon.net.rdma import read_ports
from gpumon.net.reader import NicReader
from gpumon.net.simulated import SimNics

ROOT = Path(__file__).resolve().parent.parent
TREES = ROOT / "tests" / "fixtures" / "sysfs"


def _per_port(tree: Path, detail: bool, number: int = 200) -> tuple[int, float]:
    ports = len(read_ports(str(tree), detail=detail))
    seconds = min(timeit.repeat(lambda: read_ports(str(tree), detail=detail), number=number, repeat=5))
    return ports, seconds / number / max(1, ports)


def _sampler(nics: str | None) -> tuple[Sampler, SimNvml]:
    sim = SimNvml("8xH100-SXM", seed=0, warmup=120.0, unreported_jobs=True)
    sampler = Sampler(NvmlBackend(sim), interval=1.0, timeout=1.0)
    if nics == "sim":
        sampler.nics = NicReader(SimNics(sim.gpus, sim.now))
    elif nics is not None:
        sampler.nics = NicReader(nics)
    sampler.open()
    return sampler, sim


def _cpu_per_sweep(nics: str | None, sweeps: int) -> float:
    sampler, _ = _sampler(nics)
    try:
        for _ in range(5):
            sampler.sweep()
        t0 = time.process_time()
        for _ in range(sweeps):
            sampler.sweep()
        return (time.process_time() - t0) / sweeps
    finally:
        sampler.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweeps", type=int, default=300)
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}")  # fmt: skip

    print("\n1. read_ports per port (captured trees)")
    for tree in sorted(p for p in TREES.iterdir() if p.is_dir()):
        for detail in (False, True):
            ports, cost = _per_port(tree, detail)
            print(f"   {tree.name:15} {'nic-detail' if detail else 'default':10} {ports} ports  "
                  f"{cost * 1e3:.3f} ms/port")  # fmt: skip

    print(f"\n2. CPU per sweep, 8 simulated H100s, {args.sweeps} sweeps each, interleaved 3 rounds")
    kinds = {
        "no NICs": None,
        "8 simulated NDR ports": "sim",
        "captured tree (procfs), in line": str(TREES / "procfs"),
    }
    results: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(3):
        for name, nics in kinds.items():
            results[name].append(_cpu_per_sweep(nics, args.sweeps))
    base = statistics.median(results["no NICs"])
    for name, values in results.items():
        m = statistics.median(values)
        print(f"   {name:34} {m * 1e3:7.3f} ms CPU/sweep  ({m / base:.2f}x)")

    print("\n3. NicHistory, 8 ports")
    sampler, _ = _sampler("sim")
    try:
        snaps = []
        for _ in range(13):
            snaps.append(sampler.sweep())
    finally:
        sampler.stop()
    history = NicHistory()
    t_obs = []
    for s in snaps:
        t0 = time.perf_counter()
        history.observe(s, 60.0)
        t_obs.append(time.perf_counter() - t0)
    now = snaps[-1].nics_at or 0.0
    use = (
        min(timeit.repeat(lambda: history.use(["mlx5_0", "mlx5_1"], now, 60.0), number=2000, repeat=5)) / 2000
    )
    print(
        f"   observe a reading: {statistics.median(t_obs) * 1e6:.0f} us;",
        f"one rank's window: {use * 1e6:.0f} us",
    )

    print("\n4. series of 8 simulated ports")
    for details in (frozenset(), frozenset({"nic-detail"})):
        n = sum(
            len(f.samples)
            for f in build_families(snaps[-1], details=details)
            if f.name.startswith("gpumon_nic")
        )
        a = sum(
            len(f.samples)
            for f in build_families(snaps[-1], details=details)
            if f.name == "gpumon_gpu_nic_affinity_info"
        )
        kind = "nic-detail" if details else "default"
        print(f"   {kind:10} {n} NIC series (a one-off build serves every counter), {a} affinity series")


if __name__ == "__main__":
    main()
