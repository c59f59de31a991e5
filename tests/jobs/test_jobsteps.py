"""A job's step-time histogram on the node: the sum of its ranks' that never goes back when a rank leaves,
and counts a rank's steps afresh when its own counts fell (a new ledger)."""

from __future__ import annotations

from gpumon.jobs.series.jobsteps import JobSteps


def test_the_job_histogram_adds_up_its_ranks_and_keeps_what_a_rank_that_left_counted() -> None:
    j = JobSteps()
    j.add("llm", 0, (1.0, 2.0, 0.0), 3.0)
    j.add("llm", 1, (0.0, 4.0, 1.0), 9.0)
    assert j.get("llm") == ((1.0, 6.0, 1.0), 12.0)
    j.add("llm", 0, (1.0, 5.0, 0.0), 6.0)  # rank 0 grew; rank 1 left the node
    assert j.get("llm") == ((1.0, 9.0, 1.0), 15.0)
    j.add("llm", 1, (0.0, 1.0, 0.0), 1.0)  # rank 1 again, counted from 0: a new ledger
    assert j.get("llm") == ((1.0, 10.0, 1.0), 16.0)
    assert j.get("other") is None


def test_ranks_whose_counters_would_not_continue_are_forgotten_and_then_their_job() -> None:
    """Bounded by the store's ranks: a job cycling through rank numbers leaves nothing behind."""
    j = JobSteps()
    j.add("llm", 0, (1.0,), 1.0)
    j.add("llm", 1, (2.0,), 2.0)
    j.keep([("llm", 1)])
    assert j.get("llm") == ((3.0,), 3.0)  # what rank 0 counted stays in the job's totals
    j.add("llm", 0, (1.0,), 1.0)  # no offsets were kept for it: counted afresh
    assert j.get("llm") == ((4.0,), 4.0)
    j.keep([("chat", 0)])
    assert j.get("llm") is None


def test_after_a_daemon_restart_a_ranks_history_is_not_counted_as_new_steps() -> None:
    """Ranks older than the daemon report one by one after its start: the job's histogram counts their growth
    from then on, not their whole history as steps made since."""
    j = JobSteps(born=100.0)
    j.add("llm", 0, (5.0,), 5.0, process_started=50.0)
    j.add("llm", 1, (1.0,), 1.0, process_started=120.0)  # started after the daemon: all its steps are new
    assert j.get("llm") == ((1.0,), 1.0)
    j.add("llm", 0, (7.0,), 7.0, process_started=50.0)
    j.add("llm", 2, (900.0,), 900.0, process_started=50.0)  # a moment later, with its history
    assert j.get("llm") == ((3.0,), 3.0)
