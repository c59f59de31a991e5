"""The SDK's allocator view against torch's own figures, on a real GPU (issue 19's unmeasured part).

A rank that reports through the SDK to a running daemon makes an allocation pattern with a history: weights,
activations freed out of order (so the caching allocator keeps split blocks), a peak, a cache release, and
one allocation too large for the card (an allocation retry and an OOM). Then it goes quiet and reads, at
one moment, torch's ``memory_stats()``, the SDK's reader (what the next report carries), and, after that
report, the daemon's ``/v1/jobs/<job>``. It also times the reads: the C++ side of
``memory_stats_as_nested_dict()`` the SDK calls, ``memory_stats()``'s flattening, and the SDK's whole read.

    python bench/device/allocator_check.py --url http://127.0.0.1:9478 --out alloc.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
from pathlib import Path

import torch

from gpumon.client import Reporter
from gpumon.client.process.allocator import AllocatorReader
from gpumon.client.protocol import MEMORY_FIELDS


def timed(fn: object, n: int) -> float:
    """Mean seconds per call over n calls (after 20 warm-up calls)."""
    for _ in range(20):
        fn()  # type: ignore[operator]
    t = time.perf_counter()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - t) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:9478")
    p.add_argument("--job", default="alloc-check")
    p.add_argument("--out", type=Path, default=Path("alloc.json"))
    a = p.parse_args()
    reporter = Reporter(job=a.job, device=0, url=a.url, interval=0.5, dtype="bf16", flops_per_token=1e9)
    dev = torch.device("cuda:0")
    weights = [torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) for _ in range(16)]  # 512 MiB
    step = 0
    for size_mb in (64, 200, 33, 500, 7, 1024, 90, 300):  # activations of uneven sizes, freed out of order
        with reporter.forward_backward():
            acts = [torch.empty(size_mb << 20, dtype=torch.uint8, device=dev) for _ in range(6)]
            for w in weights[:4]:
                torch.mm(w, w)
            del acts[::2]
            torch.cuda.synchronize()
        step += 1
        reporter.step(tokens=1000)
        keep = acts  # the odd ones live on into the next step: holes in the cached segments
        del keep
    torch.cuda.empty_cache()  # reserved falls back; the peaks stay
    oom = None
    try:  # larger than the card: the allocator frees its cache, retries (num_alloc_retries) and raises
        torch.empty(1 << 40, dtype=torch.uint8, device=dev)
    except torch.cuda.OutOfMemoryError as exc:
        oom = str(exc).splitlines()[0][:200]
    for _ in range(3):
        with reporter.forward_backward():
            acts = [torch.empty(100 << 20, dtype=torch.uint8, device=dev) for _ in range(3)]
            del acts[1]
            torch.cuda.synchronize()
        step += 1
        reporter.step(tokens=1000)
    # quiet from here: nothing allocates, so torch's figures and the next report's are of the same state
    torch.cuda.synchronize()
    truth = torch.cuda.memory_stats(0)
    reader = AllocatorReader(0, None)
    sdk = reader.read() or {}
    time.sleep(2.0)  # at least two reports at 0.5 s carry the quiet state
    reporter.close()
    time.sleep(0.5)
    with urllib.request.urlopen(f"{a.url}/v1/jobs/{a.job}", timeout=10) as r:
        served = json.load(r)
    with urllib.request.urlopen(f"{a.url}/metrics", timeout=10) as r:
        wanted = ("gpumon_training_allocator_", "gpumon_process_memory_used_bytes")
        exposition = [line for line in r.read().decode().splitlines() if line.startswith(wanted)]
    compare = {wire: {"torch": truth.get(key), "sdk": sdk.get(wire)} for wire, key in MEMORY_FIELDS.items()}
    out = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "pid": os.getpid(),
        "oom": oom,
        "compare": compare,
        "equal": all(v["torch"] == v["sdk"] for v in compare.values()),
        "seconds_per_call": {
            "memory_stats_as_nested_dict": timed(lambda: torch.cuda.memory_stats_as_nested_dict(0), 2000),
            "memory_stats": timed(lambda: torch.cuda.memory_stats(0), 2000),
            "sdk_read": timed(reader.read, 2000),
        },
        "device_memory_used": getattr(torch.cuda, "device_memory_used", lambda _: None)(0),
        "served": served,
        "exposition": exposition,
    }
    a.out.write_text(json.dumps(out, indent=1, default=str))
    shown = ("device", "oom", "compare", "equal", "seconds_per_call")
    print(json.dumps({k: out[k] for k in shown}, indent=1))


if __name__ == "__main__":
    main()
