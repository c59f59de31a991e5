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
from gpumon.jobs.series.families import RowFamily
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
    return [g, c, created, info, hist, summ, stamped, with_unit, empty, *row_families()]


def row_families():
    """The training flow's RowFamily, with the same edge values and labels as prometheus_client's families."""
    g = RowFamily("edge_rows", 'rows "quoted"\nand a newline', "gauge", ["a", "b"])
    for i, value in enumerate(
        [math.nan, math.inf, -math.inf, 1e-300, 12345678.9, 1e22, -0.0, 0, 1, 1.0, -0.0]
    ):
        g.add_metric([f'v"{i}"', "back\\slash\nnew line ünï"], value)
    c = RowFamily("edge_row_steps_total", "counted", "counter", ["job"])
    c.add_metric(["a"], 0)
    c.add_metric(["b"], 2**63)
    h = RowFamily("edge_row_seconds", "a histogram", "histogram", ["job"])
    h.add_metric(["a"], [("0.1", 0.0), ("1.0", 2.0), ("+Inf", 2.0)], 0.7)
    h.add_metric(['q"uote'], [("0.1", 1.0), ("1.0", 1.0), ("+Inf", 3.0)], 9.5)
    odd = RowFamily("edge_row_odd", "a label name that needs quoting", "gauge", ["odd-name"])
    odd.add_metric(["v"], 1.0)  # no prefix can be cached for it: the family takes the samples' path
    return [g, c, h, odd, RowFamily("edge_row_empty", "none", "gauge", ["x"])]


def test_a_row_family_has_the_samples_prometheus_clients_own_family_would() -> None:
    rows = RowFamily("x_seconds", "h", "histogram", ["job"])
    own = HistogramMetricFamily("x_seconds", "h", labels=["job"])
    for fam in (rows, own):
        fam.add_metric(["a"], [("0.5", 1.0), ("+Inf", 4.0)], 2.5)
    assert rows == own and rows.samples == own.samples
    counter, own_counter = (
        RowFamily("n_total", "c", "counter", ["k"]),
        CounterMetricFamily("n_total", "c", labels=["k"]),
    )
    counter.add_metric(["v"], 3)
    own_counter.add_metric(["v"], 3)
    assert counter == own_counter


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


@pytest.mark.parametrize("openmetrics_format", [False, True], ids=["text", "openmetrics"])
def test_row_families_under_dots_escaping_match_the_sample_path(openmetrics_format) -> None:
    rows = row_families()
    plain = [Fixed([f]).collect()[0] for f in rows]
    # the same families through the samples path: prometheus_client's own types with those samples
    as_samples = []
    for f in plain:
        copy = GaugeMetricFamily(f.name, f.documentation) if f.type == "gauge" else None
        if copy is None:
            continue
        for smp in f.samples:
            copy.add_sample(smp.name, smp.labels, smp.value)
        as_samples.append(copy)
    renderer = Renderer()
    gauges = [f for f in rows if f.type == "gauge"]
    assert renderer.render(gauges, openmetrics_format=openmetrics_format, dots=True) == Renderer().render(
        as_samples, openmetrics_format=openmetrics_format, dots=True
    )


def test_the_cache_is_bounded() -> None:
    renderer = Renderer(max_series=50)
    for round_ in range(5):
        g = GaugeMetricFamily("churn", "series that come and go", labels=["id"])
        for i in range(40):
            g.add_metric([f"{round_}-{i}"], i)
        assert renderer.render([g], openmetrics_format=False) == generate_latest(Fixed([g]))
    assert len(renderer._prefixes) <= 90
