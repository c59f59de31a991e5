"""gpumon's Grafana dashboards, generated from code: node, training job and fleet overview.

``python -m gpumon.dashboards`` writes them to ``grafana/dashboards/`` (``--check``: exit 1 when the
committed files differ). Tests and the end-to-end check use :func:`queries` (every panel query),
:func:`variable_queries` (what each template variable lists) and :func:`expand` (the PromQL Grafana
would send for given variable values).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpumon.dashboards import fleet, node, training
from gpumon.dashboards.builder import ALL_VALUE, JSON, Dashboard, render
from gpumon.dashboards.promql import expand, metric_names, uses_rate_interval

# file name -> the function building it; the uids inside are stable (links and bookmarks use them)
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "gpumon-node.json": node.dashboard,
    "gpumon-training.json": training.dashboard,
    "gpumon-fleet.json": fleet.dashboard,
}


@dataclass(frozen=True)
class Query:
    """One target of one panel: ``expr`` is as written in the dashboard (run it through :func:`expand`)."""

    dashboard: str  # the dashboard's uid
    panel: str  # the panel's title (unique within a dashboard)
    ref_id: str
    expr: str
    instant: bool = False


def build_all() -> dict[str, JSON]:
    """Every dashboard's JSON model, by file name."""
    return {name: build().to_json() for name, build in DASHBOARDS.items()}


def rendered() -> dict[str, str]:
    """Every dashboard's file content, exactly as committed."""
    return {name: render(model) for name, model in build_all().items()}


def _models(directory: Path | None) -> list[JSON]:
    if directory is None:
        return list(build_all().values())
    return [json.loads((directory / name).read_text()) for name in DASHBOARDS]


def queries(directory: Path | None = None) -> list[Query]:
    """Every target of every panel of every dashboard, in dashboard and panel order.

    By default from the code; with ``directory``, from the JSON files there (grafana/dashboards). The two
    are the same while the drift test passes."""
    out = []
    for model in _models(directory):
        for panel in model["panels"]:
            for target in panel.get("targets", []):
                out.append(
                    Query(model["uid"], panel["title"], target["refId"], target["expr"], target["instant"])
                )
    return out


_LABEL_VALUES = re.compile(r"label_values\((.+),\s*(\w+)\)")


def variable_queries(directory: Path | None = None) -> list[Query]:
    """Each ``label_values(selector, label)`` template variable as the PromQL ``count by (label) (selector)``,
    which returns data exactly when the variable would list values (``panel`` is the variable's name)."""
    out = []
    for model in _models(directory):
        for variable in model["templating"]["list"]:
            if variable["type"] != "query":
                continue
            match = _LABEL_VALUES.fullmatch(variable["definition"])
            if match is None:
                raise ValueError(f"{model['uid']}: variable {variable['name']} is not label_values(...)")
            expr = f"count by ({match.group(2)}) ({match.group(1)})"
            out.append(Query(model["uid"], variable["name"], "variable", expr, True))
    return out


__all__ = [
    "ALL_VALUE",
    "DASHBOARDS",
    "Query",
    "build_all",
    "expand",
    "metric_names",
    "queries",
    "rendered",
    "uses_rate_interval",
    "variable_queries",
]
