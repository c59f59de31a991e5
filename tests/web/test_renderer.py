"""The fast renderer must write exactly what prometheus_client's encoders write, in both formats."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from support.jobs import jobs

from gpumon.gpu.collector import SnapshotCollector
from gpumon.web.exposition import Renderer


class Fixed:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return list(self.families)


def edge_families():
    g = GaugeMetricFamily("edge_gauge", 'doc with "quotes", a \\ backslash\nand a newline', labels=["a", "b"])
    for i, value in enumerate([math.nan, math.inf, -math.inf, 1e-300, 12345678.9, 1e22, -0.0, 0, 2**63, 0.1]):
        g.add_metric([f'v"{i}"', "back\\slash\nnew line ünï"], value)
    c = CounterMetricFamily("edge_requests", "requests", labels=["code"])
    c.add_metric(["200"], 7)
    created = CounterMetricFamily("edge_created", "with created", labels=["x"], created=1.7e9)
    created.add_metric(["y"], 3, created=1.7e9)
    info = InfoMetricFamily("edge_build", "info", value={"version": "1"})
    hist = HistogramMetricFamily(
        "edge_latency_seconds", "h", buckets=[("0.1", 1), ("+Inf", 3)], sum_value=0.5
    )
    summ = SummaryMetricFamily("edge_sizes", "s", count_value=2, sum_value=10)
    stamped = GaugeMetricFamily("edge_stamped", "with a timestamp")
    stamped.add_metric([], 1.0, timestamp=1.7e9)
    with_unit = GaugeMetricFamily("edge_bytes", "unit", unit="bytes")
    with_unit.add_metric([], 5)
    empty = GaugeMetricFamily("edge_empty", "no samples")
    return [g, c, created, info, hist, summ, stamped, with_unit, empty]


def families_of(node_snapshot):
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: node_snapshot))
    registry.register(jobs(node_snapshot))  # training series: histograms with labels among them
    ProcessCollector(registry=registry)
    return list(registry.collect())


@pytest.fixture
def node_snapshot(sims, samplers):
    sim = sims("1xH100-SXM,1xA100,1xRTX-A6000,1xH100-SXM", seed=2)
    sampler = samplers(sim, timeout=1.0)
    sampler.sweep()
    sim.faults.add("lost:3")
    return sampler.sweep()


@pytest.mark.parametrize("openmetrics_format", [False, True], ids=["text", "openmetrics"])
def test_byte_identical_to_prometheus_client(node_snapshot, openmetrics_format) -> None:
    families = families_of(node_snapshot) + edge_families()
    expected = (generate_openmetrics if openmetrics_format else generate_latest)(Fixed(families))
    renderer = Renderer()
    assert renderer.render(families, openmetrics_format=openmetrics_format) == expected
    assert renderer.render(families, openmetrics_format=openmetrics_format) == expected  # from the cache


def test_the_cache_is_bounded() -> None:
    renderer = Renderer(max_series=50)
    for round_ in range(5):
        g = GaugeMetricFamily("churn", "series that come and go", labels=["id"])
        for i in range(40):
            g.add_metric([f"{round_}-{i}"], i)
        assert renderer.render([g], openmetrics_format=False) == generate_latest(Fixed([g]))
    assert len(renderer._prefixes) <= 90
