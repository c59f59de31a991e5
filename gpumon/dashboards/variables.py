"""Template variables shared by the dashboards, and a helper for writing selectors."""

from __future__ import annotations

from typing import Any

from gpumon.dashboards.builder import ALL_VALUE, DATASOURCE, JSON


def datasource_variable() -> JSON:
    return {
        "current": {},
        "hide": 0,
        "includeAll": False,
        "label": "Data source",
        "multi": False,
        "name": "datasource",
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
        "type": "datasource",
    }


def query_variable(name: str, label: str, query: str, *, numeric: bool = False) -> JSON:
    """A multi-value ``label_values`` variable defaulting to All (expanded to ALL_VALUE)."""
    return {
        "allValue": ALL_VALUE,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "datasource": DATASOURCE,
        "definition": query,
        "hide": 0,
        "includeAll": True,
        "label": label,
        "multi": True,
        "name": name,
        "options": [],
        "query": query,
        "refresh": 2,  # on time range change: nodes and jobs come and go
        "regex": "",
        "skipUrlSync": False,
        "sort": 3 if numeric else 1,  # GPU indexes numerically (0, 1, ... 10), the rest alphabetically
        "type": "query",
    }


def job_variable() -> JSON:
    return query_variable("job", "Scrape job", "label_values(gpumon_build_info, job)")


def node_variable() -> JSON:
    return query_variable("node", "Node", 'label_values(gpumon_node_info{job=~"$job"}, node)')


def instance_variable() -> JSON:
    # gpumon series carry no node label: the node picks instances through gpumon_node_info{node}
    return query_variable(
        "instance", "Instance", 'label_values(gpumon_node_info{job=~"$job",node=~"$node"}, instance)'
    )


def common_variables(*extra: JSON) -> list[JSON]:
    return [datasource_variable(), job_variable(), node_variable(), instance_variable(), *extra]


def sel(metric: str, *matchers: Any) -> str:
    """``metric{m1,m2}``: written out here so the dashboards read as PromQL rather than as brace escapes."""
    return metric + "{" + ",".join(str(m) for m in matchers) + "}"
