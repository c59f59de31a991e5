"""The Reporter half every framework callback shares: report through the caller's Reporter, or own one.

An owned Reporter is created when training starts, not with the callback (a Reporter holds a thread, and
frameworks copy or pickle callbacks to workers), from the caller's keyword arguments over what the framework
knows (rank, device, dtype); it is closed when training ends, so a second run is a new incarnation. A
Reporter the caller passed in is only flushed: its owner closes it. Standard library only.
"""

from __future__ import annotations

from typing import Any

from gpumon.client import Reporter


class ReporterOwner:
    def __init__(self, reporter: Reporter | None, reporter_kwargs: dict[str, Any]) -> None:
        if reporter is not None and reporter_kwargs:
            raise ValueError(f"reporter given: {sorted(reporter_kwargs)} would be ignored")
        self.reporter = reporter
        self._owned = reporter is None
        self._kwargs = reporter_kwargs

    def _open(
        self, dtype: object, rank: int, world_size: int, local_rank: int, device: Any, resumed_step: int = 0
    ) -> None:
        """A new owned Reporter from the framework's view (``device`` only if it is a CUDA device;
        ``resumed_step``, the global step restored from a checkpoint, only when resuming)."""
        if self.reporter is not None:  # the previous run raised past every hook that would have closed it
            self.reporter.close()
        defaults: dict[str, Any] = {"dtype": dtype}
        if world_size > 1:
            defaults.update(rank=rank, world_size=world_size, local_rank=local_rank)
        if getattr(device, "type", None) == "cuda":
            defaults["device"] = device  # mapped to an NVML GPU through CUDA_VISIBLE_DEVICES by the SDK
        if resumed_step > 0:  # a fresh run sends no resumed_step at all, as an SDK without the field would
            defaults["resumed_step"] = resumed_step
        self.reporter = Reporter(**{**defaults, **self._kwargs})

    def _resume(self, step: int) -> None:
        """Tell the caller's Reporter the global step this run resumed from (an owned one got it from _open).
        Not on a fresh run: whatever the caller set themselves stands."""
        if not self._owned and step > 0 and self.reporter is not None:
            self.reporter.resume(step)

    def _close(self) -> None:
        if self.reporter is None:
            return
        if self._owned:
            self.reporter.close()
            self.reporter = None
        else:
            self.reporter.flush()
