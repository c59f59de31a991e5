"""The one way a test waits for something another thread or process does: poll until it holds.

A sleep of a fixed length is a guess at another thread's speed, and a loaded CI machine guesses wrong; a
poll waits exactly as long as needed and, when the thing never happens, fails naming it. Every timeout is
stretched by SLACK on CI (or by ``GPUMON_TEST_SLACK``), so a timeout is written for a quiet machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SLACK = float(os.environ.get("GPUMON_TEST_SLACK") or (3.0 if IN_CI else 1.0))


def poll(
    cond: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    every: float = 0.02,
    retry: tuple[type[BaseException], ...] = (),
    detail: Callable[[], str] | None = None,
) -> T:
    """``cond()``'s first truthy value, asked every ``every`` seconds for up to ``timeout`` times SLACK.

    Past that it raises AssertionError naming ``what``, with ``detail()`` (a daemon's log, say) and the last
    exception of the kinds in ``retry``, which count as "not yet" (a page element redrawn mid-read)."""
    end = time.monotonic() + timeout * SLACK
    last: BaseException | None = None
    while True:
        try:
            value = cond()
            if value:
                return value
        except retry as exc:
            last = exc
        if time.monotonic() >= end:
            break
        time.sleep(every)
    message = f"timed out after {timeout * SLACK:.1f} s waiting for {what}"
    if last is not None:
        message += f" (last error: {last!r})"
    if detail is not None:
        message += "\n" + detail()
    raise AssertionError(message)
