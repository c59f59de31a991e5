"""Counters of rare events (a badput cause, restarts, redone steps, allocator retries and OOMs): absent until
the first, then at 0 for --counter-hold seconds and two renders before their value, so rate() and increase()
see the first one whoever else scrapes; a counter the training process keeps is at its value at once when
the daemon restarted under the process (a dip would count it twice)."""

from __future__ import annotations

from gpumon.zerofirst import ZeroFirst

KEY = ("llm", 0, "gpumon_training_restarts_total", ())


def test_a_counter_is_absent_until_its_first_event_then_zero_for_the_hold() -> None:
    z = ZeroFirst(born=100.0, hold=10.0)
    assert z.value(KEY, 0.0, now=150.0) is None
    z.keep([("llm", 0)], [])
    # a second scraper's renders (here 50 within the hold) cannot use up the zeros Prometheus needs
    assert {z.value(KEY, 1.0, now=150.0 + i * 0.1) for i in range(50)} == {0.0}
    assert z.value(KEY, 1.0, now=160.0) == 1.0
    assert z.value(KEY, 3.0, now=160.5) == 3.0  # growth after that is plain growth


def test_two_renders_at_zero_however_short_the_hold() -> None:
    z = ZeroFirst(born=100.0, hold=0.0)
    assert [z.value(KEY, 1.0, now=150.0) for _ in range(3)] == [0.0, 0.0, 1.0]


def test_after_a_daemon_restart_only_the_processes_own_counters_show_at_once() -> None:
    z = ZeroFirst(born=100.0, hold=0.0)
    retries = ("llm", 0, "gpumon_training_allocator_retries_total", ())
    assert z.value(retries, 2.0, now=101.0, process_started=50.0) == 2.0  # exported by the daemon before
    # the daemon's own counters start afresh with it: a restart it books is news, shown at 0 first
    assert z.value(KEY, 1.0, now=101.0) == 0.0
    z.keep([("llm", 0), ("llm", 1)], [])
    # a rank seen already whose first event comes later is a first occurrence, whatever its process's age
    other = ("llm", 1, "gpumon_training_allocator_ooms_total", ())
    assert [z.value(other, 1.0, now=102.0, process_started=50.0) for _ in range(3)] == [0.0, 0.0, 1.0]


def test_a_rank_the_store_still_keeps_continues_and_one_it_dropped_starts_afresh() -> None:
    z = ZeroFirst(born=100.0, hold=0.0)
    assert [z.value(KEY, 1.0, now=150.0) for _ in range(3)] == [0.0, 0.0, 1.0]
    z.keep([], retained=[("llm", 0)])  # gone, its offsets kept: back, its counter goes on
    assert z.value(KEY, 1.0, now=151.0) == 1.0
    z.keep([], retained=[])
    assert z.value(KEY, 1.0, now=152.0) == 0.0
