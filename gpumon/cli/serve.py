"""gpumon serve: the daemon."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from gpumon import __version__
from gpumon.cli.common import open_sampler
from gpumon.config import DEFAULT_PORT, Settings
from gpumon.listen import bind

log = logging.getLogger("gpumon")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"address to serve on (default 0.0.0.0:{DEFAULT_PORT}; port 0 picks a free one)",
    )
    p.add_argument("--interval", metavar="DURATION", help="time between sampling sweeps (default 1s)")


def run(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn  # here, not at module level: snapshot and doctor do not need the web stack

    from gpumon.server import create_app

    # The event loop shares the GIL with the sampler's threads; with the default 5 ms switch interval a sweep
    # can hold a scrape back for several slices. 1 ms roughly halves /metrics p99 (docs/performance.md).
    sys.setswitchinterval(0.001)
    sock = bind(settings.listen)  # first: a busy port should fail before NVML takes seconds to start
    sampler = open_sampler(settings, "serve")
    backend = sampler.backend.name
    app = create_app(
        lambda: sampler.snapshot,
        sampler.alive,
        backend=backend,
        owner_labels=settings.owner_labels,
        compat=settings.compat,
    )
    sampler.start()
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "gpumon %s: %d GPU(s) via %s, sampling every %gs; listening on http://%s:%d/metrics",
        __version__,
        sampler.gpu_count(),
        backend,
        settings.interval,
        shown,
        port,
    )
    if backend == "sim":
        log.warning(
            'these are SIMULATED GPUs: every number served is made up (gpumon_build_info{backend="sim"})'
        )
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="off", timeout_graceful_shutdown=3
    )
    # uvicorn handles SIGTERM while serving, then restores the previous handler and raises the signal again;
    # with the default handler that would kill the process before the sampler and NVML are shut down
    previous = signal.signal(signal.SIGTERM, _stop_requested)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
        sampler.stop()
        sock.close()
    log.info("gpumon stopped")
    return 0


def _stop_requested(signum: int, frame: object) -> None:
    log.info("stopping on signal %d", signum)
