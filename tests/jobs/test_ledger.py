"""The goodput ledger's rules, report by report: which bucket each second lands in, and which wins."""

from __future__ import annotations

from typing import Any

import pytest
from support.reports import T0, histogram, report

from gpumon.client import protocol as P
from gpumon.jobs.goodput.ledger import CAUSES, STALL_FLOOR, Ledger
from gpumon.jobs.report import parse
from gpumon.jobs.store import JobStore


def rep(
    t: float,
    steps: int,
    *,
    last: float | None = None,
    first: float | None = None,
    incarnation: str = "a1",
    started: float = T0,
    phases: dict[str, float] | None = None,
    open_phases: dict[str, float] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A report at ``t`` after ``steps`` steps, the first at ``first`` and the latest at ``last``."""
    extra.setdefault("seq", 0)  # the Reporter's first reports: seen from its start
    r = report(steps, t=t, started=started, incarnation=incarnation, phases=phases or {}, **extra)
    r["updated"] = last if steps else None
    r["anchor"] = None if not steps else {**r["anchor"], "time": first}
    r["step_seconds"] = histogram(max(0, steps - 1), 0.1)
    if open_phases:
        r["open_phases"] = open_phases
    return r


def feed(ledger: Ledger, *reports: dict[str, Any], baseline: float | None = None) -> dict[str, float]:
    for r in reports:
        ledger.observe(parse(r), baseline)
    v = ledger.view()
    return {"goodput": v.goodput, **{c: s for c, s in v.badput.items() if s}}


def test_startup_runs_from_the_process_start_to_the_first_step() -> None:
    start = T0 + 10
    out = feed(
        Ledger(),
        rep(start + 2, 0, started=start, process_started=start - 3),  # 3 s of imports before the Reporter
        rep(start + 4, 1, first=start + 4, last=start + 4, started=start, process_started=start - 3),
        rep(start + 5, 11, first=start + 4, last=start + 5, started=start, process_started=start - 3),
    )
    assert out == pytest.approx({"startup": 7.0, "goodput": 1.0})


def test_without_the_process_start_the_reporter_start_is_used() -> None:
    out = feed(
        Ledger(), rep(T0 + 2, 1, first=T0 + 2, last=T0 + 2), rep(T0 + 3, 11, first=T0 + 2, last=T0 + 3)
    )
    assert out == pytest.approx({"startup": 2.0, "goodput": 1.0})


def test_phases_claim_first_checkpoint_then_evaluation_then_data_wait() -> None:
    base = rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1)
    # 2 s of wall-clock, but 3 s of overlapping phases: checkpoint wins, then evaluation gets what is left
    busy = rep(
        T0 + 3, 1, first=T0 + 1, last=T0 + 1, phases={"checkpoint": 1.5, "evaluation": 1.0, "data_wait": 0.5}
    )
    out = feed(Ledger(), base, busy)
    assert out == pytest.approx({"startup": 1.0, "checkpoint": 1.5, "evaluation": 0.5, "goodput": 0.0})


def test_a_running_checkpoint_counts_while_it_runs_and_once() -> None:
    reports = [rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1)]
    for k in range(1, 30):  # a 30 s checkpoint: no stall, although no step lands for 30 s
        reports.append(rep(T0 + 1 + k, 1, first=T0 + 1, last=T0 + 1, open_phases={"checkpoint": float(k)}))
    reports.append(rep(T0 + 31, 1, first=T0 + 1, last=T0 + 1, phases={"checkpoint": 30.0}))
    reports.append(rep(T0 + 32, 11, first=T0 + 1, last=T0 + 32, phases={"checkpoint": 30.0}))
    out = feed(Ledger(), *reports)
    assert out == pytest.approx({"startup": 1.0, "checkpoint": 30.0, "goodput": 1.0})


def test_a_gap_far_longer_than_a_step_is_a_stall_from_the_last_step() -> None:
    reports = [rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1), rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2)]
    # steps of 0.1 s: the stall threshold is the floor, 10 s; 25 s without a step, then one
    reports += [rep(T0 + 2 + k, 11, first=T0 + 1, last=T0 + 2) for k in range(1, 26)]
    reports.append(rep(T0 + 27.5, 12, first=T0 + 1, last=T0 + 27.5))
    out = feed(Ledger(), *reports)
    assert out == pytest.approx({"startup": 1.0, "goodput": 1.0, "stall": 25.5})


def test_a_pause_shorter_than_the_threshold_belongs_to_its_step() -> None:
    out = feed(
        Ledger(),
        rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1),
        rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2),
        rep(T0 + 2 + STALL_FLOOR / 2, 11, first=T0 + 1, last=T0 + 2),
        rep(T0 + 3 + STALL_FLOOR / 2, 12, first=T0 + 1, last=T0 + 3 + STALL_FLOOR / 2),
    )
    assert out == pytest.approx({"startup": 1.0, "goodput": 2.0 + STALL_FLOOR / 2})


def test_steps_slower_than_the_baseline_count_their_excess() -> None:
    out = feed(
        Ledger(),
        rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1),
        rep(T0 + 3, 11, first=T0 + 1, last=T0 + 3),  # 10 steps in 2 s against a 0.15 s baseline
        baseline=0.15,
    )
    assert out == pytest.approx({"startup": 1.0, "goodput": 1.5, "slow_steps": 0.5})


def test_a_restart_from_an_older_checkpoint_counts_the_gap_and_the_redone_steps() -> None:
    ledger = Ledger()
    first = [rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1), rep(T0 + 5, 41, first=T0 + 1, last=T0 + 4.9)]
    # killed at T0 + 5; the successor starts at T0 + 8, resumes from step 20, steps first at T0 + 10
    s = T0 + 8
    second = [
        rep(s + 1, 0, incarnation="b2", started=s, resumed_step=20),
        rep(s + 2, 1, first=s + 2, last=s + 2, incarnation="b2", started=s, resumed_step=20),
        rep(
            s + 4, 21, first=s + 2, last=s + 4, incarnation="b2", started=s, resumed_step=20
        ),  # 22..41 redone
        rep(s + 5, 31, first=s + 2, last=s + 5, incarnation="b2", started=s, resumed_step=20),  # 42..51 new
    ]
    out = feed(ledger, *first, *second)
    assert out == pytest.approx(
        {"startup": 1.0, "goodput": 3.9 + 1.0, "restart": 0.1 + 5.0, "lost_progress": 2.0}
    )
    assert ledger.view().steps_redone == 21  # steps 21 to 41; the first of them inside the restart
    assert ledger.view().high_step == 51


def test_without_a_resumed_step_a_successor_continues_from_the_high_water_mark() -> None:
    ledger = Ledger()
    feed(ledger, rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1), rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2))
    s = T0 + 3
    out = feed(
        ledger,
        rep(s + 1, 1, first=s + 1, last=s + 1, incarnation="b2", started=s),
        rep(s + 2, 11, first=s + 1, last=s + 2, incarnation="b2", started=s),
    )
    assert out == pytest.approx({"startup": 1.0, "goodput": 2.0, "restart": 2.0})
    assert ledger.view().steps_redone == 0


def test_a_rank_first_seen_mid_run_is_accounted_from_then_on() -> None:
    """The daemon started (or restarted) while the rank was training: nothing before is guessed."""
    ledger = Ledger()
    out = feed(
        ledger,
        rep(T0 + 500, 4001, first=T0 + 100, last=T0 + 500, seq=500),
        rep(T0 + 501, 4011, first=T0 + 100, last=T0 + 501, seq=501),
    )
    assert out == pytest.approx({"goodput": 1.0})
    assert ledger.view().since == T0 + 500


def test_inference_ranks_have_no_ledger() -> None:
    ledger = Ledger()
    feed(ledger, rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1, kind="inference"))
    assert ledger.view().since is None and ledger.view().total == 0


def test_every_second_lands_in_exactly_one_bucket() -> None:
    ledger = Ledger()
    reports = [rep(T0 + 0.5, 0, process_started=T0 - 1), rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1)]
    for k in range(2, 200):
        t = T0 + k * 0.5
        phases = {
            "data_wait": 0.05 * k,
            "checkpoint": 2.0 if k > 50 else 0.0,
            "evaluation": 3.0 if k > 120 else 0.0,
        }
        steps = 1 + (k if k < 80 or k > 110 else 80)  # no step from 80 to 110: a 15 s stall
        last = T0 + (k if k < 80 or k > 110 else 80) * 0.5
        reports.append(rep(t, steps, first=T0 + 1, last=last, phases=phases))
    feed(ledger, *reports)
    v = ledger.view()
    assert v.total + v.pending == pytest.approx(reports[-1]["time"] - (T0 - 1))
    assert set(v.badput) == set(CAUSES)


def test_the_store_carries_the_ledger_across_restarts_and_expiry() -> None:
    store = JobStore(max_jobs=4, max_ranks=8, ttl=5.0, window=60.0)
    store.ingest(parse(rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1)), T0 + 1)
    store.ingest(parse(rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2, seq=1)), T0 + 2)
    (view,) = store.views(T0 + 2.5)
    assert view.ledger.goodput == pytest.approx(1.0)
    store.views(T0 + 20)  # silent past the TTL: gone, its ledger kept with its offsets
    s = T0 + 21
    store.ingest(parse(rep(s + 1, 1, first=s + 1, last=s + 1, incarnation="b2", started=s)), s + 1)
    (view,) = store.views(s + 1)
    assert view.ledger.badput["restart"] == pytest.approx(20.0)  # its last step at T0 + 2 to this one's first
    assert view.restarts == 1


def test_phase_time_reported_after_the_fact_takes_back_what_waits_for_a_step() -> None:
    """A callback that learns of a save only when it ends (add_phase): its seconds are older than the report
    carrying them, and take back the time held since the last step, not the next step's."""
    reports = [rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1), rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2)]
    reports += [rep(T0 + 2 + k, 11, first=T0 + 1, last=T0 + 2) for k in range(1, 8)]  # 7 s, no step
    reports.append(rep(T0 + 10, 11, first=T0 + 1, last=T0 + 2, phases={"checkpoint": 8.0}))
    reports.append(rep(T0 + 11, 21, first=T0 + 1, last=T0 + 11, phases={"checkpoint": 8.0}))
    out = feed(Ledger(), *reports)
    assert out == pytest.approx({"startup": 1.0, "checkpoint": 8.0, "goodput": 2.0})


def test_a_stall_no_report_saw_is_found_in_the_step_histogram() -> None:
    """Reports 30 s apart (or a process frozen whole): the 30 s step is in the histogram's (25, 60] bucket."""
    first = rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2)
    late = rep(T0 + 33, 21, first=T0 + 1, last=T0 + 33)  # 9 steps of 0.1 s and one of 30.1 s
    late["step_seconds"] = histogram(19, 0.1)
    late["step_seconds"]["counts"][P.BUCKETS.index(60.0)] += 1
    late["step_seconds"]["counts"][P.BUCKETS.index(0.1)] -= 1
    late["step_seconds"]["sum"] = 18 * 0.1 + 30.1
    out = feed(Ledger(), rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1), first, late)
    assert out == pytest.approx({"startup": 1.0, "stall": 30.1, "goodput": 1.0 + 0.9})


def test_a_daemon_that_restarts_while_a_rank_loads_does_not_count_its_start_up_again() -> None:
    """The previous daemon counted the rank's start-up until it went; this one counts from its first sight."""
    start = T0 + 10
    out = feed(
        Ledger(),
        rep(start + 400, 0, started=start, process_started=start - 300, seq=400),
        rep(start + 401, 0, started=start, process_started=start - 300, seq=401),
    )
    assert out == pytest.approx({"startup": 1.0, "goodput": 0.0})


def test_allocator_counters_never_go_back_when_a_process_resets_them() -> None:
    store = JobStore(max_jobs=4, max_ranks=8, ttl=60.0, window=60.0)

    def memory(retries: int, seq: int) -> dict[str, Any]:
        body = rep(T0 + seq, 1, first=T0 + 1, last=T0 + 1, seq=seq)
        body["memory"] = {"device": 0, "alloc_retries": retries, "ooms": 0}
        return body

    counts = []
    for seq, retries in enumerate((5, 20, 3, 4), start=1):  # reset_accumulated_memory_stats() after 20
        store.ingest(parse(memory(retries, seq)), T0 + seq)
        (view,) = store.views(T0 + seq)
        counts.append(view.allocator_counts())
    assert counts == [(5, 0), (20, 0), (23, 0), (24, 0)]
