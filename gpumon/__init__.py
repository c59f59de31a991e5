"""gpumon: a per-node GPU monitoring daemon and Prometheus exporter."""

__version__ = "0.1.0"
