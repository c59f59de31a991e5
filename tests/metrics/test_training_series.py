"""A training node's series, counted on the README's training command, against what the docs say it costs:
docs/deploy.md's sizing paragraph and docs/metrics.md's per-rank figure (gpumon/metrics/registry.py) must be
this measurement, not an older one."""

from __future__ import annotations

import re
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import ROOT

from gpumon.metrics.registry import render_markdown

RANKS = 8
COMMAND = ("--simulate", "8xH100-SXM", "--sim-job", "big:0-7")
# docs/deploy.md's sentence: "(1,013 measured with `--sim-job big:0-7`: the training flow adds 69 per rank"
SAID = r"\(([\d,]+) measured with `--sim-job big:0-7`: the training flow adds (\d+) per\s+rank"


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
    """The count once two scrapes a second apart agree and every rank has its step-time histogram."""
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
def test_the_docs_state_the_series_a_training_node_serves(daemon) -> None:
    total, rank_series = _steady(daemon(*COMMAND))
    per_rank = rank_series / RANKS
    assert per_rank == int(per_rank), (rank_series, RANKS)

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
