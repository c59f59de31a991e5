"""One GPU's worker thread: the only thread that calls the backend for that GPU, one read per request.

A call that hangs keeps this thread, and only it, stuck; the coordinator (gpumon.gpu.sampler) stops waiting
at its deadline, reports the GPU down and asks nothing more of it until the call returns.
"""

from __future__ import annotations

import threading
import time

from gpumon.gpu.backend import Backend, Device
from gpumon.gpu.types import ReadResult


class GpuWorker:
    """Owns one GPU: only this thread calls the backend for it."""

    def __init__(self, device: Device, backend: Backend, done: threading.Condition) -> None:
        self.device = device
        self.backend = backend
        self.done = done
        self.busy = False
        self.seq = 0
        self.deadline = 0.0
        self.result: ReadResult | BaseException | None = None
        self.result_seq = 0
        self.started = 0.0
        self.finished = 0.0
        self.reopen = False  # set by the coordinator while the GPU is down
        self.stopping = False
        self._go = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"gpumon-gpu-{device.info.index}", daemon=True
        )  # daemon: a call hung in the driver must not keep the process alive at exit
        self.thread.start()

    def request(self, seq: int, deadline: float, reopen: bool) -> None:
        self.seq, self.deadline, self.reopen, self.busy = seq, deadline, reopen, True
        self.started = time.monotonic()
        self._go.set()

    def stop(self) -> None:
        self.stopping = True
        self._go.set()

    def _run(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            if self.stopping:
                return
            result: ReadResult | BaseException
            try:
                if self.reopen:
                    self.backend.reopen(self.device)
                result = self.backend.read(self.device, self.deadline)
            except Exception as exc:  # handed to the coordinator, which counts and logs it
                result = exc
            with self.done:
                self.result, self.result_seq = result, self.seq
                self.finished = time.monotonic()
                self.busy = False
                self.done.notify_all()
