"""gpumon serve: the daemon."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import ipaddress
import logging
import os
import signal
import sys
from socket import AF_UNIX
from typing import TYPE_CHECKING, Any

from gpumon import __version__
from gpumon.cli.common import open_sampler
from gpumon.config import DEFAULT_PORT, ConfigError, Settings
from gpumon.gpu.compat_dcgm import node_hostname
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml
from gpumon.gpu.snapshot import Snapshot
from gpumon.heap import Heap, Trimmer
from gpumon.web.listen import MarkUnixSocket, bind, bind_unix

if TYPE_CHECKING:
    import socket

    import uvicorn

    from gpumon.gpu.sim.ranks import SimTraining
    from gpumon.web.connections import Gate
    from gpumon.web.guard import Guard

log = logging.getLogger("gpumon")


EXPOSES = True  # the only command with a /metrics: its shaping options (--collect, --compat, ...) are its


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"address to serve on (default 0.0.0.0:{DEFAULT_PORT}; port 0 picks a free one)",
    )
    p.add_argument("--interval", metavar="DURATION", help="time between sampling sweeps (default 1s)")
    p.add_argument(
        "--web-config",
        metavar="PATH",
        help="TLS and basic auth for the listener: an exporter-toolkit web-config.yml (docs/deploy.md)",
    )
    p.add_argument(
        "--node-name",
        metavar="NAME",
        help="this node's name in gpumon_node_info{node} (default: the host name; Kubernetes: spec.nodeName)",
    )
    c = p.add_argument_group("connections (docs/reliability.md)")
    c.add_argument(
        "--header-timeout",
        metavar="DURATION",
        help="close a connection whose request headers take longer (10s)",
    )
    c.add_argument(
        "--request-timeout",
        metavar="DURATION",
        help="close a connection whose whole request takes longer (30s)",
    )
    c.add_argument(
        "--max-connections",
        metavar="N",
        help="open connections at most; past it the newest idle one is closed (1024, and below the fd limit)",
    )
    t = p.add_argument_group("training telemetry (docs/training.md)")
    t.add_argument(
        "--ingest",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="accept SDK reports on POST /v1/report (on)",
    )
    t.add_argument("--ingest-token", metavar="TOKEN", help="require this bearer token on every report")
    t.add_argument("--ingest-socket", metavar="PATH", help="also accept reports on this unix socket")
    t.add_argument(
        "--ingest-allow-remote",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="accept reports from other hosts, not only loopback and the unix socket (off)",
    )
    t.add_argument(
        "--nccl-inspector-dir",
        metavar="PATH",
        help="read NCCL Inspector dumps here (the jobs' NCCL_INSPECTOR_DUMP_DIR) and join them to the ranks",
    )
    t.add_argument("--rank-ttl", metavar="DURATION", help="drop a rank silent this long (default 60s)")
    t.add_argument("--rate-window", metavar="DURATION", help="window of tokens/s and diagnosis (default 60s)")
    t.add_argument(
        "--counter-hold",
        metavar="DURATION",
        help="a restart's (or another rare event's) new counter shows 0 this long before its value, so that "
        "increase() sees it: longer than every scraper's interval (default 60s)",
    )
    t.add_argument("--max-jobs", metavar="N", help="jobs tracked at most; more get 429 (default 32)")
    t.add_argument("--max-ranks", metavar="N", help="ranks tracked at most; more get 429 (default 256)")
    t.add_argument(
        "--peak-tflops",
        metavar="[DTYPE=]TFLOPS,...",
        help="per-GPU dense peak for MFU where the table lacks the GPU, e.g. 989.5 or bf16=989.5,fp8=1979",
    )
    t.add_argument(
        "--baselines",
        metavar="PATH",
        help="the baseline library (default /var/lib/gpumon/baselines.toml as root, else "
        "~/.local/share/gpumon/baselines.toml; docs/baselines.md)",
    )
    t.add_argument(
        "--threshold",
        dest="thresholds",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a diagnosis threshold, e.g. data_wait_share=0.2 (repeatable; see docs/training.md)",
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gpumon.web.server import (
        create_app,  # here, not at module level: snapshot and doctor need no web stack
    )

    # The event loop shares the GIL with the sampler's threads; with the default 5 ms switch interval a sweep
    # can hold a scrape back for several slices. 1 ms roughly halves /metrics p99 (docs/performance.md).
    sys.setswitchinterval(0.001)
    from gpumon.jobs.service import from_settings

    guard = _access(settings)  # first of all: a bad web config or certificate is a configuration error
    heap = Heap()
    heap.tune()  # before the sampler and the server start their threads
    tls = guard is not None and guard.ssl_context is not None
    sock = bind(settings.listen)  # first: a busy port should fail before NVML takes seconds to start
    sockets = [sock]
    unix_path = settings.ingest_socket if settings.ingest else None
    if unix_path:
        try:
            sockets.append(bind_unix(unix_path))
        except Exception:
            sock.close()
            raise
    # a daemon on a GPU node outlives the driver loading late (the GPU operator installs it after boot)
    sampler = open_sampler(settings, "serve", wait=True)
    backend = sampler.backend.name

    def source() -> Snapshot | None:
        return sampler.snapshot

    gate = _gate(settings)
    training = from_settings(settings, source) if settings.ingest else None
    if training is not None:
        sampler.listeners.append(training.observe)  # GPU windows get every sweep, job history every 10 s
        sim = getattr(sampler.backend, "nv", None)
        if isinstance(sim, SimNvml):  # a loop reporting on a simulated GPU drives it (gpu/sim/driven.py)
            training.analysis.store.listeners.append(sim.driver.observe)
    app = create_app(
        source,
        sampler.alive,
        backend=backend,
        owner_labels=settings.owner_labels,
        details=settings.details,
        compat_host_label=settings.compat_hostname_label,
        compat=settings.compat,
        training=training,
        node=settings.node_name or node_hostname(),
        guard=guard,
        max_age=settings.interval,
        connections=gate,
        fresh=sampler.fresh,
        counter_hold=settings.counter_hold,
    )
    sampler.start()
    if training is not None and training.nccl is not None:
        training.nccl.start()
        log.info("reading NCCL Inspector dumps in %s", training.nccl.path)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "gpumon %s: %d GPU(s) via %s, sampling every %gs; listening on %s://%s:%d/metrics",
        __version__,
        sampler.gpu_count(),
        backend,
        settings.interval,
        "https" if tls else "http",
        shown,
        port,
    )
    if settings.ingest and settings.ingest_allow_remote and not settings.ingest_token:
        log.warning(
            "--ingest-allow-remote without --ingest-token: any host that reaches this port can report "
            "training data; set a token"
        )
    if settings.ingest:
        log.info(
            "training reports accepted on POST /v1/report from %s%s%s",
            "any host" if settings.ingest_allow_remote else "loopback",
            f" and unix:{settings.ingest_socket}" if settings.ingest_socket else "",
            " with a bearer token" if settings.ingest_token else "",
        )
    if tls and settings.ingest and not settings.ingest_socket:
        log.warning(
            "the listener serves TLS, so SDK reports over loopback need GPUMON_URL=https://… and a trusted "
            "certificate; give --ingest-socket and point the SDK at unix://PATH instead"
        )
    if guard is not None and guard.config.users:
        log.info(
            "basic auth required for %d user(s) (/healthz, /readyz and SDK reports are exempt)",
            len(guard.config.users),
        )
    # a replay was announced as the capture was opened (common.replayed_backend), with what it holds
    if backend == "sim":
        log.warning(
            'these are SIMULATED GPUs: every number served is made up (gpumon_build_info{backend="sim"})'
        )
    config = _uvicorn_config(app, gate)
    config.ssl = guard.ssl_context if guard is not None else None  # TCP only: see _server
    sim_training = _sim_training(sampler, settings, sock)
    # uvicorn handles SIGTERM while serving, then restores the previous handler and raises the signal again;
    # with the default handler that would kill the process before the sampler and NVML are shut down
    previous = signal.signal(signal.SIGTERM, _stop_requested)
    try:
        _server(config, gate, sim_training, guard, Trimmer(heap)).run(sockets=sockets)
    except KeyboardInterrupt:
        # uvicorn stops on SIGINT as on SIGTERM, then raises it again with Python's own handler: Ctrl-C on a
        # serving daemon is a stop asked for (exit 0), as SIGTERM is
        _stop_requested(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if sim_training is not None:
            sim_training.stop()  # already done unless the server failed to start or stop
        sampler.stop()
        if training is not None and training.nccl is not None:
            training.nccl.stop()
        for s in sockets:
            s.close()
        if unix_path:
            with contextlib.suppress(OSError):
                os.unlink(unix_path)
    log.info("gpumon stopped")
    return 0


def _access(settings: Settings) -> Guard | None:
    if not settings.web_config:
        return None
    from gpumon.web import webconfig
    from gpumon.web.guard import Guard
    from gpumon.web.tls import server_context

    web = webconfig.load(settings.web_config)
    ctx = server_context(web.tls, f"web config {web.path}: tls_server_config") if web.tls else None
    if ctx is not None and settings.sim_jobs and not settings.ingest_socket:
        raise ConfigError(
            "--sim-job with a TLS listener needs --ingest-socket: the simulated ranks report over the unix "
            "socket, not over TLS"
        )
    if not web.http2:
        log.debug("http_server_config.http2: false (gpumon serves HTTP/1.1 in any case)")
    if any(name.lower() == "content-security-policy" for name, _ in web.headers):
        log.warning(
            "web config %s sets a Content-Security-Policy header: browsers enforce it beside the node page's "
            "own, and one stricter than the page's stops the page at / drawing (docs/deploy.md)",
            web.path,
        )
    return Guard(web, ctx)


def _sim_training(sampler: Sampler, settings: Settings, sock: socket.socket) -> SimTraining | None:
    """The --sim-job ranks, reporting to this daemon: over its unix socket when it has one, else loopback."""
    sim = getattr(sampler.backend, "nv", None)
    if not settings.sim_jobs:
        return None
    if not isinstance(sim, SimNvml):
        log.warning("--sim-job ignored: these GPUs are real")
        return None
    from gpumon.gpu.sim.ranks import SimTraining

    if settings.ingest_socket:
        url = "unix://" + os.path.abspath(settings.ingest_socket)
    else:
        host, port = sock.getsockname()[:2]
        ip = ipaddress.ip_address(host)
        if ip.is_unspecified:
            ip = ipaddress.ip_address("::1" if ip.version == 6 else "127.0.0.1")
        url = f"http://[{ip}]:{port}" if ip.version == 6 else f"http://{ip}:{port}"
    return SimTraining(sim, url, settings.ingest_token)


def _gate(settings: Settings) -> Gate:
    from gpumon.web.connections import Gate, Limits, connection_cap, raise_fd_limit

    fds = raise_fd_limit()
    lanes = 2 if settings.ingest and settings.ingest_socket else 1  # the unix socket has a lane of its own
    cap = connection_cap(settings.max_connections, fds, lanes)
    if cap < settings.max_connections:
        log.info(
            "at most %d open connections (--max-connections %d lowered: the fd limit is %d; raise it with "
            "LimitNOFILE=, ulimit -n or the container runtime)",
            cap,
            settings.max_connections,
            fds,
        )
    limits = Limits(
        settings.header_timeout,
        settings.request_timeout,
        max_connections=cap,
        max_unix_connections=cap if lanes == 2 else 0,
    )
    return Gate(limits)


def _uvicorn_config(app: Any, gate: Gate) -> uvicorn.Config:
    import uvicorn  # here, not at module level: snapshot and doctor do not need the web stack

    from gpumon.web.connections import guarded

    # proxy_headers off whatever FORWARDED_ALLOW_IPS says: uvicorn would otherwise let X-Forwarded-For rewrite
    # the client's address, and a remote report could then claim to be from loopback and pass the ingest rule
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=3,
        proxy_headers=False,
        # gpumon has no WebSocket routes; with a WebSocket library importable, uvicorn would hand an upgrade
        # request's connection to another protocol, whose close the connection gate never hears of
        ws="none",
        timeout_keep_alive=gate.limits.keep_alive,  # type: ignore[arg-type]  # a float works; int is its hint
    )
    config.load()
    # deadlines and the connection caps (connections.py): one gate, a lane for each of TCP and unix
    config.http_protocol_class = guarded(config.http_protocol_class, gate)
    return config


def _server(
    config: uvicorn.Config,
    gate: Gate,
    sim_training: SimTraining | None,
    guard: Guard | None,
    trimmer: Trimmer,
) -> uvicorn.Server:
    """A uvicorn server that starts the simulated ranks once it accepts their reports, and closes them (their
    final reports included) while it still does; its tick gives a burst's freed memory back (heap.py)."""
    import uvicorn

    # the same app and settings on the unix socket, with its requests marked as such (listen.py)
    unix_config = _uvicorn_config(MarkUnixSocket(config.app), gate)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            # uvicorn's startup with no sockets (its lifespan and state); the listeners are made here, since
            # uvicorn would put TLS (config.ssl) on every socket and gives no TLS handshake a deadline
            await super().startup(sockets=[])
            if not self.started:
                return
            loop = asyncio.get_running_loop()
            for sock in sockets or []:
                # the unix ingest socket stays plain HTTP, since the SDK in a training process has no
                # certificate to trust and the file mode guards it
                unix = sock.family == AF_UNIX
                tls = None if unix else self.config.ssl
                server = await loop.create_server(
                    functools.partial(self._protocol, unix_config if unix else self.config),
                    sock=sock,
                    backlog=self.config.backlog,
                    ssl=tls,
                    # a handshake happens before the connection gate sees the connection: a client that
                    # opens TLS and never says hello holds an fd for as long as this (asyncio's default: 60 s)
                    ssl_handshake_timeout=gate.limits.header_timeout if tls else None,
                )
                self.servers.append(server)
            if guard is not None:
                self._watch = asyncio.create_task(guard.watch())
            if sim_training is not None:
                sim_training.start()

        async def on_tick(self, counter: int) -> bool:
            trimmer.tick()
            return await super().on_tick(counter)

        def _protocol(self, config: uvicorn.Config) -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            watch = getattr(self, "_watch", None)
            if watch is not None:
                watch.cancel()
            if sim_training is not None:
                # in a thread: the final reports are answered by this very event loop
                await asyncio.to_thread(sim_training.stop)
            await super().shutdown(sockets=sockets)

    return Server(config)


def _stop_requested(signum: int, frame: object) -> None:
    log.info("stopping on signal %d", signum)
