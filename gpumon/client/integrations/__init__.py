"""Thin adapters that report framework training loops to gpumon through :class:`gpumon.client.Reporter`.

Each lives in its own module and imports its framework there, so ``gpumon.client`` never pulls one in:

- ``gpumon.client.integrations.huggingface.GpumonCallback``: a ``transformers.TrainerCallback``
- ``gpumon.client.integrations.lightning.GpumonCallback``: a Lightning ``Callback``

Both report through ``owner.ReporterOwner``: the caller's Reporter, or one they own for the run.
"""
