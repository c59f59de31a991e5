"""gpumon estimate: per-GPU memory and FLOPs per token of training a transformer, from its shape.

Optionally (``--job``) set against what a running job's GPUs actually hold, as the local daemon reports it.
The formulas and their sources are in gpumon/estimate/ (breakdown.py, memory.py, activations.py) and
docs/estimate.md. The command's parts: estimate_args.py (flags), estimate_job.py (--job), estimate_render.py
(text output).
"""

from __future__ import annotations

import argparse
import json

from gpumon.cli.daemon_api import default_url
from gpumon.cli.estimate_args import add_arguments, model_spec, setup
from gpumon.cli.estimate_job import compare, fetch_job, fetch_timeout
from gpumon.cli.estimate_render import render, render_comparison
from gpumon.config import ConfigError, Settings
from gpumon.estimate.breakdown import estimate, estimate_json

USES_GPUS = False  # arithmetic, and a daemon's API for --job: no GPU options

# what gpumon.cli and the tests use from here
__all__ = ["add_arguments", "fetch_job", "run"]


def run(settings: Settings, args: argparse.Namespace) -> int:
    spec = model_spec(args)
    st = setup(args)
    try:
        est = estimate(spec, st)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    comparison = None
    url = args.daemon_url or default_url()
    if args.job is not None:
        timeout = fetch_timeout(args.fetch_timeout)
        comparison = compare(est, args.job, fetch_job(url, args.job, timeout))
    if args.json:
        out = estimate_json(est)
        if comparison is not None:
            out["job"] = comparison
        print(json.dumps(out, indent=2))
    else:
        print(render(est, args))
        if comparison is not None:
            print()
            print(render_comparison(comparison, url))
    return 0
