"""The Reporter half every framework callback shares: report through the caller's Reporter, or own one.

An owned Reporter is created when training starts, not with the callback (a Reporter holds a thread, and
frameworks copy or pickle callbacks to workers), from the caller's keyword arguments over what the framework
knows (rank, device, dtype); it is closed when training ends, so a second run is a new incarnation. When the
process already has a live Reporter of that (job, rank) (the training loop's own), the owned one is a second
handle on it: the callback counts into its counters, and closing the handle leaves it running. A Reporter
the caller passed in is only flushed: its owner closes it. Standard library only.

Badput phases are held open live (``_hold``): the Reporter reports a running phase in every report
(``open_phases``), so the daemon's goodput ledger counts an evaluation or checkpoint while it runs; time
added only after the fact would come too late once the ledger has called the gap a stall. A callback holds
one phase at a time (so phases stay disjoint), on the Reporter's own cached Phase timer, from the framework's
hooks on the training-loop thread (the thread a Phase belongs to); every phase entered is left exactly once,
at the latest when the Reporter is replaced, closed or flushed at the end of training.

``data_wait`` is held the same way, between the framework's last hook before it fetches the next batch and
the hook that receives it (``_await_batch`` and ``_batch_arrived``), so that a long wait (a DataLoader's
workers starting at an epoch's start) is counted while it lasts, not taken for a stall. That span is only a
wait when the batch does arrive: whatever hook comes first instead (a validation, a save, the epoch's end)
shows it was something else, and leaving it any other way than ``_batch_arrived`` discards its time.
"""

from __future__ import annotations

from typing import Any

from gpumon.client import Reporter
from gpumon.client.phases import NullPhase, Phase
from gpumon.client.reporter import callback_reporter

DATA_WAIT = "data_wait"


class ReporterOwner:
    def __init__(self, reporter: Reporter | None, reporter_kwargs: dict[str, Any]) -> None:
        if reporter is not None and reporter_kwargs:
            raise ValueError(f"reporter given: {sorted(reporter_kwargs)} would be ignored")
        self.reporter = reporter
        self._owned = reporter is None
        self._kwargs = reporter_kwargs
        # the phase this callback holds open now, with the timer it entered (left on that very object, even
        # if the Reporter changes in between)
        self._held: tuple[str, Phase | NullPhase] | None = None

    @property
    def held_phase(self) -> str | None:
        """The name of the phase this callback holds open now, if any."""
        held = self._held
        return None if held is None else held[0]

    def _hold(self, name: str | None) -> None:
        """Hold phase ``name`` open (None: none), leaving the one held before first, so two never overlap
        (a ``data_wait`` left this way is discarded, see the module's docstring). Holding the phase already
        held changes nothing (it is not entered twice)."""
        held = self._held
        if held is not None:
            if held[0] == name:
                return
            self._held = None
            if held[0] == DATA_WAIT:
                held[1]._discard()
            else:
                held[1].__exit__(None, None, None)
        if name is not None and self.reporter is not None:
            phase = self.reporter.phase(name)
            phase.__enter__()
            self._held = (name, phase)

    def _await_batch(self) -> None:
        """From now on the loop may be fetching its next batch: hold ``data_wait``, its clock (re)started
        here, since whatever ran before this hook was no fetch."""
        if self.held_phase == DATA_WAIT:
            self._hold(None)
        self._hold(DATA_WAIT)

    def _batch_arrived(self) -> None:
        """The batch is here: the time since the last hook before it was the wait for it."""
        held = self._held
        if held is not None and held[0] == DATA_WAIT:
            self._held = None
            held[1].__exit__(None, None, None)

    def _open(
        self, dtype: object, rank: int, world_size: int, local_rank: int, device: Any, resumed_step: int = 0
    ) -> None:
        """A new owned Reporter from the framework's view (``device`` only if it is a CUDA device;
        ``resumed_step``, the global step restored from a checkpoint, only when resuming)."""
        self._hold(None)  # left on the Reporter it was entered on, before that one's final report
        if self.reporter is not None:  # the previous run raised past every hook that would have closed it
            self.reporter.close()
        defaults: dict[str, Any] = {"dtype": dtype}
        if world_size > 1:
            defaults.update(rank=rank, world_size=world_size, local_rank=local_rank)
        if getattr(device, "type", None) == "cuda":
            defaults["device"] = device  # mapped to an NVML GPU through CUDA_VISIBLE_DEVICES by the SDK
        if resumed_step > 0:  # a fresh run sends no resumed_step at all, as an SDK without the field would
            defaults["resumed_step"] = resumed_step
        self.reporter = callback_reporter(**{**defaults, **self._kwargs})

    def _resume(self, step: int) -> None:
        """Tell the caller's Reporter the global step this run resumed from (an owned one got it from _open).
        Not on a fresh run: whatever the caller set themselves stands."""
        if not self._owned and step > 0 and self.reporter is not None:
            self.reporter.resume(step)

    def _close(self) -> None:
        self._hold(None)  # the final report must show no phase still running
        if self.reporter is None:
            return
        if self._owned:
            self.reporter.close()
            self.reporter = None
        else:
            self.reporter.flush()
