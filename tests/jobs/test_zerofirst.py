"""Counters of rare events (a badput cause, restarts, redone steps, allocator retries and OOMs): absent until
the first, then at 0 for two renders before their value, so rate() and increase() see the first one; at
their value at once when the daemon restarted under a running rank (a dip would count them twice)."""

from __future__ import annotations

from gpumon.jobs.series.zerofirst import SERVED_FIRST, ZeroFirst

KEY = ("llm", 0, "gpumon_training_restarts_total", ())


def test_a_counter_is_absent_until_its_first_event_then_zero_before_its_value() -> None:
    z = ZeroFirst(born=100.0)
    assert z.value(KEY, 0.0, started=150.0) is None
    assert z.value(KEY, 0.0, started=150.0) is None
    z.keep([("llm", 0)])
    shown = [z.value(KEY, 1.0, started=150.0) for _ in range(SERVED_FIRST + 2)]
    assert shown == [0.0] * SERVED_FIRST + [1.0, 1.0]
    assert z.value(KEY, 3.0, started=150.0) == 3.0  # growth after that is plain growth


def test_after_a_daemon_restart_a_running_ranks_counters_show_at_once() -> None:
    z = ZeroFirst(born=100.0)
    assert z.value(KEY, 2.0, started=50.0) == 2.0  # the rank's process is older than this daemon
    other = ("llm", 1, "gpumon_training_restarts_total", ())
    z.keep([("llm", 0), ("llm", 1)])
    # a rank seen already whose first event comes later is a first occurrence, whatever its age
    assert [z.value(other, 1.0, started=50.0) for _ in range(3)] == [0.0, 0.0, 1.0]


def test_a_rank_no_longer_exported_starts_afresh() -> None:
    z = ZeroFirst(born=100.0)
    z.keep([("llm", 0)])
    assert [z.value(KEY, 1.0, started=150.0) for _ in range(3)] == [0.0, 0.0, 1.0]
    z.keep([])
    assert z.value(KEY, 1.0, started=150.0) == 0.0
