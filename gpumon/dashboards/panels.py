"""Panel constructors for the modern panel types, with the options each needs.

Each constructor takes the title, a description (shown as the panel's info tooltip: what the query means
and what to do about it) and a Grafana unit id; the tests require all three on every panel.
"""

from __future__ import annotations

from gpumon.dashboards.builder import JSON, Panel, Target

# Grafana unit ids used here (valueFormats/categories.ts): ratios are 0-1 and shown as percentunit.
RATIO, BYTES, BYTES_PER_S, WATT, JOULE = "percentunit", "bytes", "Bps", "watt", "joule"
CELSIUS, HERTZ, SECONDS, FLOPS = "celsius", "hertz", "s", "flops"
COUNT, PER_SECOND, NONE = "short", "cps", "none"  # SI-scaled count, counts per second, a label-only table


def thresholds(*steps: tuple[str, float | None]) -> JSON:
    """Absolute threshold steps, lowest first; the first step's value is None (from minus infinity)."""
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for color, value in steps]}


OK_ONLY = thresholds(("green", None))
# a ratio against a baseline or a healthy level: below 0.9 is the alert threshold, below 0.8 is bad
HIGHER_IS_BETTER = thresholds(("red", None), ("orange", 0.8), ("yellow", 0.9), ("green", 0.95))
# counts of bad things: anything above zero deserves attention
ZERO_IS_GOOD = thresholds(("green", None), ("red", 1))
# HBM share: seed 003, above 0.8 may become a bottleneck, above 0.9 is one
MEMORY_PRESSURE = thresholds(("green", None), ("orange", 0.8), ("red", 0.9))


def _defaults(
    unit_min: float | None, unit_max: float | None, steps: JSON | None, extra: JSON | None = None
) -> JSON:
    out: JSON = {"color": {"mode": "palette-classic"}, "thresholds": steps or OK_ONLY, **(extra or {})}
    if unit_min is not None:
        out["min"] = unit_min
    if unit_max is not None:
        out["max"] = unit_max
    return out


def _ratio_bounds(unit: str, lo: float | None, hi: float | None) -> tuple[float | None, float | None]:
    # ratios are drawn on a fixed 0-100 % axis unless the caller says otherwise (MFU vs baseline can pass 1)
    if unit == RATIO:
        return (0.0 if lo is None else lo), hi
    return lo, hi


def timeseries(
    title: str,
    description: str,
    unit: str,
    *targets: Target,
    width: int = 12,
    height: int = 8,
    lo: float | None = None,
    hi: float | None = None,
    stack: bool = False,
    steps: JSON | None = None,
    overrides: list[JSON] | None = None,
) -> Panel:
    lo, hi = _ratio_bounds(unit, lo, hi)
    custom = {
        "drawStyle": "line",
        "fillOpacity": 30 if stack else 10,
        "lineWidth": 1,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"group": "A", "mode": "normal" if stack else "none"},
    }
    # a legend table (mean, last) beside wide panels; a plain list below narrow ones, where a table would
    # squeeze the graph
    wide = width >= 12
    legend = {
        "calcs": ["mean", "lastNotNull"] if wide else [],
        "displayMode": "table" if wide else "list",
        "placement": "right" if wide else "bottom",
        "showLegend": True,
    }
    options = {"legend": legend, "tooltip": {"mode": "multi", "sort": "desc"}}
    defaults = _defaults(lo, hi, steps, {"custom": custom})
    return Panel(
        "timeseries", title, description, unit, targets, width, height, options, defaults, overrides or []
    )


def stat(
    title: str,
    description: str,
    unit: str,
    *targets: Target,
    width: int = 4,
    height: int = 4,
    steps: JSON | None = None,
    decimals: int | None = None,
) -> Panel:
    options = {
        "colorMode": "value",
        "graphMode": "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "textMode": "auto",
    }
    extra: JSON = {"color": {"mode": "thresholds"}}
    if decimals is not None:
        extra["decimals"] = decimals
    defaults = _defaults(None, None, steps, extra)
    return Panel("stat", title, description, unit, targets, width, height, options, defaults)


def bargauge(
    title: str,
    description: str,
    unit: str,
    *targets: Target,
    width: int = 12,
    height: int = 8,
    hi: float | None = None,
    steps: JSON | None = None,
) -> Panel:
    lo, hi = _ratio_bounds(unit, None, hi)
    options = {
        "displayMode": "gradient",
        "minVizHeight": 10,
        "namePlacement": "left",
        "orientation": "horizontal",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "showUnfilled": True,
        "valueMode": "color",
    }
    defaults = _defaults(lo, hi, steps, {"color": {"mode": "thresholds"}})
    return Panel("bargauge", title, description, unit, targets, width, height, options, defaults)


def table(
    title: str,
    description: str,
    unit: str,
    *targets: Target,
    width: int = 12,
    height: int = 8,
    columns: dict[str, tuple[str, str]] | None = None,
    hide: tuple[str, ...] = ("Time", "__name__", "job"),
    links: list[JSON] | None = None,
) -> Panel:
    """Instant rows, one per series. Several targets are merged on their labels into one row per series;
    ``columns`` maps a value column ("Value #B") to its display name and unit."""
    overrides = [
        {
            "matcher": {"id": "byName", "options": column},
            "properties": [{"id": "displayName", "value": name}, {"id": "unit", "value": column_unit}],
        }
        for column, (name, column_unit) in (columns or {}).items()
    ]
    transformations: list[JSON] = []
    if len(targets) > 1:
        transformations.append({"id": "merge", "options": {}})
    transformations.append(
        {"id": "organize", "options": {"excludeByName": dict.fromkeys(hide, True), "renameByName": {}}}
    )
    options = {"cellHeight": "sm", "footer": {"show": False}, "showHeader": True}
    extra: JSON = {"custom": {"align": "auto", "filterable": True}}
    if links:
        extra["links"] = links
    defaults = _defaults(None, None, None, extra)
    instant = tuple(Target(t.expr, t.legend, "table", True) for t in targets)
    return Panel(
        "table",
        title,
        description,
        unit,
        instant,
        width,
        height,
        options,
        defaults,
        overrides,
        transformations,
    )


def heatmap(
    title: str,
    description: str,
    unit: str,
    target: Target,
    *,
    calculate_step: str | None = None,
    cell_unit: str = COUNT,
    width: int = 24,
    height: int = 9,
) -> Panel:
    """A heatmap of Prometheus histogram buckets (``format: heatmap``), or, with ``calculate_step``, one
    Grafana buckets itself from plain series (y buckets of that size). ``unit`` is the y axis's (the
    bucket bounds), ``cell_unit`` the unit of a cell's value (what the query returns per bucket)."""
    options: JSON = {
        "calculate": calculate_step is not None,
        "cellGap": 1,
        "cellValues": {"unit": cell_unit},
        "color": {
            "exponent": 0.5,
            "fill": "dark-orange",
            "mode": "scheme",
            "reverse": False,
            "scale": "exponential",
            "scheme": "Oranges",
            "steps": 64,
        },
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "filterValues": {"le": 1e-9},
        "legend": {"show": True},
        "rowsFrame": {"layout": "auto"},
        "showValue": "never",
        "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": True},
        "yAxis": {"axisPlacement": "left", "reverse": False, "unit": unit},
    }
    if calculate_step is not None:
        options["calculation"] = {"yBuckets": {"mode": "size", "value": calculate_step}}
    defaults = {
        "custom": {
            "hideFrom": {"legend": False, "tooltip": False, "viz": False},
            "scaleDistribution": {"type": "linear"},
        }
    }
    return Panel("heatmap", title, description, unit, (target,), width, height, options, defaults)


def state_timeline(
    title: str,
    description: str,
    states: dict[str, tuple[str, str]],
    *targets: Target,
    width: int = 24,
    height: int = 8,
) -> Panel:
    """Series whose values are states: ``states`` maps each value ("0", "1") to its text and colour."""
    mappings = [
        {"options": {value: {"color": color, "index": i, "text": text}}, "type": "value"}
        for i, (value, (text, color)) in enumerate(states.items())
    ]
    options = {
        "alignValue": "left",
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
        "mergeValues": True,
        "rowHeight": 0.9,
        "showValue": "never",
        "tooltip": {"mode": "single", "sort": "none"},
    }
    defaults = _defaults(None, None, None, {"color": {"mode": "thresholds"}, "mappings": mappings})
    return Panel("state-timeline", title, description, NONE, targets, width, height, options, defaults)


def dashed(series_regex: str) -> JSON:
    """An override drawing matching series dashed: baselines and limits next to the measured line."""
    return {
        "matcher": {"id": "byRegexp", "options": series_regex},
        "properties": [
            {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
            {"id": "custom.fillOpacity", "value": 0},
        ],
    }
