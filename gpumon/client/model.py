"""Decoder-transformer shape arithmetic: parameter counts and model FLOPs per token.

Standard library only: the SDK imports this inside training processes to fill the report's
``flops_per_token`` (see protocol.py); the daemon-side estimator (gpumon/estimate/breakdown.py) builds on it.

FLOPs per token, with N the parameters that do matmul work per token (``non_embedding_parameters``), L layers,
H query heads, Q head dim, T sequence length:

``palm``      train 6·N + 12·L·H·Q·T, inference 2·N + 4·L·H·Q·T (PaLM, Chowdhery et al. 2022, appendix B;
              the convention torchtitan and nanoGPT use for MFU)
``megatron``  train 6·N + 6·L·H·Q·T, inference 2·N + 2·L·H·Q·T: a causal mask skips half of the score and
              attention-over-values products, so the attention term halves

6 = 2 FLOPs per multiply-add x 3 (the forward pass, plus a backward pass that costs twice the forward). The
conventions differ by a few percent at long context: a baseline must record which one it used (the report's
``flops_convention``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CONVENTIONS = ("palm", "megatron")
# the LLaMA reference code rounds the SwiGLU width up to a multiple of this
_FFN_MULTIPLE = 256


def _check_positive(owner: str, name: str, value: object) -> None:
    # bool is an int subclass; True layers is a bug, not one layer
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")


def default_ffn_hidden(hidden: int, gated_mlp: bool) -> int:
    """4·h for a plain MLP; for a gated (SwiGLU) MLP the LLaMA rule: 2/3 of 4·h (so the three matrices cost
    what two 4·h matrices would), rounded up to a multiple of 256."""
    if not gated_mlp:
        return 4 * hidden
    width = int(2 * 4 * hidden / 3)
    return _FFN_MULTIPLE * math.ceil(width / _FFN_MULTIPLE)


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer (LLaMA style unless the flags say otherwise).

    Defaults left as None are derived (see ``resolved_*``) rather than filled in, so that
    ``dataclasses.replace(spec, hidden=...)`` re-derives them instead of carrying stale values.

    Counted (``parameters``): token embedding; per layer the q, k, v, o projections (k and v with
    ``kv_heads`` heads: grouped-query attention), the MLP (3 matrices gated, 2 plain) and two norm weight
    vectors; the final norm; the output head unless tied to the embedding. No biases unless ``biases``
    (LLaMA, Mistral have none; GPT-2 has them on every linear and LayerNorm), and no position parameters
    unless ``learned_positions`` (RoPE has none; GPT-2 learns seq_len x hidden).
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None  # None: = heads (multi-head attention)
    head_dim: int | None = None  # None: hidden // heads
    ffn_hidden: int | None = None  # None: default_ffn_hidden(hidden, gated_mlp)
    gated_mlp: bool = True
    tied_embeddings: bool = False
    biases: bool = False
    learned_positions: bool = False
    name: str | None = None

    def __post_init__(self) -> None:
        owner = "ModelSpec"
        for field_name in ("layers", "hidden", "heads", "vocab", "seq_len"):
            _check_positive(owner, field_name, getattr(self, field_name))
        for field_name in ("kv_heads", "head_dim", "ffn_hidden"):
            value = getattr(self, field_name)
            if value is not None:
                _check_positive(owner, field_name, value)
        for field_name in ("gated_mlp", "tied_embeddings", "biases", "learned_positions"):
            if not isinstance(getattr(self, field_name), bool):
                raise ValueError(
                    f"{owner}.{field_name} must be true or false, got {getattr(self, field_name)!r}"
                )
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"{owner}.name must be a string or None, got {self.name!r}")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(
                f"{owner}: hidden ({self.hidden}) is not divisible by heads ({self.heads}); "
                "fix one of them or give head_dim explicitly"
            )
        if self.heads % self.resolved_kv_heads:
            raise ValueError(
                f"{owner}: heads ({self.heads}) must be a multiple of kv_heads ({self.resolved_kv_heads}): "
                "each key/value head serves a whole group of query heads"
            )

    @property
    def resolved_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def resolved_head_dim(self) -> int:
        return self.hidden // self.heads if self.head_dim is None else self.head_dim

    @property
    def resolved_ffn_hidden(self) -> int:
        return default_ffn_hidden(self.hidden, self.gated_mlp) if self.ffn_hidden is None else self.ffn_hidden

    def parameter_breakdown(self) -> dict[str, int]:
        """Parameters per component; the values sum to ``parameters()``."""
        h, L = self.hidden, self.layers
        q_width = self.heads * self.resolved_head_dim
        kv_width = self.resolved_kv_heads * self.resolved_head_dim
        ffn = self.resolved_ffn_hidden
        mlp_matrices = 3 if self.gated_mlp else 2
        attention = h * q_width + 2 * h * kv_width + q_width * h
        mlp = mlp_matrices * h * ffn
        norms = 2 * h  # two norms per layer (before attention, before the MLP), a weight vector each
        if self.biases:
            attention += q_width + 2 * kv_width + h
            mlp += (mlp_matrices - 1) * ffn + h
            norms += 2 * h  # LayerNorm's bias
        final_norm = 2 * h if self.biases else h
        return {
            "embedding": self.vocab * h,
            "position_embedding": self.seq_len * h if self.learned_positions else 0,
            "attention": L * attention,
            "mlp": L * mlp,
            "norms": L * norms + final_norm,
            "output_head": 0 if self.tied_embeddings else self.vocab * h,
        }

    def parameters(self) -> int:
        """Total parameters (a tied output head is the embedding matrix, counted once)."""
        return sum(self.parameter_breakdown().values())

    def non_embedding_parameters(self) -> int:
        """N in the FLOPs formulas: parameters minus the input token (and learned position) embeddings.

        An embedding is a lookup and does no matmul FLOPs, so it is left out (torchtitan's convention). With
        tied embeddings the shared matrix still multiplies every token's last hidden state into logits, so it
        stays in N as the output head: this differs from a plain ``parameters() - vocab·hidden`` there.
        """
        parts = self.parameter_breakdown()
        return (
            self.parameters()
            - parts["embedding"]
            - parts["position_embedding"]
            + (self.vocab * self.hidden if self.tied_embeddings else 0)
        )

    def attention_flops_term(self) -> int:
        """L·H·Q·T: the per-token attention size the conventions multiply by 12, 6, 4 or 2."""
        return self.layers * self.heads * self.resolved_head_dim * self.seq_len

    def flops_per_token(self, train: bool = True, convention: str = "palm") -> int:
        """Model FLOPs per token (training: forward + backward; inference: forward at context seq_len)."""
        if convention not in CONVENTIONS:
            raise ValueError(f"unknown FLOPs convention {convention!r}: use one of {', '.join(CONVENTIONS)}")
        n = self.non_embedding_parameters()
        attn = self.attention_flops_term()
        if train:
            return 6 * n + (12 if convention == "palm" else 6) * attn
        return 2 * n + (4 if convention == "palm" else 2) * attn


# Published hyperparameters (the models' config.json / papers). Parameter counts reproduce the published
# totals exactly: llama2-7b 6,738,415,616; llama2-13b 13,015,864,320; llama2-70b 68,976,648,192;
# llama3-8b 8,030,261,248; llama3-70b 70,553,706,496; mistral-7b 7,241,732,096; gpt2 124,439,808.
PRESETS: dict[str, ModelSpec] = {
    "llama2-7b": ModelSpec(
        layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, ffn_hidden=11008, name="llama2-7b"
    ),
    "llama2-13b": ModelSpec(
        layers=40, hidden=5120, heads=40, vocab=32000, seq_len=4096, ffn_hidden=13824, name="llama2-13b"
    ),
    "llama2-70b": ModelSpec(
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        vocab=32000,
        seq_len=4096,
        ffn_hidden=28672,
        name="llama2-70b",
    ),
    "llama3-8b": ModelSpec(
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        vocab=128256,
        seq_len=8192,
        ffn_hidden=14336,
        name="llama3-8b",
    ),
    "llama3-70b": ModelSpec(
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        vocab=128256,
        seq_len=8192,
        ffn_hidden=28672,
        name="llama3-70b",
    ),
    # Mistral 7B (Jiang et al. 2023, table 1): context 8192 with a 4096-token sliding window, so the
    # full-attention T term overstates its attention FLOPs beyond 4096 tokens.
    "mistral-7b": ModelSpec(
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        vocab=32000,
        seq_len=8192,
        ffn_hidden=14336,
        name="mistral-7b",
    ),
    # GPT-2 small: GeLU MLP (4h), LayerNorm and linear biases, learned positions, output head tied.
    "gpt2": ModelSpec(
        layers=12,
        hidden=768,
        heads=12,
        vocab=50257,
        seq_len=1024,
        gated_mlp=False,
        tied_embeddings=True,
        biases=True,
        learned_positions=True,
        name="gpt2",
    ),
}


def preset(name: str) -> ModelSpec:
    """The preset called ``name`` (case-insensitive); ValueError naming the known ones otherwise."""
    spec = PRESETS.get(name.strip().lower())
    if spec is None:
        raise ValueError(f"unknown model preset {name!r}: known presets are {', '.join(PRESETS)}")
    return spec
