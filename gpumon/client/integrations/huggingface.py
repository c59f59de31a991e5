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
there to ``on_optimizer_step``. The gap between steps also holds logging, evaluation and checkpointing, so it
is not reported as ``data_wait``. Transformers versions without those two hooks report no phases.
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
        # a Reporter still open here is one a failed train() left behind: the Trainer has no exception hook
        if self._owned:
            dtype = _dtype(args, kwargs.get("model"))
            self._open(dtype, args.process_index, args.world_size, args.local_process_index, args.device)

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

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._close()


def _dtype(args: TrainingArguments, model: Any) -> object:
    """The compute dtype: the mixed-precision flag if set, else TF32 if enabled, else the weights' dtype."""
    if args.bf16:
        return "bf16"
    if args.fp16:
        return "fp16"
    if getattr(args, "tf32", None):
        return "tf32"
    return getattr(model, "dtype", None)  # a torch.dtype (metadata, no device access): the SDK normalises it
