"""Is a rank's process still there? A killed process sends no final report; its rank only goes quiet.

The report names the process by pid, in the training process's own pid namespace. The daemon trusts its
own /proc only after it has once found that pid there as the same process: started no later than its
Reporter (and at the same moment as the report's process start, when the report carries one). From then on,
the pid gone, or taken by a process that started later, means the rank's process exited. A daemon in
another pid namespace (a container without hostPID) never confirms the pid, and then says nothing: unknown
is not gone.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from gpumon.client.process.start import start_from_stat
from gpumon.gpu.attribution.proc import running

CHECK_EVERY = 1.0  # seconds between looks at one process
SLACK = 2.0  # seconds: /proc/uptime and the two clocks read 10 ms apart, plus a report's rounding
MAX_TRACKED = 4096  # processes remembered; past this, the oldest looks are forgotten


@dataclass(slots=True)
class _Seen:
    started: float | None  # the OS start time we confirmed for the pid; None: not confirmed (yet)
    checked: float
    gone: bool = False


class Liveness:
    def __init__(self, proc: str = "/proc") -> None:
        self._proc = proc
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int, str], _Seen] = {}  # (job, rank, incarnation)

    def _start(self, pid: int) -> float | None:
        """When the process started; None when it is gone, or dead and not yet reaped."""
        try:
            with open(os.path.join(self._proc, str(pid), "stat"), "rb") as f:
                raw = f.read(4096)
        except OSError:
            return None
        return start_from_stat(raw, os.path.join(self._proc, "uptime")) if running(raw) else None

    def gone(
        self,
        key: tuple[str, int, str],
        pid: int,
        started: float,
        process_started: float | None,
        now: float,
    ) -> bool:
        """True once a process we confirmed alive no longer exists (or its pid was reused)."""
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and (seen.gone or now - seen.checked < CHECK_EVERY):
                return seen.gone
        start = self._start(pid) if pid > 0 else None
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen.started is None:
                # an unconfirmed pid is looked at again at most every CHECK_EVERY, like a confirmed one
                confirmed = start is not None and start <= started + SLACK
                if process_started is not None and start is not None and abs(start - process_started) > SLACK:
                    confirmed = False  # a process of the same number, not the one that reports
                if seen is None and len(self._seen) >= MAX_TRACKED:
                    oldest = min(self._seen, key=lambda k: self._seen[k].checked)
                    del self._seen[oldest]
                self._seen[key] = _Seen(start if confirmed else None, now)
                return False  # not ours to see (another pid namespace), or not confirmed before it went
            seen.checked = now
            seen.gone = start is None or abs(start - seen.started) > SLACK
            return seen.gone

    def forget(self, keep: set[tuple[str, int, str]]) -> None:
        """Drop what we know of processes the store no longer holds."""
        with self._lock:
            for key in set(self._seen) - keep:
                del self._seen[key]
