"""The goodput ledger's rules, report by report: which bucket each second lands in, and which wins."""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.reports import T0, histogram, report
from support.timeline import Process

from gpumon.client import protocol as P
from gpumon.jobs.goodput.ledger import CAUSES, STALL_FLOOR, Ledger
from gpumon.jobs.report import parse
from gpumon.jobs.store import JobStore, Stale


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
    # the step that ends it keeps its own 0.1 s
    assert out == pytest.approx({"startup": 1.0, "goodput": 1.1, "stall": 25.4})


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
    # the frozen step keeps its own 0.1 s, like the step that ends a stall the reports saw
    assert out == pytest.approx({"startup": 1.0, "stall": 30.0, "goodput": 1.0 + 1.0})


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


# ---- timelines: steps, phases and reports as a process makes them (the second review's findings) --------


def run(*reports: dict[str, Any]) -> tuple[Ledger, dict[str, float]]:
    ledger = Ledger()
    out = feed(ledger, *reports)
    v = ledger.view()
    assert v.total + v.pending == pytest.approx(v.until - v.since), "every second in exactly one bucket"
    return ledger, out


def test_a_lasting_change_of_step_time_costs_a_couple_of_steps_not_the_run() -> None:
    """0.5 s steps, then steady 12 s steps (a longer sequence): the recent mean follows within two steps."""
    p = Process("a1", T0)
    first = p.report(T0 + 0.5)
    last, reports = p.train(T0 + 1, 0.5, 1000)
    before = run(first, *reports)[1]
    last, more = p.train(last + 12, 12, 100)
    after = run(first, *reports, *more)[1]
    assert after.get("stall", 0) - before.get("stall", 0) <= 24.5
    assert after["goodput"] - before["goodput"] >= 1200 - 24 - 12  # the last step has no report after it


def test_one_hang_does_not_blind_the_ledger_to_the_next() -> None:
    p = Process("a1", T0)
    reports = [p.report(T0 + 0.5)]
    last = p.steps_every(T0 + 1, 0.1, 100)
    reports += p.reports(last + 0.1, last + 1800)  # a 30-minute hang, seen by the reports
    last = p.steps_every(last + 1800, 0.1, 100)
    reports += p.reports(last + 1, last + 30)  # 10 s later, a 30 s hang
    p.step(last + 30.1)
    reports.append(p.report(last + 30.2))
    out = run(*reports)[1]
    assert out["stall"] == pytest.approx(1800 + 30, abs=1.0)


def test_a_long_checkpoint_then_steps_is_no_stall() -> None:
    p = Process("a1", T0)
    reports = [p.report(T0 + 0.5)]
    last = p.steps_every(T0 + 1, 0.1, 20)
    reports.append(p.report(T0 + 3))
    p.enter("checkpoint", T0 + 3)
    reports += p.reports(T0 + 4, T0 + 33)
    p.leave("checkpoint", T0 + 33.5)
    p.steps_every(T0 + 34, 0.1, 10)
    reports.append(p.report(T0 + 35))
    out = run(*reports)[1]
    assert "stall" not in out and out["checkpoint"] == pytest.approx(30.5)
    del last


def test_an_unseen_stall_among_steps_with_data_waits_keeps_its_whole_length() -> None:
    """Reports a minute apart; 300 steps of 0.1 s with 0.05 s of data wait each, and one 30 s freeze."""
    p = Process("a1", T0)
    reports = [p.report(T0 + 0.5)]
    t = p.steps_every(T0 + 1, 0.1, 20) + 0.1
    reports.append(p.report(t))
    for k in range(300):
        p.enter("data_wait", t)
        p.leave("data_wait", t + 0.05)
        t += 30.1 if k == 150 else 0.1
        p.step(t)
    reports.append(p.report(t + 0.05))
    out = run(*reports)[1]
    assert out["stall"] == pytest.approx(30.0, abs=0.3) and out["data_wait"] == pytest.approx(15.0, abs=0.1)


def test_an_unseen_freeze_before_the_second_step_is_a_stall() -> None:
    p = Process("a1", T0)
    reports = [p.report(T0 + 0.5)]
    p.step(T0 + 1)
    reports.append(p.report(T0 + 1.1))
    p.steps_every(T0 + 301, 0.1, 10)  # frozen 300 s whole: no report in between
    reports.append(p.report(T0 + 302))
    out = run(*reports)[1]
    # without a mean, the other steps count at their buckets' upper bounds: the stall is at least this
    assert out["stall"] == pytest.approx(300.0, abs=2.0)


def test_phase_time_from_before_the_first_step_stays_start_ups() -> None:
    p = Process("a1", T0)
    reports = [p.report(T0 + 0.5)]
    p.phases["checkpoint"] = 3.0  # loading the checkpoint, reported once it was done
    p.step(T0 + 4.5)
    p.steps_every(T0 + 4.6, 0.1, 10)
    reports.append(p.report(T0 + 5.5))
    out = run(*reports)[1]
    assert out == pytest.approx({"startup": 4.5, "goodput": 1.0})


# ---- the edges of a process: its end, its first step, the step that ends a stall (issue 28) -------------


def test_a_final_report_classifies_the_time_after_the_last_step() -> None:
    """A run that ends cleanly (Hugging Face, Lightning: the final report comes after the last step): its
    closing evaluation is evaluation, and the short wind-down around it is the run's, not held for ever."""
    ledger, out = run(
        rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1),
        rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2),
        rep(T0 + 3, 11, first=T0 + 1, last=T0 + 2, open_phases={"evaluation": 0.8}),  # from T0 + 2.2
        rep(T0 + 4, 11, first=T0 + 1, last=T0 + 2, phases={"evaluation": 1.5}),  # ended at T0 + 3.7
        rep(T0 + 4.5, 11, first=T0 + 1, last=T0 + 2, phases={"evaluation": 1.5}, final=True),
    )
    assert out == pytest.approx({"startup": 1.0, "evaluation": 1.5, "goodput": 1.0 + 1.0})
    assert ledger.view().pending == 0.0


def test_a_final_report_long_after_the_last_step_is_a_stall() -> None:
    """The last step lands in the final report itself, 17 s before it: no report saw the gap, the rule is
    the same as between steps."""
    _, out = run(
        rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1),
        rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2),
        rep(T0 + 20, 12, first=T0 + 1, last=T0 + 3, final=True),
    )
    assert out == pytest.approx({"startup": 1.0, "goodput": 2.0, "stall": 17.0})


def test_a_successor_of_a_finished_process_restarts_from_its_final_report() -> None:
    """A clean end's trailing second is that process's (goodput); the restart is the gap after its end."""
    s = T0 + 5
    _, out = run(
        rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1),
        rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2),
        rep(T0 + 3, 11, first=T0 + 1, last=T0 + 2, final=True),
        rep(s + 1, 1, first=s + 1, last=s + 1, incarnation="b2", started=s),
        rep(s + 2, 11, first=s + 1, last=s + 2, incarnation="b2", started=s),
    )
    assert out == pytest.approx({"startup": 1.0, "goodput": 2.0 + 1.0, "restart": 3.0})


def test_a_killed_process_s_time_after_its_last_step_is_the_restart_s() -> None:
    """No final report: the step it was working on died with it. Held until the rank is known to have
    restarted, then booked with the gap; never goodput."""
    ledger = Ledger()
    feed(
        ledger,
        rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1),
        rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2),
        rep(T0 + 5, 11, first=T0 + 1, last=T0 + 2),  # reporting, not stepping; then SIGKILL
    )
    assert ledger.view().pending == pytest.approx(3.0)
    s = T0 + 8
    out = feed(
        ledger,
        rep(s + 1, 1, first=s + 1, last=s + 1, incarnation="b2", started=s),
        rep(s + 2, 11, first=s + 1, last=s + 2, incarnation="b2", started=s),
    )
    assert out == pytest.approx({"startup": 1.0, "goodput": 2.0, "restart": 3.0 + 4.0})


def test_a_checkpoint_right_after_the_first_step_is_not_start_up() -> None:
    """The save starts with the first step; the report that brings that step has it running."""
    _, out = run(
        rep(T0 + 0.5, 0),
        rep(T0 + 1.5, 1, first=T0 + 1, last=T0 + 1, open_phases={"checkpoint": 0.5}),
        rep(T0 + 2.5, 1, first=T0 + 1, last=T0 + 1, open_phases={"checkpoint": 1.5}),
        rep(T0 + 3.5, 1, first=T0 + 1, last=T0 + 1, phases={"checkpoint": 2.0}),  # ended at T0 + 3
        rep(T0 + 4, 11, first=T0 + 1, last=T0 + 4, phases={"checkpoint": 2.0}),
    )
    assert out == pytest.approx({"startup": 1.0, "checkpoint": 2.0, "goodput": 1.0})


def test_data_waits_of_the_steps_after_the_first_are_not_start_up() -> None:
    """Six steps in the first report, each after a 0.05 s wait for its batch: only the first wait came
    before the first step."""
    _, out = run(
        rep(T0 + 0.5, 0),
        rep(T0 + 1.5, 6, first=T0 + 1, last=T0 + 1.5, phases={"data_wait": 0.3}),
    )
    assert out == pytest.approx({"startup": 1.0, "data_wait": 0.25, "goodput": 0.25})


def test_the_step_that_ends_a_stall_keeps_its_own_length() -> None:
    """0.1 s steps; a hang from T0 + 2.1 to T0 + 27.4 inside step 12, seen by the reports; then ten more
    steps. The stall is the hang, not the hung step's even share of the interval that ends it."""
    p = Process("a1", T0)
    reports = [p.report(T0 + 0.5)]
    p.steps_every(T0 + 1, 0.1, 11)
    reports += p.reports(T0 + 2, T0 + 27)
    p.steps_every(T0 + 27.5, 0.1, 11)
    reports.append(p.report(T0 + 28.5))
    _, out = run(*reports)
    assert out == pytest.approx({"startup": 1.0, "stall": 25.4, "goodput": 1.0 + 1.1})


@pytest.mark.parametrize("seed", range(40))
def test_random_timelines_put_every_second_in_exactly_one_bucket(seed: int) -> None:
    rng = random.Random(seed)
    p = Process("a1", T0, process_started=T0 - rng.uniform(0, 5))
    reports = [p.report(T0 + 0.5)]
    t = T0 + 1.0
    for _ in range(rng.randint(20, 80)):
        kind = rng.random()
        if kind < 0.1:
            phase = rng.choice(["checkpoint", "evaluation", "data_wait"])
            p.enter(phase, t)
            end = t + rng.uniform(0.1, 40)
            reports += p.reports(t + 0.3, end)
            p.leave(phase, end)
            t = end
        elif kind < 0.15:
            t += rng.uniform(5, 90)  # a hang, seen or not
            if rng.random() < 0.5:
                reports += p.reports(t - 4, t)
        t = p.steps_every(t, rng.uniform(0.05, 3), rng.randint(1, 30)) + rng.uniform(0, 0.5)
        reports.append(p.report(t))
    final = rng.random() < 0.5
    if final:  # a clean end, some time after the last step
        reports.append({**p.report(t + rng.uniform(0, 30)), "final": True})
    ledger, _ = run(*reports)
    assert not final or ledger.view().pending == 0.0


def test_gone_ranks_are_dropped_after_an_hour_whatever_else_happens() -> None:
    """A same-named job hours later is a new job, not a restart with hours of restart badput."""
    store = JobStore(max_jobs=4, max_ranks=8, ttl=5.0, window=60.0)
    store.ingest(parse(rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1)), T0 + 1)
    store.views(T0 + 10)  # gone
    assert [job for job, _, _ in store.gone_ledgers(T0 + 3000)] == ["llm"]
    assert store.gone_ledgers(T0 + 3 * 3600) == []  # nothing else went in between: dropped all the same
    later = T0 + 5 * 3600
    store.ingest(parse(rep(later + 1, 0, incarnation="b2", started=later)), later + 1)
    (view,) = store.views(later + 1)
    assert view.restarts == 0 and view.ledger.badput["restart"] == 0.0


def test_a_late_report_of_a_replaced_process_leaves_the_gone_rank_as_it_was() -> None:
    store = JobStore(max_jobs=4, max_ranks=8, ttl=5.0, window=60.0)
    store.ingest(parse(rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1)), T0 + 1)
    s = T0 + 10
    store.ingest(parse(rep(s + 1, 11, first=s, last=s + 1, incarnation="b2", started=s, seq=5)), s + 1)
    store.views(s + 20)  # the successor went too
    with pytest.raises(Stale):  # the first process's report, arriving late
        store.ingest(parse(rep(s + 21, 2, first=T0 + 1, last=T0 + 2, seq=9)), s + 21)
    (gone,) = store.gone_ledgers(s + 21)
    assert gone[2].steps_redone == 0 and gone[2].badput["restart"] > 0  # the successor's ledger, intact


def test_a_revived_process_that_reset_its_allocator_counters_keeps_them_growing() -> None:
    store = JobStore(max_jobs=4, max_ranks=8, ttl=5.0, window=60.0)
    body = rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1, seq=1, memory={"device": 0, "alloc_retries": 20})
    store.ingest(parse(body), T0 + 1)
    store.views(T0 + 10)  # silent past the TTL
    back = rep(T0 + 11, 1, first=T0 + 1, last=T0 + 1, seq=2, memory={"device": 0, "alloc_retries": 3})
    store.ingest(parse(back), T0 + 11)
    (view,) = store.views(T0 + 11)
    assert view.allocator_counts() == (23, None)  # no process of it reported OOMs


def test_a_rank_first_seen_mid_run_has_no_retries_in_the_window_yet() -> None:
    """After a daemon restart, a day-old rank's lifetime retries are not this window's."""
    from gpumon.jobs.window import measure

    store = JobStore(max_jobs=4, max_ranks=8, ttl=60.0, window=60.0)
    body = rep(
        T0 + 500, 4001, first=T0 + 1, last=T0 + 500, seq=500, memory={"device": 0, "alloc_retries": 5000}
    )
    store.ingest(parse(body), T0 + 500)
    (view,) = store.views(T0 + 500)
    assert measure(view, T0 + 500, 60.0).alloc_retries == 0.0
    fresh = JobStore(max_jobs=4, max_ranks=8, ttl=60.0, window=60.0)
    body = rep(T0 + 2, 11, first=T0 + 1, last=T0 + 2, seq=1, memory={"device": 0, "alloc_retries": 5})
    fresh.ingest(parse(body), T0 + 2)
    (view,) = fresh.views(T0 + 2)
    assert measure(view, T0 + 2, 60.0).alloc_retries == 5  # seen from its start: they are recent


def test_a_restart_on_another_node_books_what_the_same_node_would() -> None:
    """The rank's process dies on node A and resumes on node B, whose daemon never saw it: with the state
    file's predecessor (A's incarnation, high-water step and last step) B books the gap since A's last step as
    the restart's and the redone steps as lost progress. A and B together account what one daemon seeing both
    processes accounts (the test above): nothing lost, nothing twice."""
    a = Ledger()
    feed(a, rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1), rep(T0 + 5, 41, first=T0 + 1, last=T0 + 4.9))
    s = T0 + 8
    was = {"incarnation": "a1", "step": 41, "last_step": T0 + 4.9}
    b = Ledger()
    feed(
        b,
        rep(s + 1, 0, incarnation="b2", started=s, resumed_step=20, predecessor=was),
        rep(s + 2, 1, first=s + 2, last=s + 2, incarnation="b2", started=s, resumed_step=20, predecessor=was),
        rep(
            s + 4, 21, first=s + 2, last=s + 4, incarnation="b2", started=s, resumed_step=20, predecessor=was
        ),
        rep(
            s + 5, 31, first=s + 2, last=s + 5, incarnation="b2", started=s, resumed_step=20, predecessor=was
        ),
    )
    va, vb = a.view(), b.view()
    total = {c: va.badput[c] + vb.badput[c] for c in CAUSES if va.badput[c] + vb.badput[c]}
    assert {"goodput": va.goodput + vb.goodput, **total} == pytest.approx(
        {"startup": 1.0, "goodput": 3.9 + 1.0, "restart": 0.1 + 5.0, "lost_progress": 2.0}
    )
    assert va.pending == pytest.approx(0.1)  # A holds its dead process's last 0.1 s: B booked it
    assert vb.steps_redone == 21 and vb.high_step == 51
    assert (vb.moves, vb.carried, vb.since) == (1, pytest.approx(3.1), T0 + 4.9)
    # the same report on the node that did see the predecessor follows the ordinary restart path
    same = Ledger()
    feed(same, rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1), rep(T0 + 5, 41, first=T0 + 1, last=T0 + 4.9))
    feed(same, rep(s + 1, 0, incarnation="b2", started=s, resumed_step=20, predecessor=was))
    assert (same.view().moves, same.view().carried) == (0, 0.0)


def test_a_rank_back_on_a_node_it_left_does_not_book_the_time_it_was_away() -> None:
    """A on node 1, then B on node 2, then C back on node 1: node 1's ledger still holds A's last point; C's
    predecessor is B, so node 1 books only the gap since B's last step, not the hours B ran elsewhere."""
    ledger = Ledger()
    feed(ledger, rep(T0 + 1, 1, first=T0 + 1, last=T0 + 1), rep(T0 + 5, 41, first=T0 + 1, last=T0 + 4.9))
    s = T0 + 3600
    was = {"incarnation": "b2", "step": 900, "last_step": s - 10}
    out = feed(
        ledger,
        rep(s + 1, 0, incarnation="c3", started=s, predecessor=was),
        rep(s + 2, 1, first=s + 2, last=s + 2, incarnation="c3", started=s, predecessor=was),
    )
    assert out["restart"] == pytest.approx(10 + 2)
    # the store counts this restart here already (a new incarnation of a rank it knows): not moved in
    assert ledger.view().high_step == 901 and ledger.view().moves == 0


@pytest.mark.parametrize(("ago", "followed"), [(-4.0, True), (-30.0, False), (3000.0, True), (7200.0, False)])
def test_only_a_recent_predecessor_is_followed(ago: float, followed: bool) -> None:
    """A predecessor whose last step is over an hour before this process (a stale state file, a run of
    days ago), or well after its start (not an earlier process), is no restart of this rank; a few seconds
    of another node's clock skew are allowed. The report is accepted either way."""
    s = T0 + 8000
    was = {"incarnation": "a1", "step": 41, "last_step": s - ago}
    ledger = Ledger()
    out = feed(
        ledger,
        rep(s + 1, 0, incarnation="b2", started=s, predecessor=was),
        rep(s + 2, 1, first=s + 2, last=s + 2, incarnation="b2", started=s, predecessor=was),
    )
    assert ledger.view().moves == (1 if followed else 0)
    assert ("restart" in out) is followed and ("startup" in out) is not followed
    if followed:
        assert out["restart"] == pytest.approx(max(0.0, ago) + 2)
