"""Per-GPU memory and FLOPs of training (and serving) a decoder transformer, from its shape alone.

The formulas, with their sources, are in memory.py (model state and KV cache) and activations.py
(Korthikanti et al. 2022); this module sets them against one model and setup. docs/estimate.md lists what
the estimate leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpumon.client.model import CONVENTIONS, ModelSpec
from gpumon.estimate.activations import (
    CHECKPOINTING,
    activation_bytes_per_layer,
    activation_element_bytes,
    attention_scores_bytes,
    layer_formula,
    output_activation_bytes,
    output_formula,
)
from gpumon.estimate.memory import (
    DTYPE_BYTES,
    DTYPES,
    OPTIMIZERS,
    kv_cache_bytes,
    kv_heads_per_gpu,
    state_bytes_per_parameter,
)

# the public API; several of its names live in memory.py and activations.py
__all__ = [
    "CHECKPOINTING",
    "DTYPES",
    "DTYPE_BYTES",
    "OFFLOADS",
    "OPTIMIZERS",
    "ZERO_STAGES",
    "Estimate",
    "Setup",
    "activation_bytes_per_layer",
    "estimate",
    "estimate_json",
    "kv_cache_bytes",
    "kv_heads_per_gpu",
    "output_activation_bytes",
    "state_bytes_per_parameter",
]

ZERO_STAGES = (0, 1, 2, 3)
# where the optimizer step runs: on the GPU, or on the host (DeepSpeed's ZeRO-Offload, offload_optimizer:
# cpu), which moves the gradients and the optimizer states to host memory and leaves the bf16 weights
OFFLOADS = ("none", "optimizer")
_OPTIMIZER_NOTE = {
    ("mixed", "adam"): "fp32 master + m + v",
    ("mixed", "sgd"): "fp32 master + momentum",
    ("fp32", "adam"): "m + v",
    ("fp32", "sgd"): "momentum",
}


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Setup:
    """How the model is trained: everything but its shape. ``batch`` is the micro-batch per GPU."""

    batch: int = 1
    dtype: str = "bf16"
    optimizer: str = "adamw"
    checkpointing: str = "none"
    flash_attention: bool = False
    zero: int = 0
    offload: str = "none"
    dp: int = 1
    tp: int = 1
    sequence_parallel: bool = False
    convention: str = "palm"

    def __post_init__(self) -> None:
        for name in ("batch", "dp", "tp"):
            _positive(name, getattr(self, name))
        choices: list[tuple[str, object, tuple[object, ...]]] = [
            ("dtype", self.dtype, DTYPES),
            ("optimizer", self.optimizer, OPTIMIZERS),
            ("checkpointing", self.checkpointing, CHECKPOINTING),
            ("zero", self.zero, ZERO_STAGES),
            ("offload", self.offload, OFFLOADS),
            ("flops convention", self.convention, CONVENTIONS),
        ]
        for name, value, allowed in choices:
            if value not in allowed or isinstance(value, bool):
                raise ValueError(f"{name} {value!r}: use one of {', '.join(map(str, allowed))}")
        if self.offload != "none" and self.zero == 0:
            raise ValueError("optimizer offload is part of ZeRO: needs a ZeRO stage of 1 or more")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError(
                "sequence parallelism splits activations across tensor-parallel ranks: needs tp > 1"
            )


@dataclass(frozen=True)
class Estimate:
    """Per-GPU bytes and per-token FLOPs; ``formulas`` names how each number was computed."""

    spec: ModelSpec
    setup: Setup
    parameters: int
    non_embedding_parameters: int
    parameters_per_gpu: float
    weights_bytes: float
    gradients_bytes: float
    optimizer_states_bytes: float
    activations_bytes: float
    inference_weights_bytes: float
    kv_cache_bytes: float
    train_flops_per_token: int
    inference_flops_per_token: int
    formulas: dict[str, str] = field(default_factory=dict)

    @property
    def train_total_bytes(self) -> float:
        return (
            self.weights_bytes + self.gradients_bytes + self.optimizer_states_bytes + self.activations_bytes
        )

    @property
    def inference_total_bytes(self) -> float:
        return self.inference_weights_bytes + self.kv_cache_bytes

    @property
    def attention_scores_bytes(self) -> float:
        """The part of ``activations_bytes`` that is stored attention scores (0 with flash or recompute)."""
        st, sp = self.setup, self.spec
        return attention_scores_bytes(
            sp.layers,
            sp.heads,
            sp.seq_len,
            st.batch,
            tp=st.tp,
            checkpointing=st.checkpointing,
            flash_attention=st.flash_attention,
            element_bytes=activation_element_bytes(st.dtype),
        )


def estimate(spec: ModelSpec, setup: Setup) -> Estimate:
    """Memory per GPU and FLOPs per token for training ``spec`` as ``setup`` says (and for serving it)."""
    if spec.heads % setup.tp:
        raise ValueError(f"tensor parallel size {setup.tp} must divide the number of heads ({spec.heads})")
    kv_heads_per_gpu(spec.resolved_kv_heads, setup.tp)  # raises when tp does not fit the KV heads
    st = setup
    total = spec.parameters()
    per_gpu = total / st.tp
    wb, gb, ob = state_bytes_per_parameter(st.dtype, st.optimizer)
    weights = per_gpu * wb / (st.dp if st.zero >= 3 else 1)
    host = st.offload == "optimizer"  # gradients and optimizer states live on the host
    grads = 0.0 if host else per_gpu * gb / (st.dp if st.zero >= 2 else 1)
    opt = 0.0 if host else per_gpu * ob / (st.dp if st.zero >= 1 else 1)
    e = activation_element_bytes(st.dtype)
    s, b, h, a, v = spec.seq_len, st.batch, spec.hidden, spec.heads, spec.vocab
    per_layer = activation_bytes_per_layer(
        s,
        b,
        h,
        a,
        tp=st.tp,
        sequence_parallel=st.sequence_parallel,
        checkpointing=st.checkpointing,
        flash_attention=st.flash_attention,
        element_bytes=e,
    )
    outside = output_activation_bytes(
        s, b, h, v, tp=st.tp, sequence_parallel=st.sequence_parallel, element_bytes=e
    )
    serve_bytes = DTYPE_BYTES[st.dtype]
    precision = "fp32" if st.dtype == "fp32" else "mixed"
    family = "adam" if st.optimizer in ("adam", "adamw") else st.optimizer
    opt_note = _OPTIMIZER_NOTE.get((precision, family), "no optimizer states")

    def shard(stage: int) -> str:
        return "/dp" if st.zero >= stage and st.dp > 1 else ""

    tp_div = "/tp" if st.tp > 1 else ""
    layers = layer_formula(
        e,
        tp=st.tp,
        sequence_parallel=st.sequence_parallel,
        checkpointing=st.checkpointing,
        flash_attention=st.flash_attention,
    )
    outputs = output_formula(e, tp=st.tp, sequence_parallel=st.sequence_parallel)
    attn_coeff = {"palm": (12, 4), "megatron": (6, 2)}[st.convention]
    formulas = {
        "parameters": "V·h embedding + L·(q,k,v,o + MLP + 2 norms) + final norm + output head",
        "non_embedding_parameters": "N: parameters - input token (and position) embeddings",
        "parameters_per_gpu": "P/tp",
        "weights": f"P{tp_div}{shard(3)} x {wb} B",
        "gradients": "0: on the host (optimizer offload)" if host else f"P{tp_div}{shard(2)} x {gb} B",
        "optimizer_states": "0: on the host (optimizer offload)"
        if host
        else f"P{tp_div}{shard(1)} x {ob} B ({opt_note})",
        "activations": f"{layers} + {outputs} B (Korthikanti et al. 2022)",
        "inference_weights": f"P{tp_div} x {serve_bytes} B",
        "kv_cache": f"2·L·kv_heads·head_dim·s·b x {serve_bytes} B"
        + (" (kv_heads per tp rank)" if st.tp > 1 else ""),
        "train_flops_per_token": f"6·N + {attn_coeff[0]}·L·H·Q·T ({st.convention})",
        "inference_flops_per_token": f"2·N + {attn_coeff[1]}·L·H·Q·T ({st.convention})",
    }
    return Estimate(
        spec=spec,
        setup=st,
        parameters=total,
        non_embedding_parameters=spec.non_embedding_parameters(),
        parameters_per_gpu=per_gpu,
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_states_bytes=opt,
        activations_bytes=spec.layers * per_layer + outside,
        inference_weights_bytes=per_gpu * serve_bytes,
        kv_cache_bytes=kv_cache_bytes(spec, st.batch, serve_bytes, st.tp),
        train_flops_per_token=spec.flops_per_token(train=True, convention=st.convention),
        inference_flops_per_token=spec.flops_per_token(train=False, convention=st.convention),
        formulas=formulas,
    )


def estimate_json(est: Estimate) -> dict[str, Any]:
    """Machine-readable, base units (bytes, FLOPs)."""
    sp, st = est.spec, est.setup
    return {
        "model": {
            "name": sp.name,
            "layers": sp.layers,
            "hidden": sp.hidden,
            "heads": sp.heads,
            "kv_heads": sp.resolved_kv_heads,
            "head_dim": sp.resolved_head_dim,
            "ffn_hidden": sp.resolved_ffn_hidden,
            "vocab": sp.vocab,
            "seq_len": sp.seq_len,
            "gated_mlp": sp.gated_mlp,
            "tied_embeddings": sp.tied_embeddings,
            "biases": sp.biases,
            "learned_positions": sp.learned_positions,
        },
        "setup": {
            "micro_batch": st.batch,
            "dtype": st.dtype,
            "optimizer": st.optimizer,
            "checkpointing": st.checkpointing,
            "flash_attention": st.flash_attention,
            "zero": st.zero,
            "dp": st.dp,
            "tp": st.tp,
            "sequence_parallel": st.sequence_parallel,
            "flops_convention": st.convention,
        },
        "parameters": {
            "total": est.parameters,
            "non_embedding": est.non_embedding_parameters,
            "per_gpu": est.parameters_per_gpu,
        },
        "train": {
            "weights_bytes": est.weights_bytes,
            "gradients_bytes": est.gradients_bytes,
            "optimizer_states_bytes": est.optimizer_states_bytes,
            "activations_bytes": est.activations_bytes,
            "total_bytes": est.train_total_bytes,
        },
        "inference": {
            "weights_bytes": est.inference_weights_bytes,
            "kv_cache_bytes": est.kv_cache_bytes,
            "total_bytes": est.inference_total_bytes,
        },
        "flops_per_token": {
            "train": est.train_flops_per_token,
            "inference": est.inference_flops_per_token,
            "convention": st.convention,
        },
        "formulas": dict(est.formulas),
    }
