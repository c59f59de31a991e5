"""A training-shaped load for a real GPU that reports through gpumon's SDK, and its own count of the same.

Each step: a short data wait (sleep), then ``--matmuls`` bf16 products of NxN matrices. The script counts
its own FLOP/s and MFU over the same span the daemon uses (first step to last), so the daemon's tokens/s
and MFU on real hardware can be checked against an independent count.

    python bench/device/gpu_load.py --seconds 60 --out load.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from gpumon.client import Reporter


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--matmuls", type=int, default=50)
    p.add_argument("--data-wait", type=float, default=0.02, help="seconds of data wait per step")
    p.add_argument("--peak-flops", type=float, default=989.4e12, help="the GPU's dense bf16 peak")
    p.add_argument("--out", type=Path, default=Path("load.json"))
    a = p.parse_args()
    n, k = a.n, a.matmuls
    a_m = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b_m = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    hold = torch.empty(16 << 30, dtype=torch.uint8, device="cuda")  # 16 GiB resident: a visible footprint
    # a "token" is one row of the product: 2·n² FLOPs per product
    reporter = Reporter(job="h200-matmul", device=0, dtype="bf16", flops_per_token=2.0 * n * n, interval=1.0)
    steps, tokens = 0, 0
    first = last = None
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        with reporter.data_wait():
            time.sleep(a.data_wait)
        with reporter.forward_backward():
            for _ in range(k):
                torch.mm(a_m, b_m)
            torch.cuda.synchronize()
        reporter.step(tokens=n * k)
        now = time.time()
        first = first or now
        last = now
        steps += 1
        tokens += n * k
    reporter.close()
    span = (last - first) if first and last else 0.0
    counted = tokens - n * k  # tokens after the first step, over the span first → last
    flops = counted * 2.0 * n * n
    out = {
        "steps": steps,
        "span_seconds": span,
        "tokens_per_second": counted / span if span else None,
        "tflops": flops / span / 1e12 if span else None,
        "mfu": flops / span / a.peak_flops if span else None,
        "device": torch.cuda.get_device_name(0),
        "held_bytes": hold.numel(),
    }
    a.out.write_text(json.dumps(out, indent=2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
