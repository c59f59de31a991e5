"""What NVML costs gpumon on this node: calls per GPU per sweep, each op's latency, a sweep's wall time and
the sampler's CPU, from real NVML (or the simulator), or offline from a capture.

    python bench/bench_nvml.py [--seconds 20] [--simulate 8xH100-SXM] [--json out.json]
    python bench/bench_nvml.py --from-capture tests/fixtures/captures/h200-idle.json

Live, the sampler runs as ``gpumon serve`` runs it (events, processes, GPM), every op recorded through
gpumon's capture recorder. The figures of a real board go to docs/performance.md with the machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, NoReturn

import pynvml

from gpumon.gpu.capture import CaptureError, RecordingNvml, load
from gpumon.gpu.events import EventWatcher
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml

ASYNC_OPS = {"nvmlEventSetWait_v2"}  # the event thread's blocking wait is not sampling work


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def live(seconds: float, simulate: str | None) -> dict[str, Any]:
    recorder = RecordingNvml(SimNvml(simulate) if simulate else pynvml)
    backend = NvmlBackend(recorder)
    sampler = Sampler(backend, interval=1.0, timeout=0.5)
    sampler.events = EventWatcher(recorder, sampler.devices)
    sampler.open()
    sampler.events.start()
    for _ in range(2):  # capabilities settle: the second sweep takes every fallback the first found
        sampler.sweep()
        time.sleep(0.2)
    first = len(recorder.calls)
    walls: list[float] = []
    cpu0, t0 = _cpu(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        started = time.monotonic()
        sampler.sweep()
        walls.append(time.monotonic() - started)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    cpu = (_cpu() - cpu0) / (time.monotonic() - t0)
    gpus = len(sampler.devices())
    driver = backend.driver_info()
    sampler.stop()
    out = summarise(recorder.calls[first:], sweeps=len(walls), gpus=gpus)
    out.update(
        source="sim" if simulate else "nvml",
        driver=f"{driver.driver_version} (CUDA {driver.cuda_driver_version})",
        sweep_wall_seconds_p50=statistics.median(walls),
        sweep_wall_seconds_max=max(walls),
        sampler_cpu_seconds_per_second=cpu,
    )
    return out


def summarise(calls: list[dict[str, Any]], *, sweeps: int, gpus: int) -> dict[str, Any]:
    latency: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        us = c.get("latency_us")
        if c["op"] not in ASYNC_OPS and type(us) in (int, float):
            latency[c["op"]].append(float(us))
    counted = sum(len(v) for v in latency.values())
    ops = {
        op: {
            "calls_per_sweep": len(v) / max(1, sweeps),
            "p50_us": statistics.median(v),
            "max_us": max(v),
            "errors": sum(1 for c in calls if c["op"] == op and "error" in c),
        }
        for op, v in sorted(latency.items(), key=lambda kv: -sum(kv[1]))
    }
    total_us = sum(sum(v) for v in latency.values())
    return {
        "gpus": gpus,
        "sweeps": sweeps,
        "calls_per_gpu_per_sweep": counted / max(1, sweeps) / max(1, gpus),
        "nvml_seconds_per_sweep": total_us / 1e6 / max(1, sweeps),
        "ops": ops,
    }


def _fail(message: str) -> NoReturn:
    print(f"bench_nvml: {message}", file=sys.stderr)
    raise SystemExit(2)


def from_capture(path: str) -> dict[str, Any]:
    try:
        capture = load(path)
    except CaptureError as exc:
        _fail(str(exc))
    calls = capture.calls
    sweeps = capture.meta.get("sweeps", 1)
    if type(sweeps) is not int or sweeps < 1:
        _fail(f'{path}: "sweeps" must be a whole number above 0, got {sweeps!r}')
    gpus = int(capture.first_value("nvmlDeviceGetCount") or 1)
    out = summarise(calls, sweeps=sweeps, gpus=gpus)
    out.update(source=f"capture {path} ({capture.summary()})")
    return out


def render(r: dict[str, Any]) -> str:
    lines = [
        f"source: {r['source']}; driver {r.get('driver', '-')}; {r['gpus']} GPU(s), {r['sweeps']} sweeps",
        f"NVML calls per GPU per sweep: {r['calls_per_gpu_per_sweep']:.1f}",
        f"NVML time per sweep (sum over calls, all GPUs): {r['nvml_seconds_per_sweep'] * 1e3:.2f} ms",
    ]
    if "sweep_wall_seconds_p50" in r:
        lines.append(
            f"sweep wall time p50 {r['sweep_wall_seconds_p50'] * 1e3:.2f} ms, max "
            f"{r['sweep_wall_seconds_max'] * 1e3:.2f} ms; "
            f"sampler CPU {r['sampler_cpu_seconds_per_second']:.4f} s/s"
        )
    lines += ["", "| op | calls/sweep | p50 µs | max µs | errors |", "|---|---:|---:|---:|---:|"]
    for op, o in r["ops"].items():
        lines.append(
            f"| {op} | {o['calls_per_sweep']:.1f} | {o['p50_us']:.1f} | {o['max_us']:.1f} | {o['errors']} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="sweeps at 1 s for this long (live)")
    p.add_argument("--simulate", metavar="SPEC", help="the simulator instead of real NVML")
    p.add_argument("--from-capture", metavar="PATH", help="summarise a capture instead of sampling")
    p.add_argument("--json", type=Path, help="also write the raw results here")
    a = p.parse_args()
    result = from_capture(a.from_capture) if a.from_capture else live(a.seconds, a.simulate)
    print(render(result))
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
