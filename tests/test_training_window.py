"""Windowed rates: measured between the training loop's own step times, 0 when progress stops."""

from __future__ import annotations

import pytest
from reports import T0, report

from gpumon.training.report import parse
from gpumon.training.store import JobStore
from gpumon.training.window import measure


def view(*reports: dict, window: float = 60.0, now: float | None = None):
    s = JobStore(max_jobs=4, max_ranks=8, ttl=600.0, window=window)
    for r in reports:
        s.ingest(parse(r), r["time"])
    return s.views(now or reports[-1]["time"])[0]


def test_a_run_shorter_than_the_window_is_measured_from_its_first_step_to_its_last() -> None:
    # 100 steps of 0.1 s, 1000 tokens each; reported once at the end: steps 2..100 took 9.9 s
    v = view(report(100))
    r = measure(v, now=v.report.time, window=60.0)
    assert r.span is not None and r.span.tokens == 99_000
    assert r.tokens_per_second == pytest.approx(99_000 / 9.9)
    assert r.samples_per_second == pytest.approx(99 / 9.9)
    assert r.steps_per_second == pytest.approx(10.0)


def test_the_rate_follows_the_window_not_the_whole_run() -> None:
    # 1000 tokens/step at 0.1 s for 600 steps, then 4000 tokens/step for 100 more
    slow = [report(n, t=T0 + 0.1 * n) for n in range(10, 601, 10)]
    fast = []
    for n in range(610, 701, 10):
        r = report(n, t=T0 + 0.1 * n)
        r["totals"]["tokens"] = 600_000 + (n - 600) * 4000
        fast.append(r)
    v = view(*slow, *fast, window=5.0)
    r = measure(v, now=T0 + 70.0, window=5.0)
    assert r.tokens_per_second == pytest.approx(40_000, rel=0.01)


def test_no_step_in_the_window_means_a_rate_of_zero_not_the_old_speed() -> None:
    v = view(report(100))
    r = measure(v, now=v.report.time + 61, window=60.0)
    assert not r.progressing and r.tokens_per_second == 0.0


def test_a_step_longer_than_the_window_still_has_a_rate() -> None:
    # two steps 90 s apart, window 60 s: the rate comes from the last interval
    a = report(2, step_seconds=90.0, tokens_per_step=1000)
    b = report(3, step_seconds=90.0, tokens_per_step=1000)
    v = view(a, b, window=60.0)
    r = measure(v, now=b["time"] + 1, window=60.0)
    assert r.progressing and r.tokens_per_second == pytest.approx(1000 / 90.0)


def test_one_step_is_not_yet_a_rate() -> None:
    r = measure(view(report(1)), now=T0 + 1, window=60.0)
    assert r.span is None and r.tokens_per_second is None


def test_phase_shares_and_step_time_over_the_window() -> None:
    a = report(10, phases={"data_wait": 0.2, "communication": 0.3})
    b = report(20, phases={"data_wait": 0.5, "communication": 0.6})  # one second later: +0.3 s, +0.3 s
    r = measure(view(a, b), now=b["time"], window=60.0)
    assert r.phase_ratios == {"data_wait": pytest.approx(0.3), "communication": pytest.approx(0.3)}
    assert r.step_time_seconds == pytest.approx(0.1)
