"""Per-GPU memory besides activations: model state (weights, gradients, optimizer states) and the KV cache.

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

Serving holds the weights and the KV cache (K and V for every layer, KV head and position of the batch),
both in the serving dtype; tensor parallelism splits the KV heads, or replicates them when tp exceeds them.
"""

from __future__ import annotations

from gpumon.client.model import ModelSpec

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}  # weights (and KV cache) when serving
DTYPES = tuple(DTYPE_BYTES)
OPTIMIZERS = ("adamw", "adam", "sgd", "none")


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
