"""Windowed rates: measured between the training loop's own step times, 0 when progress stops."""

from __future__ import annotations

import pytest
from support.reports import T0, report

from gpumon.jobs.report import parse
from gpumon.jobs.store import JobStore
from gpumon.jobs.window import measure


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


def test_a_rank_stops_progressing_after_four_step_times_not_a_whole_window() -> None:
    a = report(10, step_seconds=5.0)
    b = report(20, step_seconds=5.0)  # 5 s steps: stalled once the last step is 20 s old
    v = view(a, b, window=600.0)
    assert measure(v, now=b["time"] + 19, window=600.0).progressing
    r = measure(v, now=b["time"] + 21, window=600.0)
    assert not r.progressing and r.tokens_per_second == 0.0


def test_fast_steps_still_get_ten_seconds_before_they_count_as_stalled() -> None:
    v = view(report(100))  # 0.1 s steps
    assert measure(v, now=v.report.time + 9, window=60.0).progressing
    assert not measure(v, now=v.report.time + 11, window=60.0).progressing


def test_ages_are_measured_on_the_rank_s_clock_not_the_daemon_s() -> None:
    """A report whose clock is an hour behind the daemon's (a wall-clock step in the training process after
    it started) is still progressing when it has just stepped."""
    r = report(100)
    s = JobStore(max_jobs=4, max_ranks=8, ttl=600.0, window=60.0)
    s.ingest(parse(r), r["time"] + 3600)  # arrives now, by the daemon's clock
    (v,) = s.views(r["time"] + 3601)
    rates = measure(v, now=r["time"] + 3601, window=60.0)
    assert rates.progressing and rates.tokens_per_second == pytest.approx(99_000 / 9.9)


def _loop_reports(seconds: float, busy: float = 0.5) -> list[dict]:
    """A loop of ``busy`` s steps with a 0.1 s data wait each, a 3 s checkpoint after every 20th step and an
    8 s evaluation after every 30th (both between two step() calls, so the next step's time holds them),
    reported every second with its closed and running phases, as the SDK sends them."""
    events: list[tuple[float, float, str]] = []  # (start, end, phase or "step")
    t, n = T0, 0
    while t < T0 + seconds:
        events.append((t, t + 0.1, "data_wait"))
        t += 0.1 + busy
        n += 1
        events.append((t, t, "step"))
        for every, name, length in ((20, "checkpoint", 3.0), (30, "evaluation", 8.0)):
            if n % every == 0:
                events.append((t, t + length, name))
                t += length
    out = []
    for k in range(1, int(seconds)):
        now = T0 + k
        steps = [e for s, e, name in events if name == "step" and e <= now]
        closed: dict[str, float] = {}
        running: dict[str, float] = {}
        for s, e, name in events:
            if name != "step" and s < now:
                into = closed if e <= now else running
                into[name] = into.get(name, 0.0) + min(e, now) - s
        r = report(len(steps), t=now, phases=closed, open_phases=running, seq=k)
        r["updated"] = steps[-1]
        r["anchor"]["time"] = steps[0]
        r["step_seconds"]["sum"] = steps[-1] - steps[0]
        out.append(r)
    return out


def test_busy_time_per_step_ignores_how_many_evaluations_and_checkpoints_the_window_holds() -> None:
    """The step time swings with the number of 8 s evaluations in a 60 s window (two or three); busy time per
    step, what slower clocks would lengthen, stays that of the loop's steps at every report."""
    reports = _loop_reports(300.0)
    s = JobStore(max_jobs=4, max_ranks=8, ttl=600.0, window=60.0)
    busy, step = [], []
    for r in reports:
        s.ingest(parse(r), r["time"])
        if r["time"] >= T0 + 70:
            m = measure(s.views(r["time"])[0], now=r["time"], window=60.0)
            assert m.busy_step_seconds is not None and m.step_time_seconds is not None
            busy.append(m.busy_step_seconds)
            step.append(m.step_time_seconds)
    assert max(step) / min(step) > 1.1  # the swing the evaluations make in the step time
    # at most one step's data wait (0.1 s) of error at each end, over ~75 steps
    assert max(abs(b / 0.5 - 1.0) for b in busy) < 0.01
