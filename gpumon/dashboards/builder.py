"""A small builder for Grafana's classic dashboard JSON model (schemaVersion 39, Grafana 10.4 and later).

Panels are plain dataclasses; :class:`Dashboard` lays them out on Grafana's 24-column grid and renders the
JSON. We keep our own builder rather than depend on ``grafana-foundation-sdk`` so that generating the
committed JSON needs nothing beyond the standard library, and so the output is byte-for-byte deterministic
(the drift test compares it with what is committed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

SCHEMA_VERSION = 39
GRID_WIDTH = 24
# Every panel and target queries the dashboard's data source variable, never a data source uid of ours: the
# uid differs in every Grafana, and a variable lets one dashboard switch between Prometheus servers.
DATASOURCE: JSON = {"type": "prometheus", "uid": "${datasource}"}
# What a multi-value variable set to All expands to. Grafana would otherwise write out every value as one
# long alternation, which breaks with hundreds of nodes and misses ones that appeared after the page loaded.
ALL_VALUE = ".*"
TAG = "gpumon"


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel. ``format`` is Grafana's: time_series, table (instant rows) or heatmap."""

    expr: str
    legend: str = ""
    format: str = "time_series"
    instant: bool = False

    def to_json(self, ref_id: str) -> JSON:
        return {
            "datasource": DATASOURCE,
            "editorMode": "code",
            "expr": self.expr,
            "format": self.format,
            "instant": self.instant,
            "legendFormat": self.legend or "__auto",
            "range": not self.instant,
            "refId": ref_id,
        }


@dataclass
class Panel:
    """A visualisation. ``defaults`` and ``options`` are merged over what the panel type needs."""

    type: str
    title: str
    description: str
    unit: str
    targets: tuple[Target, ...]
    width: int = 8
    height: int = 8
    options: JSON = field(default_factory=dict)
    defaults: JSON = field(default_factory=dict)
    overrides: list[JSON] = field(default_factory=list)
    transformations: list[JSON] = field(default_factory=list)

    def to_json(self, panel_id: int, x: int, y: int) -> JSON:
        return {
            "datasource": DATASOURCE,
            "description": self.description,
            "fieldConfig": {"defaults": {**self.defaults, "unit": self.unit}, "overrides": self.overrides},
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "id": panel_id,
            "options": self.options,
            "targets": [t.to_json(ref_id(i)) for i, t in enumerate(self.targets)],
            "title": self.title,
            "transformations": self.transformations,
            "type": self.type,
        }


@dataclass(frozen=True)
class Row:
    """A full-width section header; it starts a new line and holds no queries."""

    title: str


def ref_id(index: int) -> str:
    """A, B, ... Z, then AA, AB: Grafana's own sequence of query letters."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("A") + rest) + letters
    return letters


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    variables: list[JSON]
    items: list[Panel | Row]
    tags: tuple[str, ...] = ()

    def panels_json(self) -> list[JSON]:
        """Place panels left to right, wrapping at 24 columns; a row always starts a new line."""
        out: list[JSON] = []
        x = y = line_height = 0
        for panel_id, item in enumerate(self.items, start=1):
            if isinstance(item, Row):
                y += line_height
                out.append(
                    {
                        "collapsed": False,
                        "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                        "id": panel_id,
                        "panels": [],
                        "title": item.title,
                        "type": "row",
                    }
                )
                x, y, line_height = 0, y + 1, 0
                continue
            if item.width > GRID_WIDTH:
                raise ValueError(f"panel {item.title!r} is wider than the grid")
            if x + item.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            out.append(item.to_json(panel_id, x, y))
            x += item.width
            line_height = max(line_height, item.height)
        return out

    def to_json(self) -> JSON:
        return {
            "annotations": {
                "list": [
                    {
                        "builtIn": 1,
                        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                        "enable": True,
                        "hide": True,
                        "iconColor": "rgba(0, 211, 255, 1)",
                        "name": "Annotations & Alerts",
                        "type": "dashboard",
                    }
                ]
            },
            "description": self.description,
            "editable": True,
            "fiscalYearStartMonth": 0,
            "graphTooltip": 1,  # shared crosshair: line up a throughput dip with the GPU panels below it
            "id": None,
            # the other gpumon dashboards, keeping the time range and the job/node/instance selection
            "links": [
                {
                    "asDropdown": False,
                    "icon": "dashboard",
                    "includeVars": True,
                    "keepTime": True,
                    "tags": [TAG],
                    "targetBlank": False,
                    "title": "gpumon",
                    "type": "dashboards",
                }
            ],
            "panels": self.panels_json(),
            "refresh": "30s",
            "schemaVersion": SCHEMA_VERSION,
            "tags": [TAG, *self.tags],
            "templating": {"list": self.variables},
            "time": {"from": "now-1h", "to": "now"},
            "timepicker": {},
            "timezone": "browser",
            "title": self.title,
            "uid": self.uid,
            "version": 1,
            "weekStart": "",
        }


def render(dashboard: JSON) -> str:
    """The committed form: sorted keys, two-space indent, a trailing newline, so diffs stay readable."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
