"""Options every command shares, and opening the backend they ask for."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
from collections.abc import Callable
from typing import Any

import pynvml

from gpumon.config import DEFAULT_SIMULATION, Settings
from gpumon.gpu.attribution.kubelet import PodResources
from gpumon.gpu.attribution.owners import Attributor
from gpumon.gpu.attribution.proc import ProcessResolver
from gpumon.gpu.capture import CaptureError, ReplayNvml, load
from gpumon.gpu.dcgm import DcgmSource
from gpumon.gpu.events import EventWatcher
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml
from gpumon.gpu.types import BackendUnavailable
from gpumon.metrics.registry import DETAILS
from gpumon.net.reader import READ_EVERY, NicReader
from gpumon.net.simulated import SimNics

log = logging.getLogger("gpumon")


def add_common_options(
    p: argparse.ArgumentParser, *, gpus: bool = True, exposition: bool = False, log_level: str = "info"
) -> None:
    """--config and --log-level for every command; the GPU source and telemetry options for those that
    sample GPUs (diagnose and estimate only talk to a daemon or do arithmetic); what shapes /metrics only
    for the command that serves it. A command's --help lists only what it uses."""
    o = p.add_argument_group("general")
    o.add_argument("--config", metavar="PATH", help="TOML config file (also GPUMON_CONFIG)")
    o.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help=f"default: {log_level}")
    if not gpus:
        return
    o.add_argument(
        "--timeout",
        metavar="DURATION",
        help="deadline for reading one GPU in a sweep (default: half the interval)",
    )
    g = p.add_argument_group("GPU source")
    g.add_argument(
        "--backend",
        choices=("auto", "nvml", "sim"),
        help="auto (default): NVML when an NVIDIA driver is present; nvml: require it; sim: simulate",
    )
    g.add_argument(
        "--simulate",
        metavar="SPEC",
        help=f"serve simulated GPUs, e.g. {DEFAULT_SIMULATION} or 4xH100-SXM,2xL4 (implies --backend sim)",
    )
    g.add_argument(
        "--simulate-if-no-gpu",
        metavar="SPEC",
        help="with --backend auto: use NVML when a driver is present, otherwise simulate SPEC "
        '(logged loudly and labelled backend="sim")',
    )
    g.add_argument(
        "--replay",
        metavar="PATH",
        help="answer NVML calls from a capture (gpumon doctor --capture) instead of this node's GPUs "
        '(logged loudly and labelled backend="replay"; see docs/captures.md)',
    )
    g.add_argument("--seed", type=str, metavar="N", help="seed for the simulator (default 0)")
    g.add_argument(
        "--sim-fault",
        dest="sim_faults",
        action="append",
        default=[],
        metavar="FAULT",
        help="inject a simulator fault, e.g. lost:3@10+30 or hang:2:nvmlDeviceGetTemperature@5 "
        "(repeatable; see docs/simulator.md)",
    )
    g.add_argument(
        "--sim-job",
        dest="sim_jobs",
        action="append",
        default=[],
        metavar="SPEC",
        help="run a simulated training job on simulated GPUs, its ranks reporting through the SDK: "
        "NAME:GPUS[:FIRST_RANK/WORLD_SIZE], e.g. llama-70b:0-7:8/24 (repeatable; see docs/simulator.md)",
    )
    g.add_argument(
        "--sim-unreported-jobs",
        action="store_const",
        const=True,
        default=None,
        help="GPUs without a --sim-job run a sequence of 20-60 min jobs that do not report to gpumon "
        "(processes and load only) instead of idling (see docs/simulator.md)",
    )
    g.add_argument(
        "--sim-speed",
        metavar="FACTOR",
        help="run simulated time FACTOR times faster than real time (default 1; up to 10000): jobs, faults "
        "and XIDs follow it, e.g. --sim-speed 480 plays a simulated day in 3 minutes",
    )
    t = p.add_argument_group("deep telemetry")
    t.add_argument(
        "--events",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="watch NVML events and XIDs (on)",
    )
    t.add_argument(
        "--processes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="per-process GPU use with container, pod, Slurm job and user (on)",
    )
    t.add_argument(
        "--profiling",
        choices=("auto", "gpm", "dcgm", "off"),
        help="profiling counters: auto (default) uses DCGM when reachable, else NVML GPM on Hopper+",
    )
    t.add_argument("--dcgm-address", metavar="HOST:PORT", help="an nv-hostengine to read (default: embedded)")
    t.add_argument(
        "--kubelet-socket", metavar="PATH", help="kubelet pod-resources socket ('' to turn pod lookups off)"
    )
    t.add_argument("--proc-root", metavar="PATH", help="the host's /proc (default /proc)")
    t.add_argument(
        "--nics",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the RDMA NICs' traffic, state and errors from /sys/class/infiniband (on)",
    )
    t.add_argument(
        "--sys-root",
        metavar="PATH",
        help="the host's /sys (default /sys; with simulated or replayed GPUs, NICs are read only from a tree "
        "named here)",
    )
    if not exposition:
        return
    x = p.add_argument_group("the exposition (/metrics)")
    x.add_argument(
        "--owner-labels",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add the owning pod or Slurm job as labels on every per-GPU series (off)",
    )
    x.add_argument("--compat", choices=("dcgm",), help="also emit dcgm-exporter metric names and units")
    x.add_argument(
        "--compat-hostname-label",
        choices=("Hostname", "hostname"),
        help="spelling of the host label on --compat dcgm series: Hostname (dcgm-exporter's releases, the "
        "default) or hostname (its main branch)",
    )
    x.add_argument(
        "--collect",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help=f"opt-in detail beyond the default series budget: {', '.join(DETAILS)}, or all (repeatable; "
        "docs/metrics.md says what each adds)",
    )


Wrap = Callable[[Any], Any] | None  # puts something between the backend and its NVML (a recorder)
SIM_WARMUP = 120.0  # the simulated node has been training for two minutes when gpumon starts


def printable(text: object) -> str:
    """A line for a terminal: one a daemon, sysfs or a user named (a device name root chose, a job's note
    quoting one) must not forge another line with a newline, nor drive the terminal with an escape."""
    s = str(text)
    return s if s.isprintable() else s.encode("unicode_escape").decode("ascii")


def simulated_backend(spec: str, settings: Settings, wrap: Wrap = None) -> NvmlBackend:
    sim = SimNvml(
        spec,
        seed=settings.seed,
        warmup=SIM_WARMUP,
        jobs=settings.sim_jobs,
        speed=settings.sim_speed,
        unreported_jobs=settings.sim_unreported_jobs,
    )
    for fault in settings.sim_faults:
        sim.faults.add(fault)
    return NvmlBackend(wrap(sim) if wrap else sim)


def replayed_backend(path: str, wrap: Wrap = None) -> NvmlBackend:
    try:
        capture = load(path)
    except CaptureError as exc:  # checked with the settings; the file changed since
        raise BackendUnavailable(f"--replay {exc}", kind="capture") from None
    # every command's one warning about a replay, serve's included: it names the file and what it holds
    log.warning(
        "these GPUs are REPLAYED from %s (%s): every number served is a recording of another node, "
        'not this node\'s GPUs (gpumon_build_info{backend="replay"})',
        path,
        capture.summary(),
    )
    nv = ReplayNvml(capture)
    return NvmlBackend(wrap(nv) if wrap else nv)


def attributor(backend: NvmlBackend, settings: Settings) -> Attributor | None:
    """Owners from /proc and the kubelet; the simulator brings its own /proc tree and pod allocation."""
    nv = getattr(backend.nv, "wrapped", backend.nv)  # through a recorder to the simulator it records
    if isinstance(nv, ReplayNvml):
        return None  # the capture's pids belong to another node: this /proc would name the wrong owners
    if isinstance(nv, SimNvml):
        atexit.register(nv.remove_proc_root)
        note = "simulated /proc tree and pod allocation"
        return Attributor(ProcessResolver(nv.proc_root()), nv.pod_owners, note)
    pods = healthy = None
    kubelet = "no kubelet pod-resources socket (pod names off)"
    if settings.kubelet_socket and os.path.exists(settings.kubelet_socket):
        lister = PodResources(settings.kubelet_socket)
        if lister.available:
            lister.start()
            pods = lister.owners
            healthy = lister.healthy
            kubelet = f"pods from {settings.kubelet_socket}"
        else:
            kubelet = f"kubelet socket found but {lister.reason}"
            log.info("%s", kubelet)
    note = f"/proc at {settings.proc_root}; {kubelet}"
    return Attributor(ProcessResolver(settings.proc_root), pods, note, healthy)


def describe_sources(sampler: Sampler, settings: Settings) -> dict[str, str]:
    """What ``gpumon doctor`` says about profiling and attribution on this node."""
    out: dict[str, str] = {}
    backend = sampler.backend
    if isinstance(backend, NvmlBackend):
        if backend.profiler is not None:
            out["profiling"] = f"DCGM ({settings.dcgm_address or 'embedded host engine'})"
        elif not backend.gpm:
            out["profiling"] = "off (--profiling off)"
        if backend.profiler_note:
            out["dcgm"] = backend.profiler_note
    if sampler.attributor is not None:
        out["attribution"] = sampler.attributor.note
    elif backend.name == "replay":
        out["attribution"] = "off: the replayed processes ran on the node that was captured"
    return out


def _try_dcgm(backend: NvmlBackend, sampler: Sampler, settings: Settings) -> None:
    """DCGM's profiling fields instead of GPM where a host engine serves them; NVML carries on without."""
    source = DcgmSource(settings.dcgm_address, update_interval=settings.interval)
    if source.open([d.info.uuid for d in sampler.devices()]):
        backend.profiler = source
        return
    backend.profiler_note = f"DCGM not used: {source.reason}"
    if settings.profiling == "dcgm":
        log.warning("--profiling dcgm: DCGM is not usable (%s); no profiling counters", source.reason)
        backend.gpm = False


def open_sampler(settings: Settings, command: str, *, wait: bool = False, wrap: Wrap = None) -> Sampler:
    """The sampler over the backend the settings ask for, opened. Raises BackendUnavailable with advice.

    With ``wait`` and a backend named explicitly (``--backend nvml``, or simulated GPUs), a driver that
    is not there yet is waited for instead (Sampler.open); ``--backend auto`` still explains and exits."""

    def opened(backend: NvmlBackend, *, wait: bool = False) -> Sampler:
        backend.gpm = settings.profiling in ("auto", "gpm")
        backend.processes = settings.processes
        # a one-off read shows and probes everything; the daemon reads what its exposition needs
        backend.details = frozenset(DETAILS) if command in ("snapshot", "doctor") else settings.details
        if (
            settings.compat == "dcgm"
        ):  # DCGM_FI_DEV_PSTATE: read, though gpumon's own P-state series stays off
            backend.details |= {"device-state"}
        sampler = Sampler(backend, interval=settings.interval, timeout=settings.deadline)
        if settings.profiling in ("auto", "dcgm") and backend.name == "nvml":
            sampler.on_open.append(lambda: _try_dcgm(backend, sampler, settings))
        if settings.events:
            sampler.events = EventWatcher(backend.nv, sampler.devices)
        if settings.processes:
            sampler.attributor = attributor(backend, settings)
        # simulated or replayed GPUs beside this host's real NICs would make one node out of two: simulated
        # GPUs get simulated NICs, replayed ones none, unless --sys-root names a tree to read
        real = backend.name == "nvml" or settings.sys_root is not None
        detail = "nic-detail" in backend.details
        sim = getattr(backend.nv, "wrapped", backend.nv)
        if settings.nics and real:
            root = settings.sys_root or "/sys"
            # the daemon reads them on a thread of their own (net/reader.py); a one-off command in line
            every = READ_EVERY if command == "serve" else None
            sampler.nics = NicReader(root, detail=detail, every=every)
        elif settings.nics and isinstance(sim, SimNvml):
            sampler.nics = NicReader(SimNics(sim.gpus, sim.now), detail=detail)  # cheap: read every sweep
        sampler.open(wait=wait)
        return sampler

    if settings.replay:
        return opened(replayed_backend(settings.replay, wrap))
    if settings.simulated:
        return opened(simulated_backend(settings.simulate or DEFAULT_SIMULATION, settings, wrap), wait=wait)
    nv = wrap(pynvml) if wrap else None
    if settings.backend == "nvml" and wait:
        return opened(NvmlBackend(nv), wait=True)
    try:
        return opened(NvmlBackend(nv))
    except BackendUnavailable as exc:
        if settings.simulate_if_no_gpu:
            log.warning(
                "no usable NVIDIA driver (%s): serving SIMULATED GPUs (%s) as --simulate-if-no-gpu asks",
                exc,
                settings.simulate_if_no_gpu,
            )
            return opened(simulated_backend(settings.simulate_if_no_gpu, settings, wrap))
        raise BackendUnavailable(
            f"no usable NVIDIA driver: {exc}. To run with simulated GPUs instead: gpumon {command} "
            f"--simulate {DEFAULT_SIMULATION} (or add --simulate-if-no-gpu {DEFAULT_SIMULATION} to fall back "
            "automatically); on a node where the driver is loaded after gpumon starts, give --backend nvml "
            "to wait for it"
        ) from None
