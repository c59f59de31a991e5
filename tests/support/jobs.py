"""A fixed training scene for exposition tests: two ranks of one job and an inference server, with a
baseline, at a fixed clock."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from gpumon.baselines import library as B
from gpumon.baselines.watch import LibraryWatch
from gpumon.jobs.analysis import Analysis
from gpumon.jobs.collector import IngestStats, TrainingCollector
from gpumon.jobs.report import parse
from gpumon.jobs.store import JobStore
from gpumon.nccl.reader import Claim, InspectorReader
from support.inspector import append, record
from support.reports import report


def jobs(snap, details: frozenset[str] = frozenset()) -> TrainingCollector:
    """A training job of two ranks (one restarted, with phases) and an inference server, at a fixed clock."""
    now = snap.timestamp
    store = JobStore(max_jobs=4, max_ranks=8, ttl=600.0, window=60.0)
    phases = {"data_wait": 1.25, "communication": 2.5}
    first = report(40, started=now - 30, phases=phases, world_size=2)
    # it resumed from step 35 of the 40 its predecessor made: 5 steps redone
    kw = {"incarnation": "b0b0b0b0", "phases": phases, "world_size": 2, "resumed_step": 35}
    restarted = report(20, started=now - 2.5, **kw)
    half = {"data_wait": 0.5, "communication": 1.5}
    earlier = report(10, started=now - 2.5, rank=1, world_size=2, devices=["1"], phases=half)
    other = report(20, started=now - 2.5, rank=1, world_size=2, devices=["1"], phases=phases)
    other["hostname"] = "node-1"  # its NCCL Inspector dump joins it (node-1-pid4242.log)
    other["memory"] = {  # a PyTorch rank on CUDA: its allocator's view
        "device": 0, "allocated_bytes": 30 << 30, "allocated_peak_bytes": 36 << 30,
        "reserved_bytes": 40 << 30, "reserved_peak_bytes": 42 << 30, "active_bytes": 31 << 30,
        "active_peak_bytes": 36 << 30, "inactive_split_bytes": 1 << 30, "alloc_retries": 3, "ooms": 1,
    }  # fmt: skip
    # rank 0 of a two-GPU server (rank 1 on another node): its one-GPU baseline is a scaling reference
    chat = {"job": "chat", "kind": "inference", "devices": ["2"], "dtype": "bf16", "peak_flops": 150e12}
    chat["world_size"] = 2
    serve_before = report(15, started=now - 3.5, **chat)  # two points: the window has a step time
    serve = report(30, started=now - 3.5, **chat)
    for r in (serve_before, serve):
        r["request_seconds"] = r["step_seconds"]
        r["totals"]["requests"] = r["totals"]["steps"]
    for r in (first, restarted, earlier, other, serve_before, serve):
        store.ingest(parse(r), now)
    stats = IngestStats()
    for outcome in ("accepted",) * 4 + ("invalid",):
        stats.count(outcome)
    key = B.Key("chat", "NVIDIA RTX A6000", 2, "bf16", "palm")
    ref = B.Baseline("chat/A6000", key, B.Figures(10_000.0, 0.125, 0.05, 40.0), recorded_at="2026-11-22")
    one = B.Baseline(
        "chat/A6000x1",
        dataclasses.replace(key, gpus=1),
        B.Figures(11_000.0, 0.12, 0.055, 42.0),
        recorded_at="2026-11-21",
    )
    path = Path(tempfile.mkdtemp()) / "baselines.toml"
    B.save(str(path), B.Library((ref, one)))
    watch = LibraryWatch(str(path), clock=lambda: 0.0)  # read once, at creation
    shutil.rmtree(path.parent)
    dumps = Path(tempfile.mkdtemp())
    claims = lambda: [Claim(*p) for p in store.processes()]  # noqa: E731
    nccl = InspectorReader(str(dumps), every=None, clock=lambda: now, claims=claims)
    nccl.read_once()
    records = [record("node-1", 4242, n, seconds=0.05, busbw_gbs=42.5) for n in range(1, 5)]
    append(
        dumps,
        "node-1",
        4242,
        [*records, record("node-1", 4242, 4), record("node-1", 4242, 9, op="Send", p2p=True)],
    )
    nccl.read_once()
    shutil.rmtree(dumps)
    analysis = Analysis(store, lambda: snap, clock=lambda: now, nccl=nccl.ledger)
    return TrainingCollector(analysis, stats, watch, details, nccl=nccl)
