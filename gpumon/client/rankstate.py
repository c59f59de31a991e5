"""A rank's progress kept beside its checkpoints, so its next process can say what it follows.

When a rank's process dies and a new one resumes from a checkpoint on another node, that node's daemon never
saw the old process: it would count the dead gap as nobody's and the redone steps as new work. With a state
directory (``GPUMON_STATE_DIR`` or ``Reporter(state_dir=...)``: one that outlives the process wherever it
restarts, such as the checkpoint directory), the Reporter keeps one small JSON file per (job, rank) there:
its incarnation, its high-water global step and the time of its last step. The next process of the rank reads
it at start and sends it as its reports' ``predecessor``; the daemon books the gap and the redone steps.

Written from the sender thread when the rank stepped since the last write, at most every WRITE_EVERY seconds
and at the final report; atomically (a temporary file renamed over it), so a reader never sees half a file.
A failed write is logged once, removes the file (stale progress would mislead the next process more than
none) and is tried again at the next update: monitoring never stops a training run. The file is read
without following a final symlink or blocking on a FIFO, and written through a new temporary file of its own
(O_EXCL), never through one planted at its name.
Standard library only: this module runs inside training processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
import threading
import time
from typing import Any

log = logging.getLogger("gpumon.client")

WRITE_EVERY = 2.0  # seconds between writes while stepping: the most the next process's gap can start early
MAX_BYTES = 4096
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=-]")
_INCARNATION = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def state_path(directory: str, job: str, rank: int) -> str:
    """The file of (job, rank) in ``directory``: the job name made file-safe, with a hash of it so two jobs
    whose names differ only in unsafe characters do not share one."""
    digest = hashlib.sha256(job.encode()).hexdigest()[:8]
    return os.path.join(directory, f"gpumon-{_UNSAFE.sub('_', job)[:64]}-{digest}-rank{rank}.json")


def read_predecessor(path: str, incarnation: str, now: float) -> dict[str, Any] | None:
    """The report's ``predecessor`` from the file a previous process of the rank left, or None: none, not
    readable, not what this module writes, or from the future (a clock gone back, a file copied in)."""
    try:
        raw = _read_regular(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("gpumon: cannot read the rank state %s (%s): this restart is not linked", path, exc)
        return None
    if raw is None:
        log.warning("gpumon: the rank state %s is not a regular file; ignored", path)
        return None
    try:
        data = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        log.warning("gpumon: the rank state %s is not gpumon's; ignored", path)
        return None
    prev, step, last = data.get("incarnation"), data.get("step"), data.get("last_step")
    if not isinstance(last, (int, float)) or isinstance(last, bool):
        last = -1.0
    ok = (
        isinstance(prev, str)
        and _INCARNATION.match(prev) is not None
        and prev != incarnation
        and isinstance(step, int)
        and not isinstance(step, bool)
        and 0 <= step < 2**53
        and 1e9 <= last <= now
    )
    if not ok:
        log.warning("gpumon: the rank state %s is not valid; ignored", path)
        return None
    return {"incarnation": prev, "step": step, "last_step": float(last)}


def _read_regular(path: str) -> bytes | None:
    """At most MAX_BYTES + 1 bytes of ``path`` when it is a regular file, else None. Opened without blocking
    and without following a symlink at its last component: a FIFO or a device planted there must not hang
    the Reporter's constructor, nor a link lead it to read another file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)


class StateFile:
    """The rank's state file, written by this process."""

    def __init__(self, path: str, incarnation: str, predecessor: dict[str, Any] | None) -> None:
        self.path = path
        self.incarnation = incarnation
        self.predecessor = predecessor
        self._written_steps = -1
        self._written_at = 0.0
        self._warned = False
        self._lock = threading.Lock()  # the sender thread, and flush() or close() on the caller's

    def high_water(self, resumed_step: int | None, steps: int) -> int:
        """The rank's high-water global step: where this process resumed from (the checkpoint's step, else
        where its predecessor got) plus its own steps, never below the predecessor's mark."""
        before = self.predecessor["step"] if self.predecessor is not None else 0
        base = resumed_step if resumed_step is not None else before
        return max(before, base + steps)

    def update(self, resumed_step: int | None, steps: int, last_step: float | None, final: bool) -> None:
        """Write when the rank stepped since the last write, at most every WRITE_EVERY s but at the end."""
        with self._lock:
            self._update(resumed_step, steps, last_step, final)

    def _update(self, resumed_step: int | None, steps: int, last_step: float | None, final: bool) -> None:
        if last_step is None or steps == self._written_steps:
            return
        now = time.monotonic()
        if not final and now - self._written_at < WRITE_EVERY:
            return
        body = {
            "v": 1,
            "incarnation": self.incarnation,
            "step": self.high_water(resumed_step, steps),
            "last_step": last_step,
            "pid": os.getpid(),
        }
        temporary = f"{self.path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        try:
            # a new file of our own: never through a link or a file someone planted at the temporary name
            fd = os.open(
                temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644
            )
            with os.fdopen(fd, "w") as fh:
                json.dump(body, fh)
            os.replace(temporary, self.path)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "gpumon: cannot write the rank state %s (%s): until a write succeeds, a restart is not "
                    "linked", self.path, exc,
                )  # fmt: skip
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            # a file left from an earlier write would link the next process to stale progress (its time
            # booked twice, its redone steps missed): better none; the next update tries again
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self._written_at = now
            return
        self._written_steps = steps
        self._written_at = now
