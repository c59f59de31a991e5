"""Which recorded answer a replayed call gets: the key of a call is its op and the arguments that choose the
answer, with what varies from run to run left out (sample buffers, event sets, timestamps, timeouts).

The recorder and the replayer both compute keys from encoded arguments (handles as their names), so a call
made the same way in both runs finds its answers.
"""

from __future__ import annotations

import json
from typing import Any

# argument positions that do not choose the answer
VOLATILE = {
    "nvmlDeviceGetProcessUtilization": (1,),  # "samples newer than": the caller's own progress
    "nvmlEventSetWait_v2": (1,),  # the timeout
}
_UNNAMED = ("gpm", "eventset")  # buffers and sets: one per caller, named by allocation order


def _anonymous(arg: Any) -> bool:
    return isinstance(arg, dict) and str(arg.get("ref", "")).startswith(_UNNAMED)


def call_key(op: str, args: list[Any]) -> str:
    drop = VOLATILE.get(op, ())
    kept = [a for i, a in enumerate(args) if i not in drop and not _anonymous(a)]
    return op + json.dumps(kept, sort_keys=True, separators=(",", ":"))


def gpm_source(device: str | None, instance: int | None) -> dict[str, Any]:
    """What a GPM metrics request differences: the GPU (and GPU instance) its newer sample was taken of."""
    return {"gpm_source": [device, instance]}
