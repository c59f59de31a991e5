"""The checks on numbers callers hand the Reporter: counts and seconds, from Python or NumPy, never tensors.

Only the hot path's slow branch calls these (the fast branch tests for a plain int or float inline), so they
may be thorough. Standard library only: this module runs inside training processes.
"""

from __future__ import annotations

import math
import numbers

from gpumon.client.protocol import MAX_PER_CALL, MAX_PER_CALL_SECONDS

# appended to the warning for a bad step() count: the likely mistake is passing a tensor
COUNT_HINT = (
    "counts must be Python or NumPy numbers from 0 to 1e12 (not tensors: reading one synchronises the GPU). "
    "Further calls with this mistake are ignored silently"
)


def as_count(value: object) -> int | float | None:
    """A non-negative finite count from a Python or NumPy number, else None: a tensor too, since reading
    one would synchronise the GPU."""
    try:
        if value.__class__ is bool:
            return None
        if isinstance(value, numbers.Integral):
            number = int(value)
            return number if 0 <= number <= MAX_PER_CALL else None
        if isinstance(value, numbers.Real):
            real = float(value)
            if not 0.0 <= real <= MAX_PER_CALL:
                return None
            return int(real) if real.is_integer() else real
    except (TypeError, ValueError, OverflowError):
        pass
    return None


def as_seconds(value: object) -> float | None:
    """A non-negative duration of at most MAX_PER_CALL_SECONDS as a float, else None."""
    number = as_count(value)
    return None if number is None or number > MAX_PER_CALL_SECONDS else float(number)


def mistake(value: object) -> str:
    """Which kind of bad number ``value`` is: each kind is logged once per Reporter."""
    if value.__class__ is bool or not isinstance(value, numbers.Real):
        return "not a number"
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return "too large"  # an integer beyond a float
    if number < 0:
        return "negative"
    return "too large" if math.isfinite(number) else "not finite"
