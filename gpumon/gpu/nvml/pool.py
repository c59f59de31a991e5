"""Daemon threads for NVML calls that may hang in the driver (the PCIe throughput pair)."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any


class DaemonPool:
    """A few daemon threads running calls for one GPU.

    concurrent.futures.ThreadPoolExecutor joins its threads at interpreter exit, so one PCIe call hung in
    the driver would keep the daemon from exiting on SIGTERM; daemon threads do not.
    """

    def __init__(self, name: str, size: int) -> None:
        self.size = size
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(size):
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            future, fn, args = self._queue.get()
            if future is None:
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the reader, which classifies it
                future.set_exception(exc)

    def shutdown(self) -> None:
        for _ in range(self.size):  # idle threads exit; one stuck in the driver ends with the process
            self._queue.put((None, None, None))
