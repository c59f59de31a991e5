"""gpumon estimate's text output: the estimate as tables with their formulas, and the --job comparison.

--json output is gpumon.estimate.breakdown.estimate_json plus estimate_job.compare, in base units; this module
is for people, in GiB and TFLOP.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpumon.cli.daemon_api import display_url
from gpumon.cli.estimate_args import shape_overrides
from gpumon.client.model import ModelSpec
from gpumon.estimate.breakdown import Estimate, Setup

KIB = 1024
GIB = 1024**3
_LEFT_OUT = (
    "not counted: CUDA context (~0.5-1 GiB per process), allocator caching and fragmentation, communication "
    "buffers, framework workspaces; see docs/estimate.md"
)


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
    overridden = shape_overrides(args)
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
    if st.offload != "none":
        parts.append(f"{st.offload} offloaded to the host")
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
        f"job {cmp['job']} ({display_url(url)}): the estimate (training, or serving for inference ranks) "
        "vs. the memory NVML reports used on each rank's GPUs",
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
