"""When the OS started this process: the start of a rank's wall-clock, so the goodput ledger counts the
imports, model building and checkpoint loading that happen before a Reporter exists.

Linux only (/proc); elsewhere None, and the daemon starts the clock at the Reporter's creation. The start
time in /proc/self/stat is in clock ticks since boot, so it is set against /proc/uptime (10 ms resolution)
read together with time.time(), rather than against /proc/stat's btime, which is whole seconds. Standard
library only: this module runs inside training processes.
"""

from __future__ import annotations

import os
import threading
import time

from gpumon.client.protocol import MAX_STARTUP

# a start more than this before now is a misread (a container's /proc from another boot, a time namespace);
# the daemon refuses an older one (protocol.MAX_STARTUP)
_MAX_AGE = MAX_STARTUP
_claim_lock = threading.Lock()
_claimed = False


def process_start_time(stat: str = "/proc/self/stat", uptime: str = "/proc/uptime") -> float | None:
    """Unix seconds when this process started, or None when the OS does not say."""
    try:
        with open(stat, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return start_from_stat(raw, uptime)


def start_from_stat(raw: bytes, uptime: str = "/proc/uptime") -> float | None:
    """Unix seconds when the process whose /proc/PID/stat is ``raw`` started, or None."""
    try:
        with open(uptime, "rb") as f:
            since_boot = float(f.read().split()[0])
        now = time.time()
        # the command name (field 2) may hold spaces and parentheses: fields are counted after its last ")"
        fields = raw[raw.rindex(b")") + 2 :].split()
        ticks = int(fields[19])  # field 22, starttime
        hertz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    age = since_boot - ticks / hertz
    if not 0.0 <= age <= _MAX_AGE:
        return None
    return now - age


def claim_process_start() -> float | None:
    """The process's start time for its first Reporter only: a later one (a second job in a notebook, the
    next trial of a sweep) starts its clock at its own creation, or the earlier work would be its start-up."""
    global _claimed
    with _claim_lock:
        if _claimed:
            return None
        _claimed = True
    return process_start_time()


def _forked() -> None:
    global _claimed, _claim_lock
    _claimed = False  # a forked child is a process of its own, started at the fork
    _claim_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
