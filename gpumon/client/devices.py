"""Which GPUs a process uses: CUDA_VISIBLE_DEVICES and the Reporter's ``device`` argument, as NVML ids.

Standard library only: this module runs inside training processes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from gpumon.client.protocol import MAX_DEVICES, UUID_PATTERN

_UUID_RE = re.compile(UUID_PATTERN)  # the daemon checks the same pattern
_CUDA_RE = re.compile(r"^cuda:(\d+)$")


def visible_devices(env: Mapping[str, str] | None = None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list of NVML indexes or UUIDs; None when unset (every GPU is visible).

    Follows CUDA's parsing: entries are read up to the first invalid one (so "-1" or "NoDevFiles" hide every
    GPU, and "" does too). UUID entries, including CUDA's accepted unique prefixes, pass through unchanged.
    """
    env = os.environ if env is None else env
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    out: list[str] = []
    for entry in raw.split(","):
        entry = entry.strip()
        if entry.isdigit():
            out.append(str(int(entry)))
        elif _UUID_RE.match(entry):
            out.append(entry)
        else:
            break
    return out


def ordinal_to_device(ordinal: int, visible: list[str] | None) -> str | None:
    """The NVML index or UUID behind CUDA ordinal ``ordinal``, or None when it cannot be known.

    CUDA ordinals equal NVML indexes only with the default ordering on homogeneous nodes: CUDA orders by
    speed (CUDA_DEVICE_ORDER=FASTEST_FIRST) and NVML by PCI bus id, so the mapping is exact only with
    CUDA_DEVICE_ORDER=PCI_BUS_ID or identical GPUs. A CUDA_VISIBLE_DEVICES of UUIDs is exact either way.
    A process bound to a single GPU (Slurm's per-task binding leaves one entry) uses that one whatever its
    local rank.
    """
    if visible is None:
        return str(ordinal)
    if ordinal < len(visible):
        return visible[ordinal]
    if len(visible) == 1:
        return visible[0]
    return None


def resolve_devices(
    device: object, local_rank: int | None, env: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """(devices for the report, problems to warn about) from the Reporter's ``device`` argument.

    Accepted forms: an int CUDA ordinal or "cuda:N" (mapped through CUDA_VISIBLE_DEVICES), an object with
    ``.type == "cuda"`` and an int ``.index`` (torch.device), a "GPU-…"/"MIG-…" UUID, a decimal string
    taken as an NVML index as-is (to bypass the mapping), or a list of those. None means the local rank's
    GPU, or the only visible GPU when there is no local rank; [] when nothing is known.
    """
    visible = visible_devices(env)
    if device is None:
        if local_rank is not None:
            found = ordinal_to_device(local_rank, visible)
            return ([found] if found is not None else []), []
        if visible is not None and len(visible) == 1:
            return [visible[0]], []
        return [], []
    items = list(device) if isinstance(device, (list, tuple)) else [device]
    devices: list[str] = []
    problems: list[str] = []
    for item in items:
        found = _one_device(item, visible)
        if found is None:
            problems.append(repr(item))
        elif found not in devices:
            devices.append(found)
    if len(devices) > MAX_DEVICES:
        problems.append(f"more than {MAX_DEVICES} devices")
        devices = devices[:MAX_DEVICES]
    return devices, problems


def _one_device(item: object, visible: list[str] | None) -> str | None:
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return ordinal_to_device(item, visible) if item >= 0 else None
    if isinstance(item, str):
        text = item.strip()
        match = _CUDA_RE.match(text)
        if match:
            return ordinal_to_device(int(match.group(1)), visible)
        if text.isdigit():
            return str(int(text))
        return text if _UUID_RE.match(text) else None
    # torch.device, without importing torch
    index = getattr(item, "index", None)
    if getattr(item, "type", None) == "cuda" and isinstance(index, int):
        return ordinal_to_device(index, visible)
    return None
