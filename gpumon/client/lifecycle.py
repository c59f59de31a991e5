"""Process-wide hooks for the live Reporters: a final report at interpreter exit, silence in forked children.

Standard library only, Python >= 3.9: this module runs inside training processes.
"""

from __future__ import annotations

import atexit
import os
import time
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpumon.client.reporter import Reporter

# for all live Reporters together: interpreter exit must not hang on a dead or slow daemon
AT_EXIT_TIMEOUT = 2.0
# weak, so a Reporter a program drops is collected rather than kept for a final report
_live: weakref.WeakSet[Reporter] = weakref.WeakSet()


def track(reporter: Reporter) -> None:
    """Close ``reporter`` at interpreter exit and silence it in forked children."""
    _live.add(reporter)


def forget(reporter: Reporter) -> None:
    _live.discard(reporter)


def _close_all() -> None:
    deadline = time.monotonic() + AT_EXIT_TIMEOUT
    for reporter in list(_live):
        reporter.close(timeout=max(0.0, deadline - time.monotonic()))


def _after_fork_in_child() -> None:
    for reporter in list(_live):
        reporter._forked()
    _live.clear()


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
