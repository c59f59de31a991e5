"""Process-wide hooks for the live Reporters: a final report at interpreter exit and on SIGTERM, silence in
forked children.

A process that SIGTERM ends (scancel, a preemption, torchrun stopping its workers, kubectl delete) runs no
atexit hooks under Python's default handling, so without one its ranks would vanish without a final report
and the daemon would count them lost, as if they had crashed (gpumon_training_ranks_lost_total pages). The
handler is installed only where SIGTERM has its default action, from the main thread, so a framework's or
the program's own handler is never replaced; it sends the final reports (bounded by AT_EXIT_TIMEOUT), then
restores the default action and re-raises the signal, so the process still dies of SIGTERM as it would
have.

Standard library only: this module runs inside training processes.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gpumon.client.transport import Shipper


class Reporter(Protocol):
    """What these hooks need of a gpumon.client.Reporter (which imports this module, so not the class)."""

    def _shutdown(self, timeout: float) -> None: ...

    def _forked(self) -> None: ...


# for all live Reporters together: interpreter exit must not hang on a dead or slow daemon
AT_EXIT_TIMEOUT = 2.0
# weak, so a Reporter a program drops is collected rather than kept; its thread then sends its final report
_live: weakref.WeakSet[Reporter] = weakref.WeakSet()
# the threads sending those final reports (each keeps its Shipper alive while it runs): exit waits for them
_orphans: weakref.WeakSet[Shipper] = weakref.WeakSet()


def track(reporter: Reporter) -> None:
    """Close ``reporter`` at interpreter exit or SIGTERM, and silence it in forked children."""
    _live.add(reporter)
    _hook_sigterm()


def _hook_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):  # no SIGTERM on this platform, or an embedded interpreter
        pass


def _on_sigterm(signum: int, frame: object) -> None:
    try:
        _close_all()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def forget(reporter: Reporter) -> None:
    _live.discard(reporter)


def orphaned(shipper: Shipper) -> None:
    """``shipper``'s Reporter was collected; its thread is sending the final report: wait for it at exit."""
    _orphans.add(shipper)


def _close_all() -> None:
    deadline = time.monotonic() + AT_EXIT_TIMEOUT
    for reporter in list(_live):
        # whoever still holds a handle on it: the process is ending
        reporter._shutdown(max(0.0, deadline - time.monotonic()))
    for shipper in list(_orphans):
        shipper.join(deadline - time.monotonic())


def _after_fork_in_child() -> None:
    for reporter in list(_live):
        reporter._forked()
    _live.clear()
    _orphans.clear()  # their threads are the parent's


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
