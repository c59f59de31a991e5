"""The job store: cumulative reports, restarts as incarnations, duplicates, limits and expiry."""

from __future__ import annotations

import pytest
from support.reports import T0, report

from gpumon.jobs.report import parse
from gpumon.jobs.store import FINISHED_LINGER, LOST_RETAIN, Conflict, JobStore, LimitExceeded, Stale


def store(**kw: float) -> JobStore:
    args = {"max_jobs": 4, "max_ranks": 8, "ttl": 60.0, "window": 60.0, **kw}
    return JobStore(**args)  # type: ignore[arg-type]


def test_the_latest_report_of_a_rank_is_kept_with_its_history() -> None:
    s = store()
    for steps in (1, 5, 9):
        s.ingest(parse(report(steps)), T0 + 2)
    (view,) = s.views(T0 + 2)
    assert view.report.totals.steps == 9 and len(view.points) == 3 and view.anchor is not None


def test_a_repeated_or_older_seq_is_ignored_and_nothing_changes() -> None:
    s = store()
    s.ingest(parse(report(5)), T0)
    with pytest.raises(Stale):
        s.ingest(parse(report(3)), T0)
    with pytest.raises(Stale):
        s.ingest(parse(report(5)), T0)
    assert s.views(T0)[0].report.totals.steps == 5


def test_totals_going_backwards_within_an_incarnation_are_refused() -> None:
    s = store()
    s.ingest(parse(report(5)), T0)
    bad = report(5, seq=9)
    bad["totals"]["tokens"] = 1500  # above the anchor (1000), below the last report (5000)
    with pytest.raises(ValueError, match=r"totals\.tokens went backwards"):
        s.ingest(parse(bad), T0)


def test_a_restarted_process_continues_the_exported_counters() -> None:
    s = store()
    s.ingest(parse(report(50, phases={"data_wait": 2.0, "checkpoint": 4.0})), T0 + 10)
    restarted = report(3, started=T0 + 20, incarnation="ffff0001", phases={"data_wait": 0.5})
    s.ingest(parse(restarted), T0 + 21)
    (view,) = s.views(T0 + 21)
    assert view.restarts == 1
    assert view.offsets.steps + view.report.totals.steps == 53
    assert view.offsets.tokens + view.report.totals.tokens == 53_000
    assert view.offsets.phases["data_wait"] + view.report.phases["data_wait"] == 2.5
    assert view.totals()["tokens"] == 53_000
    assert view.phases() == {"checkpoint": 4.0, "data_wait": 2.5}, "a phase only the old process had stays"
    assert sum(view.offsets.step_counts) == 49
    assert len(view.points) == 1 and view.anchor is not None and view.anchor.reported > T0 + 20


def test_a_late_report_of_a_replaced_process_is_stale() -> None:
    s = store()
    s.ingest(parse(report(3, started=T0 + 20, incarnation="new")), T0 + 21)
    with pytest.raises(Stale):
        s.ingest(parse(report(99, started=T0, incarnation="old")), T0 + 21)
    assert s.views(T0 + 21)[0].report.incarnation == "new"


def test_too_many_jobs_or_ranks_are_refused_with_the_limit_named() -> None:
    s = store(max_jobs=2, max_ranks=3)
    s.ingest(parse(report(1, job="a")), T0)
    s.ingest(parse(report(1, job="b")), T0)
    with pytest.raises(LimitExceeded) as exc:
        s.ingest(parse(report(1, job="c")), T0)
    assert exc.value.outcome == "job_limit" and "--max-jobs" in str(exc.value)
    s.ingest(parse(report(1, job="a", rank=1, world_size=2)), T0)
    with pytest.raises(LimitExceeded) as exc:
        s.ingest(parse(report(1, job="b", rank=1, world_size=2)), T0)
    assert exc.value.outcome == "rank_limit" and "--max-ranks" in str(exc.value)
    s.ingest(parse(report(2, job="a")), T0)  # known ranks keep reporting at the limit


def test_silent_ranks_expire_and_free_their_slot() -> None:
    s = store(ttl=30.0, max_jobs=1)
    s.ingest(parse(report(1, job="a")), T0)
    assert len(s.views(T0 + 29)) == 1
    assert s.views(T0 + 31) == [] and s.expired == 1
    s.ingest(parse(report(1, job="b")), T0 + 31)  # the job slot is free again


def test_ranks_that_go_silent_are_counted_lost_and_finished_ones_are_not() -> None:
    s = store(ttl=30.0)
    s.ingest(parse(report(1, job="a")), T0)
    s.ingest(parse(report(1, job="a", rank=1, world_size=2, incarnation="r1")), T0)
    s.ingest(parse(report(3, job="b", final=True)), T0)
    assert s.lost(T0 + 1) == {"a": 0, "b": 0}  # 0 from the first report: increase() sees the first loss
    s.ingest(parse(report(2, job="a", t=T0 + 20)), T0 + 20)  # rank 0 keeps reporting, rank 1 went silent
    assert s.lost(T0 + 45) == {"a": 1, "b": 0}  # b finished: gone, never lost
    assert s.lost(T0 + 60) == {"a": 2, "b": 0}  # then rank 0 went silent too
    assert s.lost(T0 + 61 + LOST_RETAIN) == {}  # an hour after the job was last seen


def test_a_finished_rank_lingers_briefly_then_goes() -> None:
    s = store(ttl=600.0)
    s.ingest(parse(report(5, final=True)), T0)
    assert len(s.views(T0 + FINISHED_LINGER - 1)) == 1
    assert s.views(T0 + FINISHED_LINGER + 1) == []


def test_history_is_bounded_to_the_window_plus_one_point() -> None:
    s = store(window=10.0)
    for i in range(1, 100):
        s.ingest(parse(report(i, t=T0 + i)), T0 + i)
    (view,) = s.views(T0 + 99)
    assert len(view.points) <= 12 and view.points[0].reported < T0 + 89 <= view.points[1].reported


def test_two_live_processes_as_one_rank_are_a_conflict_not_a_restart() -> None:
    s = store()
    s.ingest(parse(report(5, started=T0, incarnation="first", pid=100)), T0 + 1)
    s.ingest(parse(report(3, started=T0 + 2, incarnation="second", pid=200)), T0 + 3)
    # within the grace a late report of the replaced process is just stale ...
    with pytest.raises(Stale):
        s.ingest(parse(report(6, started=T0, incarnation="first", pid=100, t=T0 + 4)), T0 + 4)
    # ... but still reporting well after its successor started, it is a second live process
    with pytest.raises(Conflict) as exc:
        s.ingest(parse(report(9, started=T0, incarnation="first", pid=100, t=T0 + 20)), T0 + 20)
    assert "pid 200" in str(exc.value) and "pid 100" in str(exc.value) and "GPUMON_JOB" in str(exc.value)


def test_a_rank_that_went_and_came_back_continues_its_counters() -> None:
    s = store(ttl=30.0)
    s.ingest(parse(report(50, final=True)), T0)  # crashed: the SDK's at-exit report
    assert s.views(T0 + 100) == []  # gone from the series
    s.ingest(parse(report(5, started=T0 + 200, incarnation="again")), T0 + 201)
    (view,) = s.views(T0 + 201)
    assert view.restarts == 1 and view.offsets.steps + view.report.totals.steps == 55


def test_a_silent_process_that_comes_back_keeps_its_offsets_without_a_restart() -> None:
    s = store(ttl=30.0)
    s.ingest(parse(report(50, started=T0 - 100, incarnation="old")), T0 - 90)
    s.ingest(parse(report(10, started=T0, incarnation="cur")), T0)  # a restart: offsets 50
    assert s.views(T0 + 60) == []  # silent past the TTL (SIGSTOP, a partition)
    s.ingest(parse(report(20, started=T0, incarnation="cur", seq=99)), T0 + 61)
    (view,) = s.views(T0 + 61)
    assert view.restarts == 1 and view.offsets.steps + view.report.totals.steps == 70


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["step_seconds"].update(sum=0.0),
        lambda d: d["step_seconds"]["counts"].__setitem__(6, 0),
        lambda d: d.update(phases={}),
        lambda d: d.update(phases={"data_wait": 0.1}),
    ],
)
def test_every_cumulative_field_must_not_go_backwards(change) -> None:
    s = store()
    s.ingest(parse(report(10, phases={"data_wait": 1.0})), T0)
    later = report(20, phases={"data_wait": 2.0})
    change(later)
    with pytest.raises(ValueError, match="went backwards within one incarnation"):
        s.ingest(parse(later), T0 + 1)
