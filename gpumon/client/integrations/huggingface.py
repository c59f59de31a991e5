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

``data_wait``: the time the loop waited for its batches, from the Trainer's last hook before it fetches them
to the ``on_step_begin`` that follows. The Trainer (5.x, ``get_batch_samples``) fetches all of an
optimizer step's ``gradient_accumulation_steps`` micro-batches before ``on_step_begin``, so every
micro-batch's fetch is in it; nothing is fetched between micro-batches. It holds the DataLoader's
``next()`` (the wait on its workers, or loading and collating in this process), accelerate's move of the
batch to the device, the count of the batch's label tokens, and what else runs in the loop after the last
hook (usually far shorter than a fetch). It runs from ``on_step_end`` (or ``on_epoch_end``), or from the
hook that ends what runs after it: a training ``on_log``, ``on_evaluate``, ``on_predict``, ``on_save``; an
epoch's first step from ``on_epoch_begin`` (the epoch's new iterator, its workers starting, and the first
fetch). Not counted: evaluation and saves (below), logging, the end of an epoch or of training (no batch
follows the last step): a span is counted only when ``on_step_begin`` ends it. It is held open live, so
a long wait is not taken for a stall; when another hook comes first, the time since the last one is
discarded (the daemon may have seen it running for part of a second, and then books that much of the next
wait less). With CUDA, anything in the fetch that waits for the GPU (a blocking copy, an ``.item()``)
waits for the previous step's kernels, and that time is counted too. Transformers versions that fetch
micro-batches one at a time inside the step show only the first micro-batch's fetch.

Evaluation and checkpointing are badput to the daemon's goodput ledger, which counts them as they run, so
both are held open live (the Reporter's ``evaluation`` and ``checkpoint`` phases entered when they start and
left when they end, never both at once): every report while one runs shows it in ``open_phases``, and a long
evaluation is not taken for a stall, as time added after the fact would be. They and the resumed step, from
the order of events in ``Trainer._inner_training_loop`` (checked against transformers 5.24):

1. ``resume_from_checkpoint``'s trainer state is loaded, then ``on_train_begin``: ``state.global_step``
   there is the checkpoint's step (0 on a fresh run), sent as ``resumed_step`` (an owned Reporter is created
   with it, a caller's gets ``resume()``; a fresh run sends none). ``eval_on_start`` evaluates right after.
2. Per optimizer step: ``on_step_begin``, the micro-batches, ``on_pre_optimizer_step``, the optimizer step,
   ``on_optimizer_step``, ``global_step += 1``, ``on_step_end``; then ``_maybe_log_save_evaluate``, in this
   order: logging (the loss's ``.item()`` waits for the GPU, then ``on_log``); evaluation if
   ``control.should_evaluate`` (``on_prediction_step`` per eval batch, ``on_log`` of the eval metrics, then
   ``on_evaluate``, once per eval dataset); saving if ``control.should_save`` (``_save_checkpoint``, then
   ``on_save``).
3. At each epoch's end: ``on_epoch_end``, then ``_maybe_log_save_evaluate`` again. Last, ``on_train_end``.

The Trainer has no hook before an evaluation or a save starts. But its callbacks run in list order,
``DefaultFlowCallback`` first (it sets ``should_evaluate`` and ``should_save`` in its ``on_step_end`` and
``on_epoch_end``) and the Trainer's ``callbacks`` after it, so this callback's ``on_step_end`` and
``on_epoch_end`` see what ``_maybe_log_save_evaluate`` is about to do:

- ``evaluation`` opens there (at ``on_train_begin`` with ``eval_on_start``) and closes at ``on_evaluate``.
  The logging before it is counted in it: on a GPU that includes the loss's ``.item()`` waiting for the
  step's last kernels.
- ``checkpoint`` opens at ``on_evaluate`` when a save follows the evaluation, else at the step's or epoch's
  end, and closes at ``on_save``. With ``save_strategy="best"`` the Trainer decides whether to save only
  after ``on_evaluate``: ``checkpoint`` opens there all the same, and when no save follows it closes at the
  next ``on_step_begin`` or ``on_epoch_begin`` (the next batches' loading counted with it, not as
  ``data_wait``) or ``on_train_end``.
- An evaluation no flag announced (a callback after this one set ``should_evaluate``; every eval dataset
  after the first; ``trainer.predict()`` during training, up to its ``on_predict``) opens at its first
  ``on_prediction_step``. A save no flag announced is added at its ``on_save``, after the fact (too late for
  the ledger if it ran past the stall threshold), from the latest ``on_step_end``, ``on_epoch_end``,
  ``on_evaluate``, ``on_predict`` or training ``on_log``.
- An announced evaluation or save that never comes (a callback after this one cleared the flag) is closed at
  the next ``on_step_begin``, ``on_epoch_begin`` or ``on_train_end``.

``trainer.evaluate()`` outside ``train()`` is no run's badput and is not timed. The Trainer has no exception
hook: a ``train()`` that raises inside an evaluation or save leaves that phase open until this callback's
next ``on_train_begin`` (a retry, ``auto_find_batch_size``'s too) or the Reporter's close (an owned one at
interpreter exit); an ``evaluate()`` in between is still counted as this run's.
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
from gpumon.client.integrations.owner import DATA_WAIT, ReporterOwner

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
        self._training = False  # from on_train_begin to on_train_end
        self._flow = False  # in the _maybe_log_save_evaluate after a step's or epoch's end
        self._eval_due = False  # an announced evaluation is still to come (its on_evaluate)
        self._save_due = False  # an announced save is still to come (its on_save)
        self._predicting = False  # unannounced eval batches ran: their on_evaluate or on_predict is to come
        self._mark = 0.0  # since when a save no flag announced would have run

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._hold(None)  # a phase a train() that raised left open ends here, on the Reporter it began on
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
        self._training, self._flow, self._save_due, self._predicting = True, False, False, False
        # not control.should_*: a resumed run may restore a TrainerControl saved with should_save set
        self._eval_due = bool(getattr(args, "eval_on_start", False))  # evaluates right after this hook
        self._mark = time.perf_counter()
        self._settle()

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._between()
        if self._training:
            self._await_batch()  # the epoch's iterator (its workers starting) and first batches come next

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._batch_arrived()
        self._between()
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
        self._announced(control)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._announced(control)

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # a training log's loss.item() waited for the GPU to finish the step: no unannounced save's time,
        # and no wait for data
        if self._training and self.held_phase in (None, DATA_WAIT):
            self._mark = time.perf_counter()
            if self.held_phase == DATA_WAIT:
                self._await_batch()

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # per eval batch: after the first, only these two reads
        if self._training and not self._predicting:
            self._predicting = True
            self._settle()

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self._training:  # trainer.evaluate() outside train()
            return
        self._eval_due = self._predicting = False
        if self._flow and getattr(args, "save_strategy", None) == "best":
            self._save_due = True  # the Trainer decides after this hook: a new best metric is saved now
        self._mark = time.perf_counter()
        self._settle()

    def on_predict(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: Any,
        **kwargs: Any,
    ) -> None:
        # trainer.predict() run during training (a callback generating samples) is evaluation too
        if not self._training:
            return
        self._predicting = False
        self._mark = time.perf_counter()
        self._settle()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self._training:
            return
        now = time.perf_counter()
        if self.held_phase in (None, DATA_WAIT) and self.reporter is not None:
            # a save no flag announced (a callback after this one asked for it): only after the fact; the
            # data_wait held meanwhile is discarded by _settle
            self.reporter.add_phase("checkpoint", now - self._mark)
        self._save_due = False
        self._mark = now
        self._settle()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # trainer.evaluate() from here on is not this run's
        self._training = self._flow = self._eval_due = self._save_due = self._predicting = False
        self._close()  # leaves a phase still held (an announced one that never came) before the final report

    def _announced(self, control: TrainerControl) -> None:
        """At a step's or epoch's end: what _maybe_log_save_evaluate does next, as DefaultFlowCallback (which
        runs before this callback) and any callback between set it in ``control``."""
        if not self._training:
            return
        self._flow = True
        self._eval_due, self._save_due = bool(control.should_evaluate), bool(control.should_save)
        self._mark = time.perf_counter()
        self._settle()

    def _between(self) -> None:
        """Between steps or epochs nothing announced is still to come: leave a phase one never came for."""
        self._flow = self._eval_due = self._save_due = self._predicting = False
        if self._held is not None:
            self._hold(None)

    def _settle(self) -> None:
        """Hold the phase running now: an evaluation (the Trainer's runs before its save), else a save,
        else the wait for the next step's batches (discarded unless one comes next)."""
        if self._eval_due or self._predicting:
            self._hold("evaluation")
        elif self._save_due:
            self._hold("checkpoint")
        elif self._training:
            self._await_batch()
        else:
            self._hold(None)


def _dtype(args: TrainingArguments, model: Any) -> object:
    """The compute dtype: the mixed-precision flag if set, else TF32 if enabled, else the weights' dtype."""
    if args.bf16:
        return "bf16"
    if args.fp16:
        return "fp16"
    if getattr(args, "tf32", None):
        return "tf32"
    return getattr(model, "dtype", None)  # a torch.dtype (metadata, no device access): the SDK normalises it
