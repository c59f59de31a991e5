"""The caching allocator's view of a rank's memory: ``torch.cuda.memory_stats()`` for the rank's device.

Read on the Reporter's sender thread, at most once per report, and only when the training process has
imported torch itself and CUDA is already initialised there: this module never imports torch, never
initialises CUDA and never creates a context (``memory_stats`` only reads counters the allocator keeps on the
host). A failed read is logged once and reading stops for the Reporter's life. Standard library only:
this module runs inside training processes.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from gpumon.client.protocol import MAX_BYTES, MEMORY_FIELDS

log = logging.getLogger("gpumon.client")
# memory_stats() flattens (and sorts) the allocator's nested dict of about 120 values in Python, several
# times the cost of the rest of a report; the nested dict is read along these paths instead
_PATHS = {wire: tuple(key.split(".")) for wire, key in MEMORY_FIELDS.items()}


def cuda_ordinal(device: object) -> int | None:
    """The CUDA ordinal the Reporter's ``device`` argument names (an int, "cuda:N", a torch.device), else
    None (a UUID, an NVML index string, a list: no single CUDA ordinal)."""
    if isinstance(device, bool):
        return None
    if isinstance(device, int):
        return device if device >= 0 else None
    if isinstance(device, str):
        text = device.strip()
        if text.startswith("cuda:") and text[5:].isdigit():
            return int(text[5:])
        return None  # "cuda" alone is the current device of the thread that asks: not the sender's
    index = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda" and isinstance(index, int) and index >= 0:
        return index
    return None


class AllocatorReader:
    """Reads the allocator of one CUDA device: ``ordinal`` when the Reporter was given one, else the local
    rank's when it is visible, else device 0 (the sender thread's current device is always 0, whatever the
    training thread set, so it is never asked)."""

    def __init__(self, ordinal: int | None, local_rank: int | None) -> None:
        self._ordinal = ordinal
        self._local_rank = local_rank
        self._device: int | None = None
        self._broken = False

    def read(self) -> dict[str, Any] | None:
        """The report's ``memory`` object, or None (no torch, CUDA not initialised, a failed read)."""
        torch = sys.modules.get("torch")
        if torch is None or self._broken:
            return None
        # torch is in sys.modules while its import runs (on the training thread): until torch.cuda and its
        # functions exist, CUDA is simply not initialised yet
        cuda: Any = getattr(torch, "cuda", None)
        initialized = getattr(cuda, "is_initialized", None)
        if initialized is None:
            return None
        try:
            if not initialized():
                return None
        except Exception:
            return None
        try:
            device = self._device
            if device is None:
                device = self._device = self._choose(cuda)
            nested = getattr(cuda, "memory_stats_as_nested_dict", None)
            if nested is not None:
                values = _dig(nested(device))
            else:  # an older torch: the flat form
                stats = cuda.memory_stats(device)
                values = {wire: stats.get(key) for wire, key in MEMORY_FIELDS.items()}
        except Exception:
            self._broken = True
            log.warning("gpumon: reading torch.cuda.memory_stats() failed; allocator memory is not reported",
                        exc_info=True)  # fmt: skip
            return None
        out: dict[str, Any] = {"device": device}
        for wire, value in values.items():
            if value.__class__ is int and 0 <= value <= MAX_BYTES:  # the daemon's bounds
                out[wire] = value
        return out if len(out) > 1 else None

    def _choose(self, cuda: Any) -> int:
        if self._ordinal is not None:
            return self._ordinal
        if self._local_rank is not None and self._local_rank < cuda.device_count():
            return self._local_rank
        return 0


def _dig(stats: Any) -> dict[str, Any]:
    """The report's memory values from memory_stats_as_nested_dict()'s {"allocated_bytes": {"all":
    {"current": ...}}, "num_ooms": ...}; a missing path is None."""
    out = {}
    for wire, path in _PATHS.items():
        node = stats
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        out[wire] = node
    return out
