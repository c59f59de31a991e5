"""A training node's series: the README's training command within the budget (at most 600 series on an
8-GPU node with an 8-rank job, at most 20 per rank), what the docs say it costs (docs/deploy.md's sizing
paragraph and docs/metrics.md's per-rank figure, gpumon/metrics/registry.py), what each training detail adds
per rank, and that a rank's restart makes no new series where the old ones continue."""

from __future__ import annotations

import re
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import ROOT
from support.jobs import jobs
from support.reports import T0, report

from gpumon.jobs.analysis import Analysis
from gpumon.jobs.collector import IngestStats, TrainingCollector
from gpumon.jobs.report import parse
from gpumon.jobs.store import JobStore
from gpumon.metrics.registry import render_markdown

RANKS = 8
BUDGET, PER_RANK_BUDGET = 600, 20
COMMAND = ("--simulate", "8xH100-SXM", "--sim-job", "big:0-7")
# docs/deploy.md's sentence: "(592 measured with `--sim-job big:0-7`: the training flow adds 16 per rank"
SAID = r"\(([\d,]+) measured with `--sim-job big:0-7`: the training flow adds (\d+) per\s+rank"
# what each training detail adds per rank, as gpumon/metrics/registry.py's DETAILS says
RANK_ADDS = {"rank-rates": 19, "rank-step-buckets": 17, "rank-detail": 4}


def _count(text: str) -> tuple[int, int]:
    """(every series, the series of a rank) of one exposition."""
    total = per_rank = 0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            total += 1
            per_rank += "rank" in s.labels
    return total, per_rank


def _steady(d, timeout: float = 30.0) -> tuple[int, int]:
    """The count once two scrapes a second apart agree and every rank has its step-time sum."""
    end = time.monotonic() + timeout
    last = None
    while True:
        text = d.get("/metrics").text
        now = _count(text)
        if now == last and text.count("gpumon_training_step_duration_seconds_count{") >= RANKS:
            return now
        assert time.monotonic() < end, f"the series count did not settle: {last} then {now}"
        last = now
        time.sleep(1.0)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.slow
def test_a_training_node_serves_its_budget_and_the_docs_say_so(daemon) -> None:
    total, rank_series = _steady(daemon(*COMMAND))
    per_rank = rank_series / RANKS
    assert per_rank == int(per_rank), (rank_series, RANKS)
    assert total <= BUDGET and per_rank <= PER_RANK_BUDGET, (total, per_rank)

    deploy = (ROOT / "docs" / "deploy.md").read_text()
    m = re.search(SAID, deploy)
    assert m, "docs/deploy.md no longer states the training node's series as this test reads them"
    assert (_number(m.group(1)), _number(m.group(2))) == (total, per_rank), (
        f"docs/deploy.md says {m.group(1)} series and {m.group(2)} per rank; "
        f"measured {total} and {per_rank:.0f}"
    )

    said = re.findall(r"about (\d+) per rank", render_markdown())
    assert said and {int(x) for x in said} == {per_rank}, (
        f"docs/metrics.md (gpumon/metrics/registry.py) says {said} per rank; measured {per_rank:.0f}"
    )


def _rank_series(text: str, job: str, rank: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    out = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("job_name") == job and s.labels.get("rank") == rank:
                out.add((s.name, tuple(sorted(s.labels.items()))))
    return out


def _render(c: TrainingCollector) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(c)
    return generate_latest(registry).decode()


@pytest.mark.parametrize("name", list(RANK_ADDS))
def test_each_training_detail_adds_what_it_says_per_rank(mixed_snapshot, name: str) -> None:
    """Rank 1 of the scene reports two phases and its allocator: rank-rates adds one per phase besides."""
    base = _rank_series(_render(jobs(mixed_snapshot)), "llm", "1")
    more = _rank_series(_render(jobs(mixed_snapshot, frozenset({name}))), "llm", "1")
    phases = 2 if name == "rank-rates" else 0
    assert base <= more and len(more) - len(base) == RANK_ADDS[name] + phases, sorted(more - base)


@pytest.fixture
def mixed_snapshot(sims, samplers):
    sim = sims("2xH100-SXM", static=True)
    return samplers(sim).sweep()


def test_a_restart_makes_no_new_series_but_its_own_counters() -> None:
    """A rank's restart continues its series; the first restart adds its two restart counters (absent until
    then), and no later restart adds any."""
    store = JobStore(max_jobs=4, max_ranks=8, ttl=600.0, window=60.0)
    clock = [T0]
    analysis = Analysis(store, lambda: None, clock=lambda: clock[0])
    collector = TrainingCollector(analysis, IngestStats(), counter_hold=0.0)
    seen: list[set] = []
    for n, incarnation in enumerate(("aaaa0000", "bbbb1111", "cccc2222")):
        started = clock[0] + 1.0
        for steps in (10, 20):
            clock[0] = started + steps * 0.1 + 1.0
            phases = {"data_wait": steps * 0.02, "communication": steps * 0.03}
            kw = {"incarnation": incarnation, "pid": 4242 + n, "seq": steps, "phases": phases}
            r = report(steps, started=started, **kw)
            r["time"] = clock[0]
            store.ingest(parse(r), clock[0])
            for _ in range(3):  # past the rare counters' renders at 0
                text = _render(collector)
        seen.append(_rank_series(text, "llm", "0"))
    first, second, third = seen
    added = {name for name, _ in second - first}
    assert added == {"gpumon_training_restarts_total", "gpumon_training_badput_seconds_total"}, added
    assert {dict(labels)["cause"] for name, labels in second - first if "badput" in name} == {"restart"}
    assert first <= second and third == second
