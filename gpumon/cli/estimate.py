"""gpumon estimate: per-GPU memory and FLOPs per token of training a transformer, from its shape.

Optionally (``--job``) set against what a running job's GPUs actually hold, as the local daemon reports it.
The formulas and their sources are in gpumon/training/estimate.py and docs/estimate.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any

from gpumon.cli.daemon_api import DaemonError, check_url, default_url, get_json, job_path
from gpumon.client.model import CONVENTIONS, PRESETS, ModelSpec, preset
from gpumon.config import ConfigError, Settings
from gpumon.training.estimate import (
    CHECKPOINTING,
    DTYPES,
    OPTIMIZERS,
    Estimate,
    Setup,
    estimate,
    estimate_json,
)

KIB = 1024
GIB = 1024**3
_SHAPE = ("layers", "hidden", "heads", "vocab", "seq")  # what a model without --model must give
_OPTIONAL_SHAPE = ("kv_heads", "head_dim", "ffn_hidden")
_FLAGS = ("gated_mlp", "tied_embeddings", "biases", "learned_positions")
_FIELD = {"seq": "seq_len"}  # flag dest -> ModelSpec field where they differ
_LEFT_OUT = (
    "not counted: CUDA context (~0.5-1 GiB per process), allocator caching and fragmentation, communication "
    "buffers, framework workspaces; see docs/estimate.md"
)


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
        "--flash-attention",
        action="store_true",
        help="attention kernels that never store the s x s scores (FlashAttention, PyTorch SDPA)",
    )
    t.add_argument(
        "--zero", choices=("0", "1", "2", "3"), default="0", help="ZeRO / FSDP sharding stage over --dp"
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
            dp=_int(args.dp, "--dp") or 1,
            tp=_int(args.tp, "--tp") or 1,
            sequence_parallel=args.sequence_parallel,
            convention=args.flops_convention,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def run(settings: Settings, args: argparse.Namespace) -> int:
    spec = model_spec(args)
    st = setup(args)
    try:
        est = estimate(spec, st)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    comparison = None
    url = args.daemon_url or default_url()
    if args.job is not None:
        timeout = _timeout(args.fetch_timeout)
        check_url(url)  # a bad --url is a usage error (2) before anything is fetched
        comparison = compare(est, args.job, fetch_job(url, args.job, timeout))
    if args.json:
        out = estimate_json(est)
        if comparison is not None:
            out["job"] = comparison
        print(json.dumps(out, indent=2))
    else:
        print(render(est, args))
        if comparison is not None:
            print()
            print(render_comparison(comparison, url))
    return 0


# --- the running job -------------------------------------------------------------------------------------


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"--fetch-timeout: expected a positive number of seconds, got {text!r}")
    return value


def fetch_job(base: str, job: str, timeout: float) -> dict[str, Any]:
    """The daemon's ``GET /v1/jobs/{job}``. Raises DaemonError (exit 1) with a one-line reason."""
    path = job_path(job)
    data = get_json(
        base,
        path,
        timeout=timeout,
        missing=f"the daemon at {base} does not know job {job!r} (a job appears once its processes report "
        "through the gpumon SDK)",
    )
    if not isinstance(data.get("ranks"), list):
        raise DaemonError(f"the daemon answered {base.rstrip('/')}{path} without a list of ranks")
    return data


def _bytes(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _sharers(gpu: dict[str, Any]) -> int:
    n = gpu.get("shared_by_ranks")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def compare(est: Estimate, job: str, data: dict[str, Any]) -> dict[str, Any]:
    """Per rank: the estimate (per GPU x the rank's GPUs; training or serving by the rank's ``kind``) against
    the memory NVML says those GPUs use. A GPU that n ranks share counts 1/n of its memory against each."""
    per_gpu = {"train": est.train_total_bytes, "inference": est.inference_total_bytes}
    ranks = []
    for entry in data["ranks"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("gpus"), list):
            raise DaemonError(f"the daemon's answer for job {job!r} has a rank without a list of GPUs")
        kind = next((k for k in (entry.get("kind"), data.get("kind")) if k in per_gpu), "train")
        gpus = [g for g in entry["gpus"] if isinstance(g, dict)]
        used = [_bytes(g.get("memory_used_bytes")) for g in gpus]
        total = [_bytes(g.get("memory_total_bytes")) for g in gpus]
        shares = [_sharers(g) for g in gpus]
        actual = None
        if gpus and all(u is not None for u in used):
            actual = sum(u / n for u, n in zip(used, shares, strict=True) if u is not None)
        capacity = None
        if gpus and all(t is not None for t in total):
            capacity = sum(t / n for t, n in zip(total, shares, strict=True) if t is not None)
        estimated = per_gpu[kind] * len(gpus)
        ranks.append(
            {
                "rank": entry.get("rank"),
                "kind": kind,
                "gpus": [g.get("uuid") for g in gpus],
                "shared": any(n > 1 for n in shares),
                "estimated_bytes": estimated,
                "actual_bytes": actual,
                "memory_total_bytes": capacity,
                "ratio": actual / estimated if actual is not None and estimated > 0 else None,
            }
        )
    ranks.sort(key=lambda r: r["rank"] if isinstance(r["rank"], int) else -1)
    return {
        "job": job,
        "estimated_per_gpu_bytes": {"train": per_gpu["train"], "inference": per_gpu["inference"]},
        "ranks": ranks,
    }


# --- text ------------------------------------------------------------------------------------------------


def human_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", KIB)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} B"


def human_flops(value: float) -> str:
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} FLOP"


def human_count(value: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f}"


def _describe_model(spec: ModelSpec, args: argparse.Namespace) -> str:
    mlp = f"{'gated (SwiGLU)' if spec.gated_mlp else 'plain'} MLP {spec.resolved_ffn_hidden}"
    extras = [
        x
        for x, on in (
            ("tied embeddings", spec.tied_embeddings),
            ("biases", spec.biases),
            ("learned positions", spec.learned_positions),
        )
        if on
    ]
    name = spec.name or "custom"
    overridden = [
        f"{_flag(d)} {getattr(args, d)}" for d in (*_SHAPE, *_OPTIONAL_SHAPE) if getattr(args, d) is not None
    ]
    if args.model is not None and overridden:
        name += f" with {' '.join(overridden)}"
    return (
        f"{name}: {spec.layers} layers, hidden {spec.hidden}, {spec.heads} heads "
        f"({spec.resolved_kv_heads} KV, head dim {spec.resolved_head_dim}), {mlp}, vocab {spec.vocab}, "
        f"seq {spec.seq_len}" + (f", {', '.join(extras)}" if extras else "")
    )


def _describe_setup(st: Setup) -> str:
    parts = [st.dtype, st.optimizer, f"micro-batch {st.batch}", f"checkpointing {st.checkpointing}"]
    if st.flash_attention:
        parts.append("flash attention")
    parts += [f"ZeRO-{st.zero}", f"dp {st.dp}", f"tp {st.tp}"]
    if st.sequence_parallel:
        parts.append("sequence parallel")
    return ", ".join(parts)


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    return [f"  {a.ljust(w0)}  {b.rjust(w1)}  {c}".rstrip() for a, b, c in rows]


def render(est: Estimate, args: argparse.Namespace) -> str:
    f = est.formulas
    st = est.setup
    lines = [
        f"model: {_describe_model(est.spec, args)}",
        f"setup: {_describe_setup(st)}",
        "",
        "parameters",
        *_table(
            [
                ("total", human_count(est.parameters), f["parameters"]),
                ("non-embedding", human_count(est.non_embedding_parameters), f["non_embedding_parameters"]),
            ]
            + (
                [("per GPU", human_count(est.parameters_per_gpu), f["parameters_per_gpu"])]
                if st.tp > 1
                else []
            )
        ),
        "",
        "training memory, per GPU",
        *_table(
            [
                ("weights", human_bytes(est.weights_bytes), f["weights"]),
                ("gradients", human_bytes(est.gradients_bytes), f["gradients"]),
                ("optimizer states", human_bytes(est.optimizer_states_bytes), f["optimizer_states"]),
                ("activations", human_bytes(est.activations_bytes), f["activations"]),
                ("total", human_bytes(est.train_total_bytes), "sum of the above"),
            ]
        ),
        "",
        f"inference memory, per GPU ({st.dtype} weights and KV cache, batch {st.batch} x seq "
        f"{est.spec.seq_len})",
        *_table(
            [
                ("weights", human_bytes(est.inference_weights_bytes), f["inference_weights"]),
                ("KV cache", human_bytes(est.kv_cache_bytes), f["kv_cache"]),
                ("total", human_bytes(est.inference_total_bytes), "sum of the above"),
            ]
        ),
        "",
        f"FLOPs per token ({st.convention} convention, T = {est.spec.seq_len})",
        *_table(
            [
                ("training", human_flops(est.train_flops_per_token), f["train_flops_per_token"]),
                ("inference", human_flops(est.inference_flops_per_token), f["inference_flops_per_token"]),
            ]
        ),
        "",
    ]
    scores = est.attention_scores_bytes
    if est.activations_bytes > 0 and scores / est.activations_bytes >= 0.25:
        lines.append(
            f"note: {scores / est.activations_bytes:.0%} of the activations are stored attention scores; "
            "FlashAttention and PyTorch SDPA never store them (--flash-attention)"
        )
    lines.append(_LEFT_OUT)
    return "\n".join(lines)


def render_comparison(cmp: dict[str, Any], url: str) -> str:
    lines = [
        f"job {cmp['job']} ({url}): the estimate (training, or serving for inference ranks) vs. the memory "
        "NVML reports used on each rank's GPUs",
        "(used memory includes every process on the GPU and its CUDA context)",
    ]
    header = ("RANK", "KIND", "GPUS", "ESTIMATED", "USED", "GPU MEMORY", "USED/ESTIMATED")
    rows = [header]
    for r in cmp["ranks"]:
        rows.append(
            (
                "?" if r["rank"] is None else str(r["rank"]),
                str(r["kind"]),
                str(len(r["gpus"])) + ("*" if r["shared"] else ""),
                human_bytes(r["estimated_bytes"]),
                human_bytes(r["actual_bytes"]),
                human_bytes(r["memory_total_bytes"]),
                "-" if r["ratio"] is None else f"{r['ratio']:.2f}",
            )
        )
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if not cmp["ranks"]:
        lines.append("(the job has no ranks reporting)")
    if any(r["shared"] for r in cmp["ranks"]):
        lines.append("* a GPU other ranks share: this rank is counted 1/n of its used and total memory")
    return "\n".join(lines)
