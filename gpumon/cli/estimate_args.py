"""gpumon estimate's flags: their definitions, and the ModelSpec and Setup they describe.

A bad value is a ConfigError (exit 2) naming the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from gpumon.client.model import CONVENTIONS, PRESETS, ModelSpec, preset
from gpumon.config import ConfigError
from gpumon.estimate.breakdown import CHECKPOINTING, DTYPES, OFFLOADS, OPTIMIZERS, ZERO_STAGES, Setup

_SHAPE = ("layers", "hidden", "heads", "vocab", "seq")  # what a model without --model must give
_OPTIONAL_SHAPE = ("kv_heads", "head_dim", "ffn_hidden")
_FLAGS = ("gated_mlp", "tied_embeddings", "biases", "learned_positions")
_FIELD = {"seq": "seq_len"}  # flag dest -> ModelSpec field where they differ


def add_arguments(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group(
        "model (a preset, explicit shape flags, or a preset with some flags overriding it)"
    )
    m.add_argument("--model", metavar="PRESET", help=f"one of {', '.join(PRESETS)}")
    m.add_argument("--layers", metavar="N", help="transformer layers")
    m.add_argument("--hidden", metavar="N", help="model width h")
    m.add_argument("--heads", metavar="N", help="attention (query) heads")
    m.add_argument(
        "--kv-heads", metavar="N", help="key/value heads (grouped-query attention; default: --heads)"
    )
    m.add_argument("--head-dim", metavar="N", help="per-head width (default: hidden / heads)")
    m.add_argument("--vocab", metavar="N", help="vocabulary size")
    m.add_argument("--seq", metavar="N", help="sequence length (tokens per sample; the context when serving)")
    m.add_argument(
        "--ffn-hidden", metavar="N", help="MLP width (default: 4h, or the LLaMA SwiGLU rule when gated)"
    )
    m.add_argument(
        "--gated-mlp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="SwiGLU-style 3-matrix MLP (default: on, off for gpt2)",
    )
    m.add_argument(
        "--tied-embeddings",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="output head shares the embedding matrix (default: off)",
    )
    m.add_argument(
        "--biases",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="linear and LayerNorm biases, GPT-2 style (default: off)",
    )
    m.add_argument(
        "--learned-positions",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a learned seq x hidden position embedding (default: off; RoPE has none)",
    )
    t = p.add_argument_group("training setup")
    t.add_argument("--batch", metavar="N", default="1", help="micro-batch size per GPU (default 1)")
    t.add_argument("--dtype", choices=DTYPES, default="bf16", help="training precision (default bf16)")
    t.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="default adamw")
    t.add_argument(
        "--checkpointing",
        choices=CHECKPOINTING,
        default="none",
        help="activation recomputation (default none)",
    )
    t.add_argument(
        "--offload",
        choices=OFFLOADS,
        default="none",
        help="optimizer: the optimizer step on the host, gradients and optimizer states in host memory "
        "(DeepSpeed ZeRO-Offload; needs --zero 1 or more). Default none",
    )
    t.add_argument(
        "--flash-attention",
        action="store_true",
        help="attention kernels that never store the s x s scores (FlashAttention, PyTorch SDPA)",
    )
    t.add_argument(
        "--zero",
        choices=[str(z) for z in ZERO_STAGES],
        default="0",
        help="ZeRO / FSDP sharding stage over --dp",
    )
    t.add_argument("--dp", metavar="N", default="1", help="data-parallel size (default 1)")
    t.add_argument("--tp", metavar="N", default="1", help="tensor-parallel size (default 1)")
    t.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="Megatron sequence parallelism: split the rest of the activations across --tp too",
    )
    t.add_argument("--flops-convention", choices=CONVENTIONS, default="palm", help="default palm")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="machine-readable, in base units (bytes, FLOPs)")
    o.add_argument("--job", metavar="JOB", help="compare with the HBM a running job's GPUs use")
    o.add_argument(
        "--url",
        dest="daemon_url",
        metavar="URL",
        help="the daemon (default $GPUMON_URL or http://127.0.0.1:9478)",
    )
    o.add_argument(
        "--fetch-timeout", metavar="SECONDS", default="5", help="give up on the daemon after this long (5)"
    )


def _int(value: str | None, flag: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{flag}: expected a positive integer, got {value!r}") from None
    if number <= 0:
        raise ConfigError(f"{flag}: expected a positive integer, got {value!r}")
    return number


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The ModelSpec the flags describe: a preset, possibly overridden, or explicit shape flags."""
    given: dict[str, Any] = {}
    for dest in (*_SHAPE, *_OPTIONAL_SHAPE):
        value = _int(getattr(args, dest), _flag(dest))
        if value is not None:
            given[_FIELD.get(dest, dest)] = value
    for dest in _FLAGS:
        if getattr(args, dest) is not None:
            given[dest] = getattr(args, dest)
    try:
        if args.model is not None:
            return dataclasses.replace(preset(args.model), **given)
        missing = [_flag(d) for d in _SHAPE if _FIELD.get(d, d) not in given]
        if missing:
            raise ConfigError(
                f"give --model PRESET ({', '.join(PRESETS)}) or the model's shape: "
                f"missing {', '.join(missing)}"
            )
        return ModelSpec(**given)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def setup(args: argparse.Namespace) -> Setup:
    try:
        return Setup(
            batch=_int(args.batch, "--batch") or 1,
            dtype=args.dtype,
            optimizer=args.optimizer,
            checkpointing=args.checkpointing,
            flash_attention=args.flash_attention,
            zero=int(args.zero),
            offload=args.offload,
            dp=_int(args.dp, "--dp") or 1,
            tp=_int(args.tp, "--tp") or 1,
            sequence_parallel=args.sequence_parallel,
            convention=args.flops_convention,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def shape_overrides(args: argparse.Namespace) -> list[str]:
    """The shape flags given on the command line, as "--flag value" (what overrides a preset)."""
    return [
        f"{_flag(d)} {getattr(args, d)}" for d in (*_SHAPE, *_OPTIONAL_SHAPE) if getattr(args, d) is not None
    ]
