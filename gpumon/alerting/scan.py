"""Scanning PromQL text without a parser: identifiers, string literals, comments and brackets, enough to
rewrite function calls and metric names in place (gpumon.alerting.victoria, gpumon.alerting.chains)."""

from __future__ import annotations

import re

IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


class ScanError(ValueError):
    """Text that is not well-formed PromQL where it was scanned; the message says where."""


def skip_string(expr: str, i: int) -> int:
    """The index after the string literal that starts at ``expr[i]``."""
    quote = expr[i]
    j = i + 1
    while j < len(expr):
        if expr[j] == "\\" and quote != "`":
            j += 2
            continue
        if expr[j] == quote:
            return j + 1
        j += 1
    raise ScanError(f"unterminated string in {expr!r}")


def skip_literal(expr: str, i: int) -> int:
    """The index after the string literal or comment that starts at ``expr[i]``; ``i`` when neither does."""
    c = expr[i]
    if c in "\"'`":
        return skip_string(expr, i)
    if c == "#":
        end = expr.find("\n", i)
        return len(expr) if end < 0 else end
    return i


def closing(expr: str, open_at: int) -> int:
    """The index of the bracket closing the one at ``expr[open_at]``, strings and comments skipped."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = [pairs[expr[open_at]]]
    i = open_at + 1
    while i < len(expr):
        if (after := skip_literal(expr, i)) != i:
            i = after
            continue
        c = expr[i]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")]}":
            if c != stack.pop():
                raise ScanError(f"unbalanced {c!r} in {expr!r}")
            if not stack:
                return i
        i += 1
    raise ScanError(f"unbalanced brackets in {expr!r}")
