"""Per-GPU memory and FLOPs of training (and serving) a decoder transformer, from its shape alone.

Model state, bytes per parameter (weights, gradients, optimizer states):

==================  =======  =====  ============================================================
dtype               weights  grads  optimizer states
==================  =======  =====  ============================================================
bf16 / fp16 / fp8   2        2      adam(w): 12 = fp32 master 4 + m 4 + v 4 (ZeRO paper's K=12, 16 B in all);
                                    sgd: 8 = fp32 master 4 + momentum 4; none: 0
fp32                4        4      adam(w): 8 = m 4 + v 4; sgd: 4 = momentum; none: 0
==================  =======  =====  ============================================================

fp8 training is taken as Transformer Engine does it: bf16 parameters, fp8 only inside the matmuls. Tensor
parallelism (tp) divides all three by tp (norm weights are in fact replicated: a rounding error). ZeRO over
dp data-parallel ranks (Rajbhandari et al. 2020) divides optimizer states by dp from stage 1, gradients from
stage 2, weights from stage 3.

Activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), whose per-tensor accounting (section 4.1) stores, per layer and per s·b·h elements, with e
bytes per activation element (2 for 16-bit) and 1 byte per dropout-mask element:

* replicated across tensor-parallel ranks: both norms' inputs, the QKV and first-MLP inputs (4e), the two
  dropout masks (2): 4e + 2 = 10;
* split across tp: Q, K, V, the output projection's input, the GeLU's input and output (4h wide): 12e = 24;
* per a·s/h (the s x s attention scores): softmax output, dropout mask, dropout output: 2e + 1 = 5.

For e = 2 these reproduce the paper's table 2: s·b·h·(34 + 5·a·s/h) per layer without parallelism,
s·b·h·(10 + 24/t + 5·a·s/(h·t)) with tensor parallelism, s·b·h·(34 + 5·a·s/h)/t with sequence parallelism too;
selective recomputation drops the score term; full recomputation keeps the layer input, 2·s·b·h (÷t with
sequence parallelism). Section 4.3 adds, outside the layers (p = 1), the embedding dropout mask, the final
norm's and output projection's inputs and the fp32 logits: s·b·h·(5 + 4·v/h), ÷t with sequence parallelism.
FlashAttention (and PyTorch SDPA) never stores the scores, so ``flash_attention`` drops the score term as
selective recomputation does.

The paper's model is GPT-3 shaped (4h GeLU MLP, dropout, multi-head attention): for SwiGLU, GQA and no dropout
the figure is an approximation. docs/estimate.md lists what the estimate leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpumon.client.model import CONVENTIONS, ModelSpec

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # weights (and KV cache) when serving
DTYPES = tuple(DTYPE_BYTES)
OPTIMIZERS = ("adamw", "adam", "sgd", "none")
CHECKPOINTING = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
_OPTIMIZER_NOTE = {
    ("mixed", "adam"): "fp32 master + m + v",
    ("mixed", "sgd"): "fp32 master + momentum",
    ("fp32", "adam"): "m + v",
    ("fp32", "sgd"): "momentum",
}


def state_bytes_per_parameter(dtype: str, optimizer: str) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) bytes per parameter for training in ``dtype``."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
    if dtype == "fp32":
        return 4, 4, {"adamw": 8, "adam": 8, "sgd": 4, "none": 0}[optimizer]
    # mixed precision (fp8 included: bf16 parameters, fp8 inside the matmuls)
    return 2, 2, {"adamw": 12, "adam": 12, "sgd": 8, "none": 0}[optimizer]


def activation_element_bytes(dtype: str) -> int:
    """Bytes per stored activation: 4 for fp32 training; 2 for bf16, fp16 and fp8 (its stored activations
    stay 16-bit)."""
    return 4 if dtype == "fp32" else 2


@dataclass(frozen=True)
class LayerActivationCoefficients:
    """Bytes per s·b·h of one layer: ``replicated + split/t + score·a·s/(h·t)`` (see the module docstring)."""

    replicated: int
    split: int
    score: int

    @classmethod
    def for_element_bytes(cls, e: int) -> LayerActivationCoefficients:
        return cls(replicated=4 * e + 2, split=12 * e, score=2 * e + 1)


def activation_bytes_per_layer(
    s: int,
    b: int,
    h: int,
    a: int,
    *,
    tp: int = 1,
    sequence_parallel: bool = False,
    checkpointing: str = "none",
    flash_attention: bool = False,
    element_bytes: int = 2,
) -> float:
    """Stored activations of one transformer layer, bytes per GPU (Korthikanti et al. 2022, table 2)."""
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"unknown checkpointing {checkpointing!r}: use one of {', '.join(CHECKPOINTING)}")
    sbh = s * b * h
    if checkpointing == "full":
        return sbh * element_bytes / (tp if sequence_parallel else 1)
    c = LayerActivationCoefficients.for_element_bytes(element_bytes)
    score = 0.0 if checkpointing == "selective" or flash_attention else c.score * a * s / (h * tp)
    if sequence_parallel:
        return sbh * ((c.replicated + c.split) / tp + score)
    return sbh * (c.replicated + c.split / tp + score)


def output_activation_bytes(
    s: int, b: int, h: int, v: int, *, tp: int = 1, sequence_parallel: bool = False, element_bytes: int = 2
) -> float:
    """Activations outside the layers (Korthikanti et al. 2022, section 4.3, p = 1): the embedding dropout
    mask (1 B), the final norm's and output projection's inputs (e B each), fp32 logits (4 B per vocab entry,
    split across tp by the vocab-parallel output layer)."""
    sbh = s * b * h
    near = sbh * (1 + 2 * element_bytes)
    return (near / tp if sequence_parallel else near) + 4 * s * b * v / tp


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    """KV heads each tensor-parallel rank holds: split when tp divides them, else replicated one per rank."""
    if kv_heads % tp == 0:
        return kv_heads // tp
    if tp % kv_heads == 0:
        return 1
    raise ValueError(f"tensor parallel size {tp} neither divides nor is a multiple of kv_heads {kv_heads}")


def kv_cache_bytes(spec: ModelSpec, batch: int, element_bytes: int, tp: int = 1) -> int:
    """2 (K and V) · layers · kv_heads · head_dim · seq · batch · bytes, per GPU."""
    kv = kv_heads_per_gpu(spec.resolved_kv_heads, tp)
    return 2 * spec.layers * kv * spec.resolved_head_dim * spec.seq_len * batch * element_bytes


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
            ("flops convention", self.convention, CONVENTIONS),
        ]
        for name, value, allowed in choices:
            if value not in allowed or isinstance(value, bool):
                raise ValueError(f"{name} {value!r}: use one of {', '.join(map(str, allowed))}")
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
        if st.checkpointing != "none" or st.flash_attention:
            return 0.0
        c = LayerActivationCoefficients.for_element_bytes(activation_element_bytes(st.dtype))
        return sp.layers * c.score * sp.heads * sp.seq_len * sp.seq_len * st.batch / st.tp


def _layer_formula(setup: Setup, e: int) -> str:
    t, sp = setup.tp, setup.sequence_parallel
    if setup.checkpointing == "full":
        return f"L·{e}·s·b·h" + ("/t" if sp else "") + " (full recomputation: layer inputs only)"
    c = LayerActivationCoefficients.for_element_bytes(e)
    keep_scores = setup.checkpointing == "none" and not setup.flash_attention
    if sp or t == 1:
        whole = c.replicated + c.split
        per_t = "/t" if sp else ""
        if not keep_scores:
            return f"L·{whole}·s·b·h{per_t}"
        return f"L·s·b·h·({whole} + {c.score}·a·s/h){per_t}"
    inner = f"{c.replicated} + {c.split}/t" + (f" + {c.score}·a·s/(h·t)" if keep_scores else "")
    return f"L·s·b·h·({inner})"


def _output_formula(setup: Setup, e: int) -> str:
    near = 1 + 2 * e
    if setup.sequence_parallel:
        return f"s·b·h·({near} + 4·v/h)/t"
    return f"s·b·h·({near} + 4·v/h)" if setup.tp == 1 else f"s·b·h·({near} + 4·v/(h·t))"


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
    grads = per_gpu * gb / (st.dp if st.zero >= 2 else 1)
    opt = per_gpu * ob / (st.dp if st.zero >= 1 else 1)
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
    attn_coeff = {"palm": (12, 4), "megatron": (6, 2)}[st.convention]
    formulas = {
        "parameters": "V·h embedding + L·(q,k,v,o + MLP + 2 norms) + final norm + output head",
        "non_embedding_parameters": "N: parameters - input token (and position) embeddings",
        "parameters_per_gpu": "P/tp",
        "weights": f"P{tp_div}{shard(3)} x {wb} B",
        "gradients": f"P{tp_div}{shard(2)} x {gb} B",
        "optimizer_states": f"P{tp_div}{shard(1)} x {ob} B ({opt_note})",
        "activations": f"{_layer_formula(st, e)} + {_output_formula(st, e)} B (Korthikanti et al. 2022)",
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
