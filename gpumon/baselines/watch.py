"""The daemon's view of the baseline library: reloaded when the file changes, never fatal.

``gpumon baseline record`` (or an operator's editor, or a ConfigMap update) changes the file while the daemon
runs; checking its identity (inode, size, mtime) at most every CHECK_EVERY seconds picks that up without a
restart and without a read per scrape. A file that cannot be read or parsed is logged once per distinct
problem and flagged in gpumon_training_baseline_library_ok; the daemon keeps the baselines it had.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from gpumon.baselines.library import Library, LibraryError, load

log = logging.getLogger(__name__)
CHECK_EVERY = 2.0


class LibraryWatch:
    def __init__(self, path: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self.ok = True
        self.error: str | None = None
        self._library = Library()
        self._identity: tuple[int, int, int] | None = None
        self._checked = float("-inf")
        self._lock = threading.Lock()
        self.library()

    def library(self) -> Library:
        with self._lock:
            now = self.clock()
            if now - self._checked >= CHECK_EVERY:
                self._checked = now
                self._reload()
            return self._library

    def state(self) -> tuple[Library, bool, str | None]:
        """What a scrape shows of the library, as last read (without reading it): changes when a reload
        changed anything."""
        return self._library, self.ok, self.error

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._identity != (0, 0, 0):
                log.info("no baseline library at %s yet (gpumon baseline record creates it)", self.path)
            self._identity = (0, 0, 0)
            self._library, self.ok, self.error = Library(), True, None
            return
        except OSError as exc:
            self._fail(f"{self.path}: cannot stat: {exc}")
            return
        identity = (st.st_ino, st.st_size, st.st_mtime_ns)
        if identity == self._identity:
            return
        try:
            lib = load(self.path)
        except LibraryError as exc:
            self._identity = identity  # do not re-read (and re-log) an unchanged broken file
            self._fail(str(exc))
            return
        self._identity = identity
        self._library, self.ok, self.error = lib, True, None
        log.info("loaded %d baseline(s) from %s", len(lib.baselines), self.path)

    def _fail(self, message: str) -> None:
        if message != self.error:
            kept = len(self._library.baselines)
            log.error(
                "baseline library not loaded: %s (keeping the %d baseline(s) read before)", message, kept
            )
        self.ok, self.error = False, message
