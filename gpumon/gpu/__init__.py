"""GPU telemetry: backend → sampler → snapshot → collector."""
