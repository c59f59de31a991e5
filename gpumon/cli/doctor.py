"""gpumon doctor: what this node supports, per GPU and quantity, with advice."""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from collections.abc import Callable

from gpumon.cli.capture import MAX_SECONDS, Recording
from gpumon.cli.common import describe_sources, open_sampler, printable
from gpumon.config import ConfigError, Settings
from gpumon.gpu import nodriver
from gpumon.gpu.backend import marked
from gpumon.gpu.doctor import Report, diagnose
from gpumon.gpu.types import BackendUnavailable

NO_DRIVER = 3  # exit status when NVML cannot start: the diagnosis is printed, it is not a usage error

_MARK = {
    "supported": "yes",
    "not_supported": "-",
    "no_permission": "DENIED",
    "error": "ERROR",
    "unknown": "?",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    c = p.add_argument_group("capture (docs/captures.md)")
    c.add_argument(
        "--capture",
        metavar="PATH",
        help="also record every NVML call this node answers, over a few sweeps, into PATH (attach it to a "
        "bug report; replay it with --replay PATH)",
    )
    c.add_argument(
        "--capture-sweeps",
        type=int,
        metavar="N",
        help="sweeps to record, one interval apart (default 5; at most 100 and 10 minutes)",
    )
    c.add_argument(
        "--no-mask",
        dest="mask",
        action="store_const",
        const=False,
        help="keep the GPUs' serial numbers and UUIDs in the capture (masked by default)",
    )


def _recording(settings: Settings, args: argparse.Namespace) -> tuple[Recording | None, int]:
    if args.capture is None:
        for flag, given in (("--capture-sweeps", args.capture_sweeps), ("--no-mask", args.mask)):
            if given is not None:
                raise ConfigError(f"{flag} only applies with --capture PATH")
        return None, 2
    if settings.replay:
        raise ConfigError("--capture records this node's NVML; a replay is a capture already (copy the file)")
    sweeps = 5 if args.capture_sweeps is None else args.capture_sweeps
    if not 1 <= sweeps <= 100:
        raise ConfigError(f"--capture-sweeps: expected 1 to 100, got {sweeps}")
    if sweeps * settings.interval > MAX_SECONDS:
        raise ConfigError(
            f"--capture-sweeps {sweeps} at an interval of {settings.interval:g} s is over {MAX_SECONDS:g} s: "
            "a capture is a few sweeps"
        )
    return Recording(args.capture, args.mask is not False), sweeps


def run(settings: Settings, args: argparse.Namespace) -> int:
    recording, sweeps = _recording(settings, args)
    gap = settings.interval if recording is not None else 0.15  # GPM needs samples >= 100 ms apart
    try:
        try:
            sampler = open_sampler(settings, "doctor", wrap=recording.wrap if recording else None)
        except BackendUnavailable as exc:
            if settings.simulated or settings.replay:
                raise
            # the one node where doctor matters most: say why, rather than serve's one-line error
            error = str(exc).split(". To run with simulated GPUs", 1)[0]
            error = error.removeprefix("no usable NVIDIA driver: ")
            findings = nodriver.explain()
            out = nodriver.as_json(error, findings) if args.json else nodriver.render(error, findings)
            print(json.dumps(out, indent=2) if args.json else out)
            return NO_DRIVER
        try:
            if sampler.events is not None:
                sampler.events.start()
                _wait(lambda: sampler.events is not None and sampler.events.view().reason != "not started")
            # the second sweep probes fallbacks the first one discovered a need for
            for i in range(sweeps):
                if i:
                    time.sleep(gap)
                snap = sampler.sweep()
            sources = describe_sources(sampler, settings)
        finally:
            sampler.stop()
        if recording is not None:
            recording.write(sweeps=sweeps, interval=gap)
    finally:
        if recording is not None:
            recording.discard()
    report = diagnose(snap, sources=sources)
    print(json.dumps(report.as_json(), indent=2) if args.json else render(report))
    return 0


def _wait(cond: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)


def _network(r: Report) -> list[str]:
    net = r.network
    lines = []
    for p in net.ports:
        rate = p["rate_bytes_per_second"]
        speed = f"{rate * 8 / 1e9:g} Gb/s" if rate is not None else "? Gb/s"
        name = f"{printable(p['device'])}/{p['port']}:"
        facts = [printable(p["link_layer"] or "?"), speed, printable(p["state"] or "?")]
        facts.append(printable(p["pci_bus_id"] or ""))
        joined = "  ".join(facts)
        lines.append(f"NIC {name:<11} {joined}".rstrip())
    if net.nearest:
        pairs = ", ".join(f"GPU {n['gpu']} {printable(n['nic'])} ({n['path']})" for n in net.nearest)
        lines.append(f"nearest NIC:    {pairs}")
    if net.ports:
        lines.append(f"GPUDirect RDMA: {net.peermem + ' loaded' if net.peermem else 'no peer-memory module'}")
    return lines


def render(r: Report) -> str:
    d = r.driver
    lines = [
        f"backend:        {marked(r.backend)}",
        f"driver:         {d['driver_version'] or '?'}  CUDA {d['cuda_driver_version'] or '?'}  "
        f"NVML {d['nvml_version'] or '?'}",
        f"GPUs:           {r.device_count} counted by NVML, {len(r.gpus)} identified",
        f"running as uid: {r.uid}{' (root)' if r.uid == 0 else ''}",
    ]
    for path, state in r.devices.items():
        lines.append(f"device node:    {path} {state}")
    for name, state in r.telemetry.items():
        lines.append(f"{name + ':':<16}{state}")
    for g in r.gpus:
        pm = {True: "on", False: "OFF", None: "unknown"}[g["persistence_mode"]]
        status = "up" if g["up"] else f"DOWN ({g['down_reason']})"
        lines.append(
            f"GPU {g['index']}:          {g['name']}  {g['uuid']}  {g['pci_bus_id']}  {status}  "
            f"persistence {pm}"
        )
    lines += _network(r)
    if r.gpus:
        lines += ["", "quantity".ljust(30) + " ".join(f"{g['index']:>6}" for g in r.gpus)]
        for q in r.quantities:
            marks = [_MARK.get(g["capabilities"].get(q, "unknown"), "?") for g in r.gpus]
            lines.append(q.ljust(30) + " ".join(f"{m:>6}" for m in marks))
        lines.append(
            "(yes: read; -: not supported, series absent; DENIED: no permission; ERROR: failed now; "
            "?: not tried, a fallback this GPU does not need)"
        )
    lines += ["", "advice:"]
    for item in r.advice:
        lines += textwrap.wrap(item, 100, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(lines)
