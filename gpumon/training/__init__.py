"""Training telemetry: what training and inference processes report, and what the daemon derives from it.

The flow: SDK report -> ``report`` (validate) -> ``store`` (per job and rank: totals, windows, expiry, limits)
-> ``analysis`` (join with the GPU snapshot: rates, MFU, tokens/J) -> ``diagnosis`` (bottleneck, stragglers)
-> ``collector`` (/metrics) and ``api`` (/v1/report, /v1/jobs).
"""
