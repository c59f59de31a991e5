"""Numbers as runs, ``0-2,5,7-8``: how the log names a group of GPUs and a label names a node's ranks."""

from __future__ import annotations

from collections.abc import Iterable


def runs(numbers: Iterable[int], sep: str = ",") -> str:
    """The distinct numbers, sorted, with each consecutive run written ``first-last``."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return sep.join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
