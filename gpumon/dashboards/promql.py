"""What Grafana does to a panel's PromQL before sending it, and which metrics a query reads.

:func:`expand` turns a dashboard expression into the concrete PromQL Grafana would send, so tests can run
every panel against a real Prometheus (or parse it with promtool). :func:`metric_names` lists the metric
names an expression selects, so tests can check each against the metric registry and the recording rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from gpumon.dashboards.builder import ALL_VALUE

# $name, ${name}, ${name:format} and the deprecated [[name]] / [[name:format]]
_REFERENCE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)|\[\[(\w+)(?::(\w+))?\]\]")
_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")
ALL = frozenset({"$__all", "All"})
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", duration)
    if match is None:
        raise ValueError(f"not a duration like 1m or 90s: {duration!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _prometheus_escape(value: str) -> str:
    """A value matched literally inside a PromQL ``=~"..."`` string: each regex metacharacter gets a
    backslash, itself escaped for the string literal (Grafana's prometheusSpecialRegexEscape)."""
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def _format(name: str, values: str | Sequence[str], fmt: str | None) -> str:
    if isinstance(values, str):
        if values in ALL:
            return ALL_VALUE  # Grafana inserts a custom all value as it is, unescaped
        values = [values]
    values = list(values)
    if not values:
        raise ValueError(f"variable {name!r} has no value")
    if fmt is None:  # the Prometheus data source's default for multi-value variables
        escaped = [_prometheus_escape(v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    if fmt == "regex":
        escaped = [re.escape(v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    if fmt == "pipe":
        return "|".join(values)
    if fmt in ("csv", "raw"):
        return ",".join(values)
    raise ValueError(f"unsupported variable format ${{{name}:{fmt}}}")


def expand(
    expr: str,
    variables: Mapping[str, str | Sequence[str]],
    rate_interval: str = "1m",
    *,
    interval: str = "15s",
    range_: str = "1h",
) -> str:
    """The concrete PromQL Grafana would send for ``expr`` with these variable values.

    - ``$__rate_interval`` becomes ``rate_interval``; ``$__interval`` / ``$__interval_ms`` become
      ``interval``; ``$__range`` / ``$__range_s`` / ``$__range_ms`` become ``range_`` (as a duration,
      in whole seconds, in milliseconds).
    - ``$var``, ``${var}`` and ``[[var]]`` take ``variables[var]``: a string (one value) or a sequence
      (several values of a multi-value variable). ``"$__all"`` or ``"All"`` is the All option and becomes
      the dashboards' all value ``.*`` unescaped, as Grafana inserts a variable's custom all value. Other
      values are regex-escaped for a PromQL string as Grafana's Prometheus data source does (``a.b`` ->
      ``a\\\\.b``); several values become ``(a|b)``.
    - ``${var:regex}`` escapes with single backslashes, ``${var:pipe}`` joins with ``|``,
      ``${var:csv}`` and ``${var:raw}`` with ``,``; other formats raise ValueError.
    - A variable missing from ``variables`` raises KeyError: a typo in a dashboard must not pass silently.
    """
    builtins = {
        "__rate_interval": rate_interval,
        "__interval": interval,
        "__interval_ms": str(round(_seconds(interval) * 1000)),
        "__range": range_,
        "__range_s": str(round(_seconds(range_))),
        "__range_ms": str(round(_seconds(range_) * 1000)),
    }

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3) or match.group(4)
        fmt = match.group(2) or match.group(5)
        if name in builtins:
            return builtins[name]
        if name not in variables:
            raise KeyError(f"dashboard variable ${name} has no value (known: {sorted(variables)})")
        return _format(name, variables[name], fmt)

    return _REFERENCE.sub(substitute, expr)


_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.])[A-Za-z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """Metric names ``expr`` selects: identifiers that are not functions, keywords, label names (in
    ``{...}`` or ``by (...)``-style lists), strings, durations or numbers. Works on expanded and
    unexpanded expressions alike."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        if word.lower() in _KEYWORDS or word.lower() in ("inf", "nan"):
            continue
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or aggregation
        names.add(word)
    return names


def uses_rate_interval(expr: str) -> bool:
    """Whether every rate(), irate() and increase() in ``expr`` takes ``[$__rate_interval]``: shorter
    windows return nothing at coarse scrape intervals, longer ones hide spikes when zoomed in."""
    windows = re.findall(r"\b(?:rate|irate|increase)\s*\((?:[^()\[]|\([^()]*\))*\[([^\]]*)\]", expr)
    calls = re.findall(r"\b(?:rate|irate|increase)\s*\(", expr)
    return len(windows) == len(calls) and all(w == "$__rate_interval" for w in windows)
