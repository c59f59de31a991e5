"""Metric families for the training flow, kept as rows until something asks for samples.

The training families are built anew for every render (reports arrive between scrapes), about 13,500 series
at 256 ranks. prometheus_client's families turn each value into a Sample with a dict of its labels, and a
histogram into 19 of them; that, and the renderer's hashing of every sample's labels, made a training series
cost about 1.6-3x a GPU series. These families keep ``(suffix, label values, value)`` rows instead. The
daemon's renderer (gpumon/web/exposition.py) writes the rows directly, keyed by the label-value tuple it
already has; everything else (prometheus_client's encoders, ``name[]`` filtering, tests) reads ``samples``,
made from the rows on first use, exactly as prometheus_client's own families would have made them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

Row = tuple[
    str, tuple[str, ...], float
]  # sample-name suffix ("", "_total", "_bucket", …), label values, value


class RowFamily(Metric):
    """A gauge, counter, summary or histogram family with prometheus_client's ``add_metric`` signatures."""

    def __init__(self, name: str, documentation: str, typ: str, labels: Sequence[str]) -> None:
        if typ == "counter":
            name = name.removesuffix("_total")  # as CounterMetricFamily does
        super().__init__(name, documentation, typ)
        self.labelnames = tuple(labels)
        self.bucket_labelnames = (*self.labelnames, "le")
        self.rows: list[Row] = []
        self._suffix = "_total" if typ == "counter" else ""

    # Metric.__init__ assigns ``samples = []``; afterwards they are derived from the rows
    @property  # type: ignore[override]
    def samples(self) -> list[Sample]:
        made = []
        for suffix, values, value in self.rows:
            names = self.bucket_labelnames if suffix == "_bucket" else self.labelnames
            made.append(Sample(self.name + suffix, dict(zip(names, values, strict=True)), value))
        return made

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:
            raise TypeError("a RowFamily takes rows through add_metric, not samples")

    def add_metric(self, labels: Sequence[str], value: Any, sum_value: float | None = None) -> None:
        """``value``: a number; for a histogram, its cumulative (le, count) buckets, +Inf last, and
        ``sum_value``; for a summary (without quantiles), its count and ``sum_value``."""
        key = tuple(labels)
        if self.type == "summary":
            self.rows.append(("_count", key, value))
            self.rows.append(("_sum", key, 0.0 if sum_value is None else sum_value))
            return
        if self.type != "histogram":
            self.rows.append((self._suffix, key, value))
            return
        rows = self.rows
        for le, count in value:
            rows.append(("_bucket", (*key, le), count))
        if sum_value is not None:  # as HistogramMetricFamily: with a sum come _count and _sum
            rows.append(("_count", key, value[-1][1]))
            rows.append(("_sum", key, sum_value))
