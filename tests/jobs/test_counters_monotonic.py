"""Every exported training counter only grows, whatever sequence of accepted reports a rank sends: restarts
(new incarnations), custom phase names past what a rank can export on its own, reports without their
allocator counters, counters the process reset (issue 30 item 5).

A property test: hypothesis draws a rank's life, the store ingests it report by report, and after each
accepted report the collector's exposition is read; every counter sample (a ``_total``, a histogram's
buckets, count and sum) is compared with the largest value that series ever showed, so a series that went
away and came back lower fails as surely as one that went down."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.reports import T0, histogram, report

from gpumon.client import protocol as P
from gpumon.jobs.analysis import Analysis
from gpumon.jobs.collector import IngestStats, TrainingCollector
from gpumon.jobs.report import parse
from gpumon.jobs.store import MAX_CARRIED_PHASES, OTHER_PHASES, JobStore

NAMES = [f"custom_{i:02d}" for i in range(40)] + list(P.PHASES)


@dataclass
class Life:
    """One process of the rank, as its reports count."""

    incarnation: str
    started: float
    seq: int = 0
    steps: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    retries: int = 0
    ooms: int = 0


step = st.fixed_dictionaries(
    {
        "restart": st.booleans(),
        "steps": st.integers(0, 20),
        "new_phases": st.lists(st.sampled_from(NAMES), max_size=6, unique=True),
        "grow": st.floats(0.0, 5.0),
        "memory": st.sampled_from(["counts", "null", "no_retries", "reset"]),
        "retries": st.integers(0, 50),
    }
)


def _report(life: Life, now: float, s: dict[str, Any]) -> dict[str, Any]:
    life.seq += 1
    life.steps += s["steps"]
    for name in s["new_phases"]:
        if name in life.phases or len(life.phases) < P.MAX_PHASES:
            life.phases.setdefault(name, 0.0)
    for name in life.phases:
        life.phases[name] += s["grow"]
    if s["memory"] == "reset":  # torch.cuda.reset_accumulated_memory_stats
        life.retries, life.ooms = 0, 0
    life.retries += s["retries"]
    life.ooms += s["retries"] // 10
    memory: dict[str, Any] | None = {
        "allocated_bytes": 1 << 30,
        "alloc_retries": life.retries,
        "ooms": life.ooms,
    }
    if s["memory"] == "null":
        memory = None
    elif s["memory"] == "no_retries" and memory is not None:
        del memory["alloc_retries"]
    r = report(
        life.steps,
        t=now,
        seq=life.seq,
        started=life.started,
        incarnation=life.incarnation,
        phases=dict(life.phases),
        memory=memory,
    )
    r["updated"] = now if life.steps else None
    r["anchor"] = None if not life.steps else {"time": life.started + 0.1, "steps": 1, "tokens": 1000,
                                               "samples": 1, "requests": 0}  # fmt: skip
    r["step_seconds"] = histogram(max(0, life.steps - 1), 0.1)
    return r


def _counters(c: TrainingCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in c.collect():
        if fam.type not in ("counter", "histogram", "summary"):
            continue
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=25))
def test_no_exported_counter_ever_goes_back(steps: list[dict[str, Any]]) -> None:
    store = JobStore(max_jobs=4, max_ranks=8, ttl=600.0, window=60.0)
    now = T0 + 1000.0
    collector = TrainingCollector(Analysis(store, lambda: None, clock=lambda: now), IngestStats())
    life = Life("inc00000", now - 10.0)
    highest: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for n, s in enumerate(steps):
        now += 1.0
        if s["restart"]:
            life = Life(f"inc{n:05d}", now - 0.5)
        store.ingest(parse(_report(life, now, s)), now)
        for key, value in _counters(collector).items():
            assert value >= highest.get(key, 0.0), f"{key} went from {highest.get(key)} to {value}"
            highest[key] = value
        gone = [k for k in highest if k not in _counters(collector) and k[0].startswith("gpumon_training_")]
        assert gone == [], f"counters that vanished: {gone}"
    names = {dict(k[1]).get("phase") for k in highest if k[0] == "gpumon_training_phase_seconds_total"}
    assert len(names - {OTHER_PHASES}) <= MAX_CARRIED_PHASES


def test_a_rank_past_its_phase_names_counts_the_rest_under_other() -> None:
    """Four processes of one rank, each with 16 new custom phase names (the break found: 100 -> 1)."""
    store = JobStore(max_jobs=4, max_ranks=8, ttl=600.0, window=60.0)
    now = T0 + 1000.0
    collector = TrainingCollector(Analysis(store, lambda: None, clock=lambda: now), IngestStats())
    seen: dict[str, float] = {}
    for k in range(4):
        life = Life(f"inc{k:05d}", now)
        for seconds in (1.0, 100.0):
            now += 1.0
            life.phases = {f"custom_{(16 * k + i) % 40:02d}": seconds for i in range(16)}
            store.ingest(parse(_report(life, now, {"steps": 1, "new_phases": [], "grow": 0.0,
                                                   "memory": "counts", "retries": 0})), now)  # fmt: skip
            for key, value in _counters(collector).items():
                if key[0] == "gpumon_training_phase_seconds_total":
                    phase = dict(key[1])["phase"]
                    assert value >= seen.get(phase, 0.0), (phase, seen.get(phase), value)
                    seen[phase] = value
    assert len(seen) == MAX_CARRIED_PHASES + 1 and OTHER_PHASES in seen
    # names 0-31 are exported; the third process's 32-39 are the only ones past them (100 s each)
    assert seen[OTHER_PHASES] == 8 * 100.0


def test_an_allocator_counter_survives_a_report_without_it_and_a_reset() -> None:
    """100 retries, then a report with memory null, then the process resets its counters and counts 10:
    exported 100, 100, 110 (the break found: 100, absent, 10)."""
    store = JobStore(max_jobs=4, max_ranks=8, ttl=600.0, window=60.0)
    now = T0 + 1000.0
    collector = TrainingCollector(Analysis(store, lambda: None, clock=lambda: now), IngestStats())
    life = Life("inc00000", now - 5.0)
    got = []
    for memory, retries in (("counts", 100), ("null", 0), ("reset", 10)):
        now += 1.0
        s = {"steps": 1, "new_phases": [], "grow": 0.0, "memory": memory, "retries": retries}
        store.ingest(parse(_report(life, now, s)), now)
        c = _counters(collector)
        got.append(
            next((v for (name, _), v in c.items() if name == "gpumon_training_allocator_retries_total"), None)
        )
    assert got == [100.0, 100.0, 110.0]
