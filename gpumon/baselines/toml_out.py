"""Just enough TOML output for the baseline library: top-level scalars and arrays of flat tables.

The standard library reads TOML (tomllib) but does not write it; the library's shape is simple enough that a
dependency for it would cost more than these lines. ``baselines.save`` reads every rendering back before
writing it, so an emitter bug can never reach the disk.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any


def value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"TOML cannot hold {v!r} here")
        return repr(v)
    if isinstance(v, str):
        # a JSON string is a valid TOML basic string, except that TOML forbids raw DEL
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    raise TypeError(f"no TOML rendering for {type(v).__name__}")


def dumps(doc: Mapping[str, Any]) -> str:
    scalars = [f"{k} = {value(v)}" for k, v in doc.items() if not isinstance(v, list)]
    out = "\n".join(scalars) + ("\n" if scalars else "")
    for k, tables in doc.items():
        if isinstance(tables, list):
            for t in tables:
                out += f"\n[[{k}]]\n" + "".join(f"{tk} = {value(tv)}\n" for tk, tv in t.items())
    return out
