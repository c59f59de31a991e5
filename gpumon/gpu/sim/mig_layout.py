"""MIG layouts as the driver places them: the profiles a board offers, where each GPU instance lands, the GPU
instance id its placement gives it, the compute instances inside it, and the memory NVML reports.

A GPU in MIG mode has 7 compute slices and 8 memory slices. A GPU instance profile takes a fixed number of
each at one of a few placements (memory-slice starts), which the driver tries in a fixed order; its GPU
instance id follows from the placement (the H100 MIG capture of nvidia_gpu_exporter, driver 590.48.01:
3g.40gb → GI 2, 2g.20gb → GI 3, 1g.10gb → GI 9 and 10). A layout is written as NVML names MIG devices:
``3g.40gb`` is a GPU instance with one compute instance that has all of it; ``1c.3g.71gb`` is a compute
instance of one slice inside a 3g GPU instance, and consecutive ``Nc.`` tokens of one profile share a GPU
instance while its slices last (``1c.3g.71gb+1c.3g.71gb``: one GPU instance, compute instances 0 and 1, as in
the H200 MIG capture). Only the first GPU instance of a layout carries the GPU's load; the others idle, as in
the captures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class _GiProfile:
    memory_slices: int
    placements: tuple[int, ...]  # memory-slice starts, in the order the driver tries them
    first_id: int  # GPU instance id = first_id + start // id_step
    id_step: int


_GI_PROFILES = {
    1: _GiProfile(1, (0, 1, 2, 3, 4, 5, 6), 7, 1),
    2: _GiProfile(2, (0, 2, 4), 3, 2),
    3: _GiProfile(4, (4, 0), 1, 4),
    4: _GiProfile(4, (0,), 1, 4),
    7: _GiProfile(8, (0,), 0, 8),
}

# the memory part of each profile's name, by compute slices, per board
_GB_80 = {1: 10, 2: 20, 3: 40, 4: 40, 7: 80}
PROFILE_GB: dict[str, dict[int, int]] = {
    "H100-SXM": _GB_80,
    "H100-PCIe": _GB_80,
    "A100-SXM4-80GB": _GB_80,
    "A100-PCIe": _GB_80,
    "A100-SXM4-40GB": {1: 5, 2: 10, 3: 20, 4: 20, 7: 40},
    "H800": _GB_80,
    "H100-NVL": {1: 12, 2: 24, 3: 47, 4: 47, 7: 94},
    "H200": {1: 18, 2: 35, 3: 71, 4: 71, 7: 141},
    "H20": {1: 12, 2: 24, 3: 48, 4: 48, 7: 96},
    "B200": {1: 23, 2: 45, 3: 90, 4: 90, 7: 180},
}
# what NVML reports as the instance's memory, where a capture showed it (MiB, by compute slices); other
# boards get their memory slices' share of the board, rounded down to 128 MiB
CAPTURED_MIB: dict[str, dict[int, int]] = {
    "H100-SXM": {1: 9984, 2: 20096, 3: 40448, 4: 40448},  # nvidia_gpu_exporter H100 MIG, 590.48.01
    "H200": {1: 16384, 2: 33280, 3: 71424, 4: 71424},  # nvidia_gpu_exporter H200 MIG, 590.48.01
}

_TOKEN = re.compile(r"^(?:([1-7])c\.)?([1-7])g\.(\d+)gb$")


class LayoutError(ValueError):
    pass


@dataclass(frozen=True)
class MigSlot:
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # as NVML names the device: "3g.40gb", or "1c.3g.71gb" for a share of a GPU instance
    memory_mib: int  # the GPU instance's, which each of its compute instances reports
    busy: bool  # carries the GPU's load


def profiles(model_key: str) -> list[str]:
    return [f"{g}g.{gb}gb" for g, gb in sorted(PROFILE_GB.get(model_key, {}).items())]


def memory_mib(model_key: str, board_mib: int, slices: int) -> int:
    captured = CAPTURED_MIB.get(model_key, {}).get(slices)
    if captured is not None:
        return captured
    share = board_mib * _GI_PROFILES[slices].memory_slices // MEMORY_SLICES
    return share // 128 * 128


def place(model_key: str, board_mib: int, tokens: tuple[str, ...]) -> list[MigSlot]:
    """The MIG devices of a layout, in NVML's enumeration order (by GPU instance, then compute instance).
    Raises LayoutError naming the token that is not a profile of this board or does not fit."""
    offered = PROFILE_GB.get(model_key)
    if not offered:
        raise LayoutError(f"{model_key} has no MIG")
    used = [False] * MEMORY_SLICES
    compute = 0
    slots: list[MigSlot] = []
    shared: tuple[int, int, int] | None = None  # (GI id, its slices, slices its compute instances use)
    for token in tokens:
        m = _TOKEN.match(token)
        if not m:
            raise LayoutError(f"MIG profile {token!r} is not like 3g.40gb or 1c.3g.71gb")
        ci_slices, slices, gb = int(m.group(1) or 0), int(m.group(2)), int(m.group(3))
        gi_name = f"{slices}g.{gb}gb"
        if offered.get(slices) != gb:
            raise LayoutError(
                f"{model_key} has no MIG profile {gi_name}; it has {', '.join(profiles(model_key))}"
            )
        if ci_slices >= slices:
            if slices == 1:
                raise LayoutError(f"{token!r}: a 1g GPU instance has one compute instance; write {gi_name}")
            raise LayoutError(f"{token!r}: a compute instance of a {gi_name} takes 1 to {slices - 1} slices")
        if ci_slices and shared and shared[1] == slices and shared[2] + ci_slices <= slices:
            gi, _, taken = shared
            ci = sum(1 for s in slots if s.gpu_instance_id == gi)
            shared = (gi, slices, taken + ci_slices)
            slots.append(MigSlot(gi, ci, token, slots[-1].memory_mib, slots[-1].busy))
            continue
        gi = _allocate(used, slices, token, model_key)
        compute += slices
        if compute > COMPUTE_SLICES:
            raise LayoutError(f"the MIG instances do not fit in one {model_key}: more than 7 compute slices")
        shared = (gi, slices, ci_slices) if ci_slices else None
        busy = not slots
        slots.append(MigSlot(gi, 0, token, memory_mib(model_key, board_mib, slices), busy))
    return sorted(slots, key=lambda s: (s.gpu_instance_id, s.compute_instance_id))


def _allocate(used: list[bool], slices: int, token: str, model_key: str) -> int:
    profile = _GI_PROFILES[slices]
    for start in profile.placements:
        span = range(start, start + profile.memory_slices)
        if not any(used[i] for i in span):
            for i in span:
                used[i] = True
            return profile.first_id + start // profile.id_step
    raise LayoutError(f"the MIG instances do not fit in one {model_key}: no free placement for {token}")
