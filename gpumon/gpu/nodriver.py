"""Why NVML cannot start on this node: what `gpumon doctor` says instead of a one-line error.

Checked in the order a person would: the user-space library NVML lives in, the kernel module, the device
nodes and whether this user may open them, and whether this is a container started without GPUs. Each
finding says what was seen and, when it is the problem, what to do. Paths and the environment are
parameters so tests can build a node of their own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import shlex
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

LIBRARY = "libnvidia-ml.so.1"
SIMULATE_HINT = "to look around with simulated GPUs meanwhile: gpumon doctor --simulate 8xH100-SXM"


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    seen: str
    advice: str | None = None


def _library(load: Callable[[str], object]) -> Finding:
    try:
        load(LIBRARY)
    except OSError as exc:
        found = ctypes.util.find_library("nvidia-ml")
        seen = f"{LIBRARY} cannot be loaded ({exc})" + (f"; {found} exists" if found else "")
        return Finding(
            "NVML library",
            False,
            seen,
            "install the NVIDIA driver, whose user-space part ships libnvidia-ml.so.1; in a container, "
            "start it with the NVIDIA Container Toolkit (docker run --gpus all; Kubernetes: the nvidia "
            "runtime class or the GPU operator), which mounts the host's library into it",
        )
    return Finding("NVML library", True, f"{LIBRARY} loads")


def _module(proc: str) -> Finding:
    path = os.path.join(proc, "driver", "nvidia", "version")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline().strip()
    except OSError:
        return Finding(
            "kernel module",
            False,
            f"{path} is missing: the nvidia kernel module is not loaded",
            "load the nvidia kernel module (modprobe nvidia) and read dmesg | grep -i nvidia: after a kernel "
            "update the module often needs rebuilding (DKMS); on a cloud VM, check the instance has a GPU",
        )
    return Finding("kernel module", True, first or f"{path} present")


def _nodes(dev: str, access: Callable[[str, int], bool]) -> Finding:
    control = os.path.join(dev, "nvidiactl")
    nodes = glob.glob(os.path.join(dev, "nvidia[0-9]*"))
    gpus = sorted(p for p in nodes if os.path.basename(p)[6:].isdigit())
    if not os.path.exists(control) or not gpus:
        missing = ", ".join(p for p in (control, os.path.join(dev, "nvidia0")) if not os.path.exists(p))
        return Finding(
            "device nodes",
            False,
            f"missing: {missing or 'no ' + os.path.join(dev, 'nvidiaN')}",
            "the /dev/nvidia* nodes: in a container the NVIDIA runtime mounts them (--gpus all, "
            "or NVIDIA_VISIBLE_DEVICES with the nvidia runtime); on the host, nvidia-modprobe (or "
            "nvidia-smi run once as root) creates them",
        )
    denied = [p for p in (control, *gpus) if not access(p, os.R_OK | os.W_OK)]
    if denied:
        return Finding(
            "device nodes",
            False,
            f"no read-write access for uid {os.getuid()} to {', '.join(denied)}",
            "run gpumon as root, as the packaged systemd unit and DaemonSet do, or add its user to the group "
            "that owns the device nodes (often video)",
        )
    return Finding("device nodes", True, f"{control} and {len(gpus)} GPU node(s), read-write")


# a value longer than any device list is cut: the report is for a terminal
MAX_SHOWN = 200


def _shown(value: str) -> str:
    """The value as a shell would need it typed, on one line: control characters (a newline that would
    forge a report line, a terminal escape) and undecodable bytes escaped, and cut at MAX_SHOWN."""
    cut = value[:MAX_SHOWN]
    escaped = cut.encode("unicode_escape").decode("ascii").replace("'", "\\'")
    text = shlex.quote(cut) if cut.isprintable() else f"$'{escaped}'"
    return text + ("..." if len(value) > MAX_SHOWN else "")


def _container(root: str, env: Mapping[str, str]) -> Finding | None:
    markers = [m for m in ("/.dockerenv", "/run/.containerenv") if os.path.exists(root.rstrip("/") + m)]
    if not markers and "KUBERNETES_SERVICE_HOST" not in env:
        return None
    visible = env.get("NVIDIA_VISIBLE_DEVICES")
    where = "a Kubernetes pod" if "KUBERNETES_SERVICE_HOST" in env else "a container"
    # absent said in words: a runtime can set the variable to words of its own ("all", "none", "void"), so
    # a placeholder value would read as one of them; a set value quoted as a shell would (empty: '')
    seen = (
        f"running in {where}; NVIDIA_VISIBLE_DEVICES is not set"
        if visible is None
        else f"running in {where} with NVIDIA_VISIBLE_DEVICES={_shown(visible)}"
    )
    if visible in (None, "", "void", "none"):
        return Finding(
            "container",
            False,
            seen,
            "the container was started without GPUs: request them (docker run --gpus all; in Kubernetes a "
            "nvidia.com/gpu resource, or NVIDIA_VISIBLE_DEVICES=all with the nvidia runtime for a monitoring "
            "DaemonSet, as deploy/kubernetes does)",
        )
    return Finding("container", True, seen)


def explain(
    *,
    dev: str = "/dev",
    proc: str = "/proc",
    root: str = "/",
    env: Mapping[str, str] | None = None,
    load: Callable[[str], object] = ctypes.CDLL,
    access: Callable[[str, int], bool] = os.access,
) -> list[Finding]:
    """Every check's finding, the failed ones with advice."""
    findings = [_library(load), _module(proc), _nodes(dev, access)]
    container = _container(root, os.environ if env is None else env)
    if container is not None:
        findings.append(container)
    return findings


def render(error: str, findings: list[Finding]) -> str:
    lines = [f"no usable NVIDIA driver: {error}", ""]
    for f in findings:
        lines.append(f"  [{'ok' if f.ok else 'NO'}] {f.check + ':':<15} {f.seen}")
    advice = [f.advice for f in findings if not f.ok and f.advice]
    if not advice:
        advice = ["every check passed, yet NVML did not start: read the error above, and dmesg"]
    lines += ["", "advice:"]
    for item in [*advice, SIMULATE_HINT]:
        lines += textwrap.wrap(item, 100, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(lines)


def as_json(error: str, findings: list[Finding]) -> dict[str, Any]:
    return {"driver": None, "error": error, "checks": [asdict(f) for f in findings], "hint": SIMULATE_HINT}
