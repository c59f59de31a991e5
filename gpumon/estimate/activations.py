"""Stored activations of training a decoder transformer, per GPU: the bytes, and the formula as text.

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

from dataclasses import dataclass

CHECKPOINTING = ("none", "selective", "full")


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


def layer_formula(
    e: int,
    *,
    tp: int = 1,
    sequence_parallel: bool = False,
    checkpointing: str = "none",
    flash_attention: bool = False,
) -> str:
    """activation_bytes_per_layer() times L, as the text ``estimate`` shows next to the number."""
    t, sp = tp, sequence_parallel
    if checkpointing == "full":
        return f"L·{e}·s·b·h" + ("/t" if sp else "") + " (full recomputation: layer inputs only)"
    c = LayerActivationCoefficients.for_element_bytes(e)
    keep_scores = checkpointing == "none" and not flash_attention
    if sp or t == 1:
        whole = c.replicated + c.split
        per_t = "/t" if sp else ""
        if not keep_scores:
            return f"L·{whole}·s·b·h{per_t}"
        return f"L·s·b·h·({whole} + {c.score}·a·s/h){per_t}"
    inner = f"{c.replicated} + {c.split}/t" + (f" + {c.score}·a·s/(h·t)" if keep_scores else "")
    return f"L·s·b·h·({inner})"


def output_formula(e: int, *, tp: int = 1, sequence_parallel: bool = False) -> str:
    """output_activation_bytes() as text."""
    near = 1 + 2 * e
    if sequence_parallel:
        return f"s·b·h·({near} + 4·v/h)/t"
    return f"s·b·h·({near} + 4·v/h)" if tp == 1 else f"s·b·h·({near} + 4·v/(h·t))"


def attention_scores_bytes(
    layers: int,
    heads: int,
    s: int,
    b: int,
    *,
    tp: int = 1,
    checkpointing: str = "none",
    flash_attention: bool = False,
    element_bytes: int = 2,
) -> float:
    """The part of the layers' activations that is stored attention scores (0 with flash or recompute)."""
    if checkpointing != "none" or flash_attention:
        return 0.0
    c = LayerActivationCoefficients.for_element_bytes(element_bytes)
    return layers * c.score * heads * s * s * b / tp
