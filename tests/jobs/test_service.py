"""Training.state: what a shared /metrics render of the training families depends on (gpumon/web/scrape.py
reuses a render only while it is unchanged), so every request that changes those families changes it."""

from __future__ import annotations

from pathlib import Path

from support.reports import T0, report

from gpumon.baselines import library as B
from gpumon.baselines.watch import CHECK_EVERY, LibraryWatch
from gpumon.jobs.analysis import Analysis
from gpumon.jobs.api import IngestPolicy
from gpumon.jobs.collector import IngestStats
from gpumon.jobs.report import parse
from gpumon.jobs.service import Training
from gpumon.jobs.store import JobStore


def test_the_state_changes_with_each_report_counted_each_rank_expired_and_each_library_reload(
    tmp_path: Path,
) -> None:
    now = [0.0]
    store = JobStore(max_jobs=4, max_ranks=8, ttl=5.0, window=60.0)
    library = LibraryWatch(str(tmp_path / "baselines.toml"), clock=lambda: now[0])
    training = Training(Analysis(store, lambda: None), IngestStats(), IngestPolicy(), library)
    first = training.state()
    assert training.state() == first  # reading it changes nothing

    training.stats.count("invalid")  # even a refused report is a series (gpumon_ingest_reports_total)
    counted = training.state()
    assert counted != first

    store.ingest(parse(report(10, t=T0 + 1)), T0 + 1)
    training.stats.count("accepted")
    stored = training.state()
    assert stored != counted
    store.views(T0 + 100)  # a rank silent past --rank-ttl goes when anything reads the store
    assert training.state() != stored

    expired = training.state()
    baseline = B.Baseline("a", B.Key("w", "g", 1, "bf16", "palm"), B.Figures(1.0, 1.0, 0.5, 1.0))
    B.save(str(tmp_path / "baselines.toml"), B.Library((baseline,)))
    assert training.state() == expired  # not yet: the watch looks at the file at most every 2 s
    now[0] += CHECK_EVERY
    # and reading the state is such a look, so that a document or render built before a reload is not reused
    # after it: `baseline compare` right after `record` needs nothing else (no scrape) to read the file
    assert training.state() != expired
