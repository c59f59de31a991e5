"""Snapshot → exposition: a golden file, every registered metric actually served, naming conventions, docs."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import ROOT, set_state
from support.jobs import jobs

from gpumon import metrics as M
from gpumon.gpu import collector as collector_module
from gpumon.gpu import xid
from gpumon.gpu.attribution.ownership import GpuOwnership, OwnedProcess
from gpumon.gpu.collector import SnapshotCollector, build_families
from gpumon.gpu.events import EventsView
from gpumon.gpu.sim.catalog import MiB
from gpumon.gpu.sim.device import SimProcess
from gpumon.gpu.snapshot import CollectorStatus
from gpumon.gpu.types import MigReading, ProfilingReading
from gpumon.host import HostReading
from gpumon.jobs.collector import TrainingCollector
from gpumon.net.netdev import read_netdevs
from gpumon.net.rdma import RdmaPort, read_ports
from gpumon.web.connections import Gate, Limits

GOLDEN = Path(__file__).parent / "golden" / "metrics.prom"


def exposition(
    snap,
    training: TrainingCollector | None = None,
    *,
    serving: Gate | None = None,
    details: frozenset[str] = frozenset(),
) -> str:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snap, node="node-1", details=details))
    if training is not None:
        registry.register(training)
    if serving is not None:
        registry.register(serving)
    return generate_latest(registry).decode()


def pinned(snap):
    """The snapshot with every wall-clock value fixed, so the exposition is byte-for-byte stable."""
    gpus = tuple(
        dataclasses.replace(
            g,
            duration_seconds=0.004,
            last_success=1.7e9 if g.last_success else None,
            reading=None
            if g.reading is None
            else dataclasses.replace(g.reading, timestamp=1.7e9, duration_seconds=0.004),
        )
        for g in snap.gpus
    )
    profiling = ProfilingReading("gpm", 0.99, 0.93, 0.55, 0.62, 0.38, 0.0, 0.08, 0.05, 2e9, 1.5e8, 4e10, 4e10)
    gpus = (
        dataclasses.replace(gpus[0], reading=dataclasses.replace(gpus[0].reading, profiling=profiling)),
        *gpus[1:],
    )
    host = HostReading(0.25, 64, 2.0 * 2**40, 1.5 * 2**40, 3.5, 3.0, 2.5)
    u0 = gpus[0].info.uuid
    events = EventsView(
        running=True,
        registered={u0: ("xid", "ecc_double_bit")},
        support={u0: "supported"},
        counts={(u0, "xid"): 3, (u0, "ecc_double_bit"): 0},
        last={(u0, "xid"): 1.7e9},
        xids={(u0, 79): 2, (u0, 13): 1},
        xid_last={(u0, 79): 1.7e9, (u0, 13): 1.6e9},
    )
    owned = OwnedProcess(4321, "torchrun", "alice", "ab" * 32, "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    owned = dataclasses.replace(owned, namespace="research", pod="llama-0", container="trainer")
    owners = {u0: GpuOwnership({4321: owned}, ("research", "llama-0", "trainer", ""))}
    procs = tuple(dataclasses.replace(p, last_seen=1.7e9) for p in gpus[0].reading.processes)
    mig = (
        MigReading("MIG-5f20ae9a-fafe-9163-d971-b814e9e85212", 1, 0, "3g.40gb", 4.2e10, 1e10, profiling),
        MigReading("MIG-a6ceea0e-5f7f-5dfd-daff-f11a7d94d6b3", 2, 0, "1g.10gb", 1.05e10, 0.0, None),
    )
    reading = dataclasses.replace(gpus[0].reading, processes=procs, mig=mig)
    gpus = (dataclasses.replace(gpus[0], reading=reading), *gpus[1:])
    return dataclasses.replace(
        snap,
        owners=owners,
        timestamp=1.7e9,
        gpus=gpus,
        host=host,
        collectors=(
            CollectorStatus("gpu", True, 0.02),
            CollectorStatus("host", True, 0.001),
            CollectorStatus("nic", True, 0.002),
            CollectorStatus("events", True, 0.0),
        ),
        events=events,
        # a captured host's RDMA ports (tests/fixtures/sysfs), all the detail read: nic-detail decides
        nics=_one_symbol_error(
            read_ports(str(ROOT / "tests" / "fixtures" / "sysfs" / "procfs"), detail=True)
        ),
        nic_affinity=((u0, "mlx5_0", "PIX"),),
        # the captured host's two Ethernet interfaces, one of which dropped 7 packets
        netdevs=tuple(
            dataclasses.replace(n, errors={**n.errors, "rx_dropped": 7}) if n.errors else n
            for n in read_netdevs(str(ROOT / "tests" / "fixtures" / "sysfs" / "procfs"))
        ),
    )


def _one_symbol_error(ports: tuple[RdmaPort, ...]) -> tuple[RdmaPort, ...]:
    """The captured ports, the first with 3 symbol errors (a cable reseated once): the error counters are
    served from their first rise (gpumon/zerofirst.py), so a port without one serves none."""
    first = dataclasses.replace(ports[0], errors={**ports[0].errors, "symbol_error": 3})
    return (first, *ports[1:])


@pytest.fixture
def mixed_node(sims, samplers):
    """A node with one of everything: a full H100, an A100 (PCIe rate fallback), an RTX A6000 (fan, no ECC,
    no NVLink) and a lost H100."""
    sim = sims("1xH100-SXM,1xA100,1xRTX-A6000,1xH100-SXM", static=True)
    for i in range(3):
        set_state(sim, i)
    sim.gpus[0].processes = [SimProcess(4321, 60_000 * MiB, 0.97, 0.41, name="torchrun")]
    sampler = samplers(sim, timeout=1.0)
    sampler.sweep()
    sim.faults.add("lost:3")
    return sampler.sweep()


def test_golden_exposition(mixed_node, monkeypatch) -> None:
    monkeypatch.setattr(collector_module.platform, "python_version", lambda: "3.x")
    snap = pinned(mixed_node)
    text = exposition(snap, jobs(snap))
    if os.environ.get("GPUMON_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "exposition changed; if intended, rerun with GPUMON_UPDATE_GOLDEN=1"


def test_every_registered_metric_is_served_and_nothing_else(mixed_node) -> None:
    snap = pinned(mixed_node)
    every = frozenset(M.DETAILS)
    text = exposition(snap, jobs(snap, every), serving=Gate(Limits()), details=every)
    served = {f.name for f in text_string_to_metric_families(text)}
    registered = {m.name.removesuffix("_total") if m.type == "counter" else m.name for m in M.REGISTRY}
    assert registered - served == set(), "registered but never served"
    assert served - registered == set(), "served but not in gpumon/metrics/"


def test_a_scrape_hands_each_jobs_baseline_step_time_to_the_goodput_ledger(mixed_node) -> None:
    """The ledger's slow steps are measured at ingest, between scrapes: a scrape keeps the matched baseline's
    step time where ingest reads it (the sampler's listener does too, every 10 s)."""
    collector = jobs(pinned(mixed_node))
    assert collector.analysis.store.baseline_steps == {}
    list(collector.collect())
    assert collector.analysis.store.baseline_steps == {"chat": 0.125}  # the scene's one baseline


def test_a_down_gpu_keeps_its_health_series_and_loses_its_values(mixed_node) -> None:
    text = exposition(mixed_node)
    uuid = mixed_node.gpus[3].info.uuid
    lines = [ln for ln in text.splitlines() if f'uuid="{uuid}"' in ln]
    names = {ln.split("{")[0] for ln in lines}
    assert f'gpumon_gpu_up{{gpu="3",uuid="{uuid}"}} 0.0' in lines
    assert "gpumon_gpu_power_watts" not in names and "gpumon_gpu_energy_joules_total" not in names
    assert {"gpumon_gpu_info", "gpumon_gpu_up"} <= names
    timing = exposition(mixed_node, details=frozenset({"sampler-timing"}))
    assert f'gpumon_gpu_last_sample_timestamp_seconds{{gpu="3",uuid="{uuid}"}}' in timing  # since when


def test_unsupported_quantities_are_absent_not_zero(mixed_node) -> None:
    text = exposition(mixed_node)
    a6000 = mixed_node.gpus[2].info.uuid
    h100 = mixed_node.gpus[0].info.uuid
    assert f'gpumon_gpu_fan_speed_ratio{{gpu="2",uuid="{a6000}"}}' in text
    assert f'gpumon_gpu_fan_speed_ratio{{gpu="0",uuid="{h100}"}}' not in text
    assert not re.search(rf'gpumon_gpu_ecc_errors_total\{{gpu="2",type="\w+",uuid="{a6000}"}}', text)


def test_the_collector_builds_families_once_per_snapshot(mixed_node) -> None:
    collector = SnapshotCollector(lambda: mixed_node)
    first = list(collector.collect())
    assert all(a is b for a, b in zip(first, collector.collect(), strict=True))


def test_no_snapshot_yet_serves_nothing_rather_than_zeros() -> None:
    assert list(SnapshotCollector(lambda: None).collect()) == []


def test_families_without_samples_are_left_out(sims, samplers) -> None:
    snap = samplers(sims("1xL4", static=True)).sweep()
    names = {f.name for f in build_families(snap)}
    assert "gpumon_gpu_nvlink_transmit_bytes" not in names
    assert "gpumon_gpu_memory_temperature_celsius" not in names


UNIT_SUFFIX = {
    "bytes": "_bytes",
    "seconds": "_seconds",
    "watts": "_watts",
    "joules": "_joules",
    "celsius": "_celsius",
    "hertz": "_hertz",
    "ratio": "_ratio",
    "bytes/s": "_bytes_per_second",
}


@pytest.mark.parametrize("m", M.REGISTRY, ids=lambda m: m.name)
def test_metric_names_follow_prometheus_conventions(m: M.Metric) -> None:
    assert re.fullmatch(r"gpumon_[a-z0-9_]+", m.name)
    assert m.type in ("gauge", "counter", "histogram", "summary")
    if m.type == "counter":
        assert m.name.endswith("_total")
    else:
        assert not m.name.endswith(("_total", "_count", "_sum", "_bucket"))
    if m.unit:
        assert m.name.removesuffix("_total").endswith(UNIT_SUFFIX[m.unit]), f"{m.name} lacks its unit"
    if m.name.startswith("gpumon_gpu_"):
        assert m.labels[:2] == ("gpu", "uuid")
    assert m.help.endswith(".") and len(m.help) > 10
    assert '"' not in m.help and "\\" not in m.help, "promtool rejects escaped quotes in HELP"


def test_names_are_unique() -> None:
    assert len({m.name for m in M.REGISTRY}) == len(M.REGISTRY)


def test_docs_metrics_md_is_generated_from_the_registry() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert doc == M.render_markdown(), "docs/metrics.md is stale: python -m gpumon.metrics > docs/metrics.md"


def test_docs_xid_md_is_generated_from_the_catalogue() -> None:
    doc = (ROOT / "docs" / "xid.md").read_text()
    assert doc == xid.render_markdown(), "docs/xid.md is stale: python -m gpumon.gpu.xid > docs/xid.md"
