"""Report a Hugging Face ``Trainer`` run to gpumon::

    from gpumon.client.integrations.huggingface import GpumonCallback
    trainer = Trainer(..., callbacks=[GpumonCallback(seq_len=2048, workload="llama-7b-sft")])

One ``Reporter.step()`` per optimizer step (``on_step_end``), with this rank's nominal samples and tokens:

- samples = ``args.train_batch_size`` (per-device batch x GPUs driven by this process) x
  ``args.gradient_accumulation_steps``. The Trainer's callbacks never see the batches, so a short last batch
  or accumulation window of an epoch is counted as full.
- tokens = ``tokens_per_step`` if given, else samples x ``seq_len`` if given (right for packed or padded
  fixed-length batches), else none: only samples are reported, and one info line says so.

Phases, host wall-clock between the Trainer's own hooks (no GPU sync is added): ``forward_backward`` from
``on_step_begin`` to ``on_pre_optimizer_step`` (all micro-batches, plus gradient clipping), ``optimizer`` from
there to ``on_optimizer_step``. Transformers versions without those two hooks report neither.

Evaluation and checkpointing (badput to the daemon's goodput ledger) and the resumed step, from the order of
events in ``Trainer._inner_training_loop`` (checked against transformers 5.24):

1. ``resume_from_checkpoint``'s trainer state is loaded, then ``on_train_begin``: ``state.global_step``
   there is the checkpoint's step (0 on a fresh run), sent as ``resumed_step`` (an owned Reporter is created
   with it, a caller's gets ``resume()``; a fresh run sends none). ``eval_on_start`` evaluates right after.
2. Per optimizer step: ``on_step_begin``, the micro-batches, ``on_pre_optimizer_step``, the optimizer step,
   ``on_optimizer_step``, ``global_step += 1``, ``on_step_end``; then ``_maybe_log_save_evaluate``, in this
   order: logging (the loss's ``.item()`` waits for the GPU, then ``on_log``); evaluation
   (``on_prediction_step`` per eval batch, ``on_log`` of the eval metrics, then ``on_evaluate``); saving
   (``_save_checkpoint``, then ``on_save``).
3. At each epoch's end: ``on_epoch_end``, then ``_maybe_log_save_evaluate`` again. Last, ``on_train_end``.

So ``evaluation`` is timed from the latest mark to ``on_evaluate`` (eval dataloader setup included) and
``checkpoint`` from the latest mark to ``on_save``. Marks: ``on_train_begin``, ``on_step_end``, a training
``on_log`` (after the GPU wait, which belongs to the step), ``on_epoch_end``, ``on_evaluate`` and ``on_save``;
the ``on_log`` an evaluation sends is not one. ``trainer.predict()`` during training (``on_predict``) counts
as evaluation. ``trainer.evaluate()`` outside ``train()`` is no run's badput and is not timed (except after a
``train()`` that raised: the Trainer has no exception hook to end the run on). The rest of the gap between
steps (logging) is not reported, and not as ``data_wait`` either.
"""

from __future__ import annotations

import logging
import time
from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:  # gpumon.client itself must work without transformers
    raise ImportError(
        f"gpumon.client.integrations.huggingface needs transformers: pip install transformers ({exc})"
    ) from exc

from gpumon.client import Reporter
from gpumon.client.integrations.owner import ReporterOwner

log = logging.getLogger(__name__)


class GpumonCallback(TrainerCallback, ReporterOwner):
    """Reports steps, samples, tokens and phases of this rank to its node's gpumon daemon.

    ``reporter``: an existing Reporter (flushed, not closed, at the end of training: its owner closes it).
    Otherwise one is created when training begins, from ``reporter_kwargs`` (job, workload, flops_per_token,
    model, url, ...) plus what the Trainer knows (rank, device, dtype) where not given, and closed at the end.
    """

    def __init__(
        self,
        reporter: Reporter | None = None,
        *,
        tokens_per_step: int | None = None,
        seq_len: int | None = None,
        **reporter_kwargs: Any,
    ) -> None:
        if tokens_per_step is not None and seq_len is not None:
            raise ValueError("give tokens_per_step or seq_len, not both")
        ReporterOwner.__init__(self, reporter, reporter_kwargs)
        self._tokens_per_step = tokens_per_step
        self._seq_len = seq_len
        self._samples = 0
        self._tokens = 0
        self._t_step: float | None = None
        self._t_opt: float | None = None
        self._mark: float | None = None  # the latest evaluation/checkpoint mark; None outside train()
        self._evaluating = False  # an evaluation's batches ran, its on_evaluate is still to come

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._samples = args.train_batch_size * args.gradient_accumulation_steps
        if self._tokens_per_step is not None:
            self._tokens = self._tokens_per_step
        elif self._seq_len is not None:
            self._tokens = self._samples * self._seq_len
        else:
            self._tokens = 0
            log.info("gpumon: neither tokens_per_step nor seq_len given: reporting samples only")
        # the checkpoint's step: the Trainer restored its state from resume_from_checkpoint before this hook
        resumed = state.global_step
        # a Reporter still open here is one a failed train() left behind: the Trainer has no exception hook
        if self._owned:
            dtype = _dtype(args, kwargs.get("model"))
            rank, world, local = args.process_index, args.world_size, args.local_process_index
            self._open(dtype, rank, world, local, args.device, resumed_step=resumed)
        else:
            self._resume(resumed)
        self._mark, self._evaluating = time.perf_counter(), False  # eval_on_start evaluates right after this

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._t_step, self._t_opt = time.perf_counter(), None

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.reporter is not None and self._t_step is not None:
            self._t_opt = time.perf_counter()
            self.reporter.add_phase("forward_backward", self._t_opt - self._t_step)

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.reporter is not None and self._t_opt is not None:
            self.reporter.add_phase("optimizer", time.perf_counter() - self._t_opt)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._t_step = self._t_opt = None
        if self.reporter is not None:
            self.reporter.step(tokens=self._tokens, samples=self._samples)
        self._set_mark()

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # a training log's loss.item() waited for the GPU to finish the step: not evaluation or checkpointing;
        # an evaluation logs its metrics before its on_evaluate, and that time is the evaluation's
        if not self._evaluating:
            self._set_mark()

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._mark is not None:
            self._evaluating = True

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._evaluating = False
        self._phase_since_mark("evaluation")

    def on_predict(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: Any,
        **kwargs: Any,
    ) -> None:
        # trainer.predict() run during training (a callback generating samples) is evaluation too
        self._evaluating = False
        self._phase_since_mark("evaluation")

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._phase_since_mark("checkpoint")

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._set_mark()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._mark, self._evaluating = None, False  # trainer.evaluate() from here on is not this run's
        self._close()

    def _set_mark(self) -> None:
        if self._mark is not None:  # None: not training, and nothing after this is this run's badput
            self._mark = time.perf_counter()

    def _phase_since_mark(self, name: str) -> None:
        """Add the time since the latest mark to phase ``name`` and mark now (only while training)."""
        if self._mark is None:
            return
        now = time.perf_counter()
        if self.reporter is not None:
            self.reporter.add_phase(name, now - self._mark)
        self._mark = now


def _dtype(args: TrainingArguments, model: Any) -> object:
    """The compute dtype: the mixed-precision flag if set, else TF32 if enabled, else the weights' dtype."""
    if args.bf16:
        return "bf16"
    if args.fp16:
        return "fp16"
    if getattr(args, "tf32", None):
        return "tf32"
    return getattr(model, "dtype", None)  # a torch.dtype (metadata, no device access): the SDK normalises it
