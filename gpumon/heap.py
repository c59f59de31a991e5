"""Memory returns after a burst: glibc keeps what a burst of requests freed (a heap whose top is pinned by
one live block, a thread's arena) and RSS stays up for the life of the daemon, which on a node reads as a
leak. Measured on 8 simulated GPUs with a job: 400 requests of 37 KB URLs sent and closed at once left RSS
14.5 MiB up for good; returned, 3.5.

Two things, both glibc's own knobs and both without effect elsewhere (musl, macOS: no such symbols):
- at start, fewer arenas and a fixed mmap threshold, so a burst's large buffers (request lines, bodies,
  renders) come from mmap and go back when freed, rather than from arenas that keep them;
- on the server's tick, ``malloc_trim(0)`` once the heap holds more than ``TRIM_ABOVE`` free, at most
  every ``TRIM_EVERY`` seconds: after a burst, not during one, and never while idle."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger("gpumon.heap")

# mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# Every thread that allocates gets an arena of its own up to 8 per core (128 on a 16-core node), each
# keeping what it freed. The daemon's Python code allocates under the interpreter lock anyway, so two
# arenas cost no contention that matters.
ARENA_MAX = 2
# glibc raises its mmap threshold to the largest block freed (up to 32 MiB), after which a burst's large
# buffers come from the heap and stay there; fixing it keeps them on mmap
MMAP_THRESHOLD = 128 * 1024
TRIM_ABOVE = 4 * 1024 * 1024  # free bytes held in the heap before a trim is worth its walk
TRIM_EVERY = 5.0  # seconds between looks at the heap
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


class Heap:
    """glibc's allocator, where there is one."""

    def __init__(self, libc: ctypes.CDLL | None = None) -> None:
        if libc is None:
            name = ctypes.util.find_library("c")
            libc = ctypes.CDLL(name) if name else None
        self._trim: Callable[[int], int] | None = getattr(libc, "malloc_trim", None)
        self._mallopt: Callable[[int, int], int] | None = getattr(libc, "mallopt", None)
        self._info: Callable[[], _Mallinfo2] | None = None
        info = getattr(libc, "mallinfo2", None)  # glibc 2.33+; mallinfo's ints wrap past 2 GiB
        if info is not None:
            info.restype = _Mallinfo2
            info.argtypes = []
            self._info = info
        if self._trim is not None:
            self._trim.argtypes = [ctypes.c_size_t]  # type: ignore[attr-defined]
            self._trim.restype = ctypes.c_int  # type: ignore[attr-defined]

    @property
    def glibc(self) -> bool:
        return self._trim is not None and self._info is not None

    def tune(self) -> None:
        """Fewer arenas and a fixed mmap threshold; before the daemon starts its threads."""
        if self._mallopt is None:
            return
        for param, value in ((M_ARENA_MAX, ARENA_MAX), (M_MMAP_THRESHOLD, MMAP_THRESHOLD)):
            if not self._mallopt(param, value):
                log.debug("mallopt(%d, %d) refused", param, value)

    def free(self) -> int:
        """Bytes the heap holds that nothing uses (0 where this cannot be known)."""
        return int(self._info().fordblks) if self._info is not None else 0

    def trim(self) -> None:
        if self._trim is not None:
            self._trim(0)  # ctypes drops the interpreter lock for the call: only allocations wait on it


def resident() -> int:
    """This process's resident memory in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


class Trimmer:
    """Gives a burst's memory back: looking at most every ``every`` seconds (from a periodic tick), it trims
    once ``above`` bytes more are free in the heap than at the lowest it has seen since its last trim (a
    burst that ended), or the process is ``above`` bytes more resident than just after it (a burst that
    reused what the last trim gave back; glibc's free count does not move then). Never while idle: a trim
    returns pages but glibc still counts their bytes as free, so "much is free" alone would trim at every
    look."""

    def __init__(
        self,
        heap: Heap,
        *,
        above: int = TRIM_ABOVE,
        every: float = TRIM_EVERY,
        clock: Callable[[], float] = time.monotonic,
        rss: Callable[[], int] = resident,
    ) -> None:
        self.heap = heap
        self.above = above
        self.every = every
        self.clock = clock
        self.rss = rss
        self._next = clock() + every
        self._low_free = heap.free()
        self._low_rss = rss()
        self.trims = 0

    def tick(self) -> bool:
        """Trim if due; True when it did."""
        now = self.clock()
        if now < self._next or not self.heap.glibc:
            return False
        self._next = now + self.every
        free, rss = self.heap.free(), self.rss()
        self._low_free = min(self._low_free, free)
        self._low_rss = min(self._low_rss, rss)
        if free < self.above or (free - self._low_free < self.above and rss - self._low_rss < self.above):
            return False
        start = time.perf_counter()
        self.heap.trim()
        self.trims += 1
        self._low_free, self._low_rss = self.heap.free(), self.rss()
        log.debug(
            "returned a burst's memory in %.1f ms: resident %.1f -> %.1f MiB",
            (time.perf_counter() - start) * 1e3,
            rss / 2**20,
            self._low_rss / 2**20,
        )
        return True
