"""Every metric gpumon exposes: name, type, help, labels, unit and source, defined here and nowhere else.

The collector, the docs (``docs/metrics.md``, rendered by ``python -m gpumon.metrics``) and the tests all
read this table, so a rename cannot silently break one of them. One module per concern defines its rows;
the import order below is the order of the exposition and of the docs.
"""

from __future__ import annotations

# isort: off
from gpumon.metrics.registry import (
    ALL_DETAILS,
    DETAILS,
    GPU,
    PROCESS_METRICS,
    REGISTRY,
    Metric,
    render_markdown,
)
from gpumon.metrics.exporter import *  # noqa: F403
from gpumon.metrics.gpu import *  # noqa: F403
from gpumon.metrics.links import *  # noqa: F403
from gpumon.metrics.memory_errors import *  # noqa: F403
from gpumon.metrics.profiling import *  # noqa: F403
from gpumon.metrics.mig import *  # noqa: F403
from gpumon.metrics.events import *  # noqa: F403
from gpumon.metrics.processes import *  # noqa: F403
from gpumon.metrics.host import *  # noqa: F403
from gpumon.metrics.training import *  # noqa: F403
from gpumon.metrics.baselines import *  # noqa: F403
# isort: on

GPU_SCALARS = tuple(m for m in REGISTRY if m.field is not None)
# the two flows' halves of the registry: each collector describes and builds only its own
TRAINING_FLOW = tuple(m for m in REGISTRY if m.name.startswith(("gpumon_training_", "gpumon_ingest_")))
# the listener's own connections (gpumon.web.connections), counted apart from both flows
SERVING = tuple(m for m in REGISTRY if m.name.startswith("gpumon_http_"))
GPU_FLOW = tuple(m for m in REGISTRY if m not in TRAINING_FLOW and m not in SERVING)
BY_NAME = {m.name: m for m in REGISTRY}

__all__ = [
    "ALL_DETAILS",
    "BY_NAME",
    "DETAILS",
    "GPU",
    "GPU_FLOW",
    "GPU_SCALARS",
    "PROCESS_METRICS",
    "REGISTRY",
    "SERVING",
    "TRAINING_FLOW",
    "Metric",
    "render_markdown",
]
