"""Recording rules read by other rules, written out in place for an engine whose recorded series return late.

Prometheus evaluates a group's rules in order at one timestamp, so a rule reading the series another rule of
the group just recorded reads this evaluation's value. vmalert writes recorded series to VictoriaMetrics over
remote write and reads them back through queries, so a rule reads the level below as of a flush (and
VictoriaMetrics' ``-search.latencyOffset``) ago: each level of a chain lags the one below it. Where a rule
divides two series of different depths, the lag is not only late but wrong: when a job's ranks move, its
tokens/s (one level) has changed while its GPU count (two levels) has not, and tokens/s per GPU reads 0.67 or
1.48 for those evaluations, enough to set baseline alerts pending.

:func:`inline_records` replaces each plain reference to a recorded series (its bare name, as a whole
instant vector) by the expression that records it, recursively, so every rule computes from scraped series
at its own evaluation time, as on Prometheus. A reference stays as it is where it cannot be written out:

- with label matchers, a range or an offset (``x{bottleneck="input"}``, ``x[1h]``, ``x offset 1h``): those
  read the recorded history, which an expression cannot recompute;
- to a series recorded by a group with its own ``interval`` (the seven-day median, every five minutes):
  recomputing it at every evaluation of the reader would cost what the slow interval saves;
- to a series whose recording reads itself (``instance:gpumon_node:info`` remembers a node's name while its
  target is down): its value is its own history;
- to a series whose rule sets ``labels:`` (they are the series', not the expression's), or whose name has
  no colon (such a word may also be a label name in ``by (...)`` or an exponent's digits).

Written-out expressions grow with the chains; VictoriaMetrics refuses a query over 16 KiB
(``-search.maxQueryLen``), which tests/deploy/test_chains.py holds the generated rules under.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from gpumon.alerting.scan import IDENT, ScanError, skip_literal

Group = dict[str, Any]
_MODIFIER = re.compile(r"\s*(\{|\[|\(|offset\b|@)")


def _references(expr: str) -> list[tuple[int, int, str, bool]]:
    """Every identifier outside strings and comments: (start, end, name, plain), ``plain`` when nothing that
    makes it more than a bare instant vector (matchers, a range, an offset, a call) follows it."""
    out = []
    i = 0
    while i < len(expr):
        if (after := skip_literal(expr, i)) != i:
            i = after
            continue
        m = IDENT.match(expr, i)
        if m is None:
            i += 1
            continue
        out.append((m.start(), m.end(), m.group(0), _MODIFIER.match(expr, m.end()) is None))
        i = m.end()
    return out


def _definitions(groups: list[Group]) -> dict[str, str]:
    """The recorded names that can be written out, with their expressions (see the module's docstring)."""
    exprs: dict[str, list[str]] = {}
    kept: set[str] = set()
    for group in groups:
        for rule in group.get("rules", []):
            if "record" in rule:
                exprs.setdefault(rule["record"], []).append(str(rule["expr"]))
                # a slow group's, or one whose rule sets labels (the series carries them; the expression
                # would not), or a name without a colon (one could also be a label name or an exponent:
                # recorded names are level:metric:operations by convention, and gpumon's all are)
                if group.get("interval") or rule.get("labels") or ":" not in rule["record"]:
                    kept.add(rule["record"])
    out = {}
    for name, found in exprs.items():
        # a name recorded twice is the union of both rules' series: no one expression stands for it
        if len(found) != 1 or name in kept:
            continue
        if any(ref == name for _, _, ref, _ in _references(found[0])):
            continue
        out[name] = found[0]
    return out


def _expand(expr: str, definitions: dict[str, str], stack: tuple[str, ...]) -> str:
    refs = [r for r in _references(expr) if r[3] and r[2] in definitions]
    if not refs:
        return expr
    parts, last = [], 0
    for start, end, name, _ in refs:
        if name in stack:
            raise ScanError(f"recording rules read each other in a cycle: {' -> '.join((*stack, name))}")
        inner = _expand(definitions[name], definitions, (*stack, name)).strip()
        parts += [expr[last:start], f"(\n{inner}\n)"]
        last = end
    parts.append(expr[last:])
    return "".join(parts)


def inline_records(groups: list[Group], definitions: list[Group] | None = None) -> list[Group]:
    """A copy of ``groups`` whose expressions read scraped series where they read recorded ones (see the
    module's docstring). ``definitions``: the groups whose recording rules may be written out (by default
    ``groups``; pass every rule file's when the alerting rules read the recording rules' series)."""
    known = _definitions(groups if definitions is None else definitions)
    out = copy.deepcopy(groups)
    for group in out:
        for rule in group.get("rules", []):
            if "expr" in rule:
                own = rule.get("record")
                rule["expr"] = _expand(str(rule["expr"]), known, (own,) if own else ())
    return out


__all__ = ["inline_records"]
