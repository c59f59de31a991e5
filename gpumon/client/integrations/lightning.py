"""Report a Lightning ``Trainer`` run to gpumon: ``L.Trainer(..., callbacks=[GpumonCallback(workload="my-lm",
tokens_from_batch=lambda batch: batch["input_ids"].numel())])``.

One ``Reporter.step()`` per optimizer step (when ``trainer.global_step`` advances) with this rank's samples
and tokens of all batches since the previous one (so every accumulated micro-batch counts). Samples per batch:
``samples_from_batch(batch)``, else Lightning's ``extract_batch_size`` (the first tensor's length). Tokens:
``tokens_per_step`` (constant per optimizer step) or ``tokens_from_batch(batch)``; neither: samples only, and
one info line says so. The callables run on every batch and must return Python ints read from shapes
(``.numel()``), never values (``.sum().item()`` waits for the GPU). The callback adds no GPU sync of its own.

Phases (host wall-clock): ``forward_backward`` from ``on_train_batch_start`` to ``on_before_optimizer_step``
(or the batch end when accumulating), ``optimizer`` from there to the batch end (both with automatic
optimization only). ``data_wait``: the time the loop waited for each batch, every accumulated micro-batch's
too, measured between hooks, from the last one before the fetch to the ``on_train_batch_start`` that
receives the batch:

- within an epoch from ``on_train_batch_end``, or from the end of what ran after it (this callback's
  ``on_validation_end``, a ``trainer.save_checkpoint`` returning): the DataLoader's ``next()`` (the wait on
  its workers, or loading and collating in this process without them), Lightning's ``batch_to_device``,
  and whatever else runs in the loop after those hooks (other callbacks' ``on_train_batch_end`` after
  this one, logging, learning-rate schedulers; usually far shorter than a fetch);
- an epoch's first batch from ``on_train_epoch_start``: the epoch's new DataLoader iterator (its workers
  starting) and its first fetch. The first epoch's iterator is made before ``on_train_start``, in the
  process's start-up;
- not validation (``on_validation_start`` to ``on_validation_end``), nor checkpoint saves, nor what ran
  before either of them in the gap, nor the end of an epoch (from the last batch to
  ``on_train_epoch_end``, where no batch is fetched): a span is counted only when a batch ends it.

It is held open live, like evaluation and checkpoint below, so a long wait is not taken for a stall; when
validation, a save or the epoch's end comes first, the time since the hook is discarded (the daemon may
have seen it running for part of a second, and then books that much of the next wait less). With CUDA,
anything in the gap that waits for the GPU (a blocking copy of a pageable batch, a logged ``.item()``)
waits for the previous step's kernels, and that time is counted too. Not seen: a ``training_step`` that
takes ``dataloader_iter`` and fetches inside the step (its fetches are in ``forward_backward``).

Evaluation and checkpointing are badput to the daemon's goodput ledger, which counts them as they run: both
are held open live (``reporter.evaluation()`` / ``reporter.checkpoint()`` entered when they start and left
when they end), so every report while one runs shows it in ``open_phases``, and a validation or save longer
than the ledger's stall threshold is not taken for a stall. The two never overlap. They and the resumed
step, from the order of events in ``Trainer.fit`` (checked against Lightning 2.6):

- ``ckpt_path``'s training state (loops included) is restored before the sanity check and
  ``on_train_start``: ``trainer.global_step`` there is the checkpoint's step (0 on a fresh run), sent as
  ``resumed_step`` (an owned Reporter is created with it, a caller's gets ``resume()``; a fresh run: none).
- ``evaluation``: open from ``on_validation_start`` to ``on_validation_end`` of each validation run during fit
  (after a batch's ``on_train_batch_end``, or at an epoch's end); not the sanity check (it runs before
  ``on_train_start``), nor ``trainer.validate()``.
- ``checkpoint``: Lightning has no hook around a checkpoint write, so ``trainer.save_checkpoint`` (which
  ``ModelCheckpoint`` and user code call) is wrapped on this Trainer instance from ``on_train_start`` to the
  end of fit (``teardown``, or ``on_exception``), and each call runs inside the phase, a failing one too (its
  exception goes on up). With an asynchronous ``CheckpointIO`` that is the time training was blocked. A save
  inside a validation (a callback's ``on_validation_epoch_end``, say) leaves ``evaluation`` for its duration
  and enters it again after; one inside a timed batch is taken out of the batch's phase. Lightning runs
  ``ModelCheckpoint`` after every other callback, so its saves in ``on_validation_end`` and ``on_train_end``
  (``save_last``) come after this callback's hooks: the Reporter is closed at ``teardown`` rather than
  ``on_train_end`` so the latter still counts. Saves a checkpoint callback makes in ``on_exception`` follow
  the final report: untimed.
- Every phase entered is left: at its end, a failing save's or validation's included (``on_exception``, then
  ``teardown``), and at the latest when the next fit on this callback starts.
"""

from __future__ import annotations

import functools
import importlib
import logging
import numbers
import time
from collections.abc import Callable
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]  # the standalone package, same API
    except ImportError as exc:  # gpumon.client itself must work without Lightning
        raise ImportError(f"gpumon's GpumonCallback needs Lightning: pip install lightning ({exc})") from exc

from gpumon.client import Reporter
from gpumon.client.integrations.owner import DATA_WAIT, ReporterOwner

log = logging.getLogger(__name__)
# Lightning's own batch-size inference (the first tensor's length), under either package name
_extract_batch_size = importlib.import_module(f"{pl.__name__}.utilities.data").extract_batch_size
# Trainer(precision=...) prefix -> report dtype ("bf16-mixed", "16-mixed", "32-true", ...)
_PRECISIONS = {"bf16": "bf16", "16": "fp16", "32": "fp32", "transformer": "fp8"}
_NOTHING = object()  # the Trainer had no save_checkpoint attribute of its own: only the class's method


class GpumonCallback(pl.Callback, ReporterOwner):
    """Reports this rank's steps, samples, tokens and phases. ``reporter``: the caller's own (flushed, not
    closed, at the end); else one is made at train start from ``reporter_kwargs`` (job, workload, model, url,
    flops_per_token...) plus the Trainer's rank, device and dtype where not given, and closed at the end."""

    def __init__(
        self,
        reporter: Reporter | None = None,
        *,
        tokens_per_step: int | None = None,
        tokens_from_batch: Callable[[Any], int] | None = None,
        samples_from_batch: Callable[[Any], int] | None = None,
        **reporter_kwargs: Any,
    ) -> None:
        if tokens_per_step is not None and tokens_from_batch is not None:
            raise ValueError("give tokens_per_step or tokens_from_batch, not both")
        ReporterOwner.__init__(self, reporter, reporter_kwargs)
        self._tokens_per_step = tokens_per_step
        self._tokens_from_batch = tokens_from_batch
        self._samples_from_batch = samples_from_batch or _extract_batch_size
        self._samples = self._tokens = self._last_global_step = 0
        self._mark: float | None = None  # start of the phase now running
        self._in_optimizer = self._phases = self._count_failed = self._running = False
        # (trainer, its own save_checkpoint attribute before ours or _NOTHING, our wrapper) while fit runs
        self._save_patch: tuple[Any, Any, Callable[..., Any]] | None = None
        self._patch_failed = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._hold(None)  # a phase an earlier fit left open (it raised past every hook) ends there
        self._samples = self._tokens = 0
        self._running = True
        self._last_global_step = trainer.global_step  # non-zero when resuming from a checkpoint
        self._phases = pl_module.automatic_optimization  # manual: optimizers step anywhere, no phase bounds
        if self._tokens_per_step is None and self._tokens_from_batch is None:
            log.info("gpumon: neither tokens_per_step nor tokens_from_batch given: reporting samples only")
        resumed = trainer.global_step
        if self._owned:
            dtype = _PRECISIONS.get(str(trainer.precision).split("-")[0])
            rank, world, local = trainer.global_rank, trainer.world_size, trainer.local_rank
            self._open(dtype, rank, world, local, pl_module.device, resumed_step=resumed)
        else:
            self._resume(resumed)
        self._wrap_save_checkpoint(trainer)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._running:
            self._await_batch()  # the epoch's iterator (its workers starting) and first batch come next

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._batch_arrived()
        self._mark, self._in_optimizer = time.perf_counter(), False

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if self._phases and self.reporter is not None and self._mark is not None:
            now = time.perf_counter()
            self.reporter.add_phase("forward_backward", now - self._mark)
            self._mark, self._in_optimizer = now, True

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.reporter is None:
            return
        if self._phases and self._mark is not None:
            phase = "optimizer" if self._in_optimizer else "forward_backward"
            self.reporter.add_phase(phase, time.perf_counter() - self._mark)
        self._mark = None
        self._samples += self._count(self._samples_from_batch, batch)
        if self._tokens_from_batch is not None:
            self._tokens += self._count(self._tokens_from_batch, batch)
        if trainer.global_step > self._last_global_step:  # an optimizer step happened in this batch
            self._last_global_step = trainer.global_step
            tokens = self._tokens_per_step if self._tokens_per_step is not None else self._tokens
            self.reporter.step(tokens=tokens, samples=self._samples)
            self._samples = self._tokens = 0
        if self._running:
            self._await_batch()

    def _count(self, count: Callable[[Any], int], batch: Any) -> int:
        try:
            value = count(batch)
            if isinstance(value, numbers.Integral) and value >= 0:  # a tensor is not: int() would sync
                return int(value)
            problem: object = f"returned {type(value).__name__}, not a Python int"
        except Exception as exc:  # a monitoring callback must not stop training over an odd batch
            problem = exc
        if not self._count_failed:
            self._count_failed = True
            log.warning("gpumon: %s cannot count a batch (%s): counting 0", count, problem)
        return 0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._running and not trainer.sanity_checking:
            self._hold("evaluation")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.held_phase == "evaluation":
            self._await_batch()  # the next batch, unless the epoch or the run ends (that discards it)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.held_phase == DATA_WAIT:
            self._hold(None)  # no batch came since the last one: the epoch's end was no wait for data

    # no on_train_end: ModelCheckpoint's (save_last) runs after it, and that save is this run's checkpoint too

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exc: BaseException) -> None:
        self._finish()  # teardown does not run when training fails: still send the final report

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._finish()

    def _finish(self) -> None:
        self._unwrap_save_checkpoint()
        if not self._running or self.reporter is None:  # on_exception and teardown may both run: finish once
            return
        self._running = False
        self._mark = None
        self._close()  # leaves a phase still open (a validation or save that raised) before the final report

    def _wrap_save_checkpoint(self, trainer: pl.Trainer) -> None:
        """Run every ``trainer.save_checkpoint`` call of this fit inside the checkpoint phase, through an
        attribute of this instance."""
        self._unwrap_save_checkpoint()  # a fit that ended past every hook that would have removed it
        try:
            original = getattr(trainer, "save_checkpoint", None)
            if not callable(original):  # not a Lightning Trainer (a test double): nothing to time
                return
            # a caller's own wrapper, if any, goes on running under ours, and comes back after fit
            before = vars(trainer).get("save_checkpoint", _NOTHING)

            @functools.wraps(original)
            def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
                patch = self._save_patch
                if not self._running or patch is None or patch[2] is not save_checkpoint:
                    return original(*args, **kwargs)  # not fitting, or an earlier fit's wrapper: pass it on
                before = self.held_phase  # evaluation (a save inside a validation), or checkpoint (nested)
                self._hold("checkpoint")
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:  # a failed save blocked training too; its exception goes on to the caller
                    if self._running and before != "checkpoint":  # else fit ended inside it, or it is nested
                        self._hold(before)
                        if self._mark is not None:  # a save inside a timed batch is not the batch's time too
                            self._mark += time.perf_counter() - start

            trainer.save_checkpoint = save_checkpoint  # type: ignore[method-assign]
            self._save_patch = (trainer, before, save_checkpoint)
        except Exception as exc:  # a monitoring callback must not stop training: go on without its times
            self._patch_warning("cannot time trainer.save_checkpoint", exc)

    def _unwrap_save_checkpoint(self) -> None:
        """Put the Trainer's save_checkpoint back as it was, once. A wrapper set over ours stays, and ours
        inside it then only passes calls on."""
        patch, self._save_patch = self._save_patch, None
        if patch is None:
            return
        trainer, before, wrapper = patch
        try:
            if vars(trainer).get("save_checkpoint") is wrapper:
                if before is _NOTHING:
                    del trainer.save_checkpoint  # the class's method again
                else:
                    trainer.save_checkpoint = before
        except Exception as exc:
            self._patch_warning("cannot restore trainer.save_checkpoint", exc)

    def _patch_warning(self, what: str, exc: Exception) -> None:
        if not self._patch_failed:
            self._patch_failed = True
            log.warning("gpumon: %s (%s): checkpoint time is not reported", what, exc)
