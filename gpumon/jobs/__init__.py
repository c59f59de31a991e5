"""Training telemetry in the daemon: what training and inference processes report, and what it derives.

The flow: SDK report -> ``report`` (validate) -> ``store`` (per job and rank: totals, windows, expiry, limits)
-> ``window`` (rates) and ``gpus`` (the ranks' GPUs over the window) -> ``analysis`` (join with the GPU
snapshot: rates, MFU against ``peaks``, tokens/J) -> ``diagnosis`` (bottleneck, stragglers) -> ``collector``
(/metrics) and ``api`` (/v1/report, /v1/jobs, rendered by ``jobjson``); ``service`` assembles them from
settings. Each job's baseline comes from gpumon.baselines.
"""
