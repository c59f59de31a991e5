"""The memory and FLOPs estimator behind ``gpumon estimate``: per-GPU bytes of training or serving a decoder
transformer from its shape alone.

``breakdown`` (the estimate: model state, activations, KV cache and FLOPs for one setup), ``memory`` (model
state and KV cache formulas) and ``activations`` (stored activations, Korthikanti et al. 2022). The model's
shape, its presets and FLOPs per token are gpumon.client.model's, which the SDK needs with the standard
library alone.
"""
