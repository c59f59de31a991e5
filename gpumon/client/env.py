"""What a training process can learn about itself from its environment: rank, job name, GPUs, settings.

The one namespace the SDK's users and tests import (``from gpumon.client import env``); each concern lives in
its own module: launcher.py (ranks and job name), devices.py (which GPUs) and settings.py (the Reporter's
arguments checked and defaulted). Pure functions over a ``Mapping`` (``os.environ`` by default) so tests can
pass plain dicts. Standard library only: this module runs inside training processes.
"""

from __future__ import annotations

from gpumon.client.devices import ordinal_to_device, resolve_devices, visible_devices
from gpumon.client.launcher import (
    LAUNCHERS,
    Placement,
    detect_job,
    detect_placement,
    sanitize_name,
    script_name,
)
from gpumon.client.settings import Settings, env_flag, normalize_dtype, resolve

__all__ = [
    "LAUNCHERS",
    "Placement",
    "Settings",
    "detect_job",
    "detect_placement",
    "env_flag",
    "normalize_dtype",
    "ordinal_to_device",
    "resolve",
    "resolve_devices",
    "sanitize_name",
    "script_name",
    "visible_devices",
]
