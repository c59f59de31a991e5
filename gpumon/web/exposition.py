"""Metric families → exposition bytes, identical to prometheus_client's encoders but several times faster.

prometheus_client re-escapes every label name and value of every sample on every scrape (about 8 µs a
sample on a small VM: ~8 ms for the ~900 series of an 8-GPU node). A node's series barely change between
scrapes, so this renderer formats each series' name and labels once and keeps the string while the series
exists; a scrape then only formats values. It covers what gpumon emits (gauges, counters and histograms
without timestamps or exemplars); any other family is handed to prometheus_client's own encoder, and tests
hold the output byte-for-byte equal to ``generate_latest`` in both formats.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.utils import floatToGoString

_SIMPLE_TYPES = ("gauge", "counter", "histogram", "unknown")
# names that need no escaping in any scheme; anything else goes to prometheus_client's encoder
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _escape_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _dots(name: str) -> str:
    """Prometheus's dots escaping of a legacy name: underscores doubled (a dot would be _dot_; no legacy name
    has one)."""
    return name.replace("_", "__")


class _One:
    """A collector of one family, to hand a family prometheus_client's own encoder."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


class Renderer:
    """Thread-safe; one per server. Caches the formatted prefix of the series it has seen, about as many as
    are live (a few times the largest render) however many jobs come and go."""

    def __init__(self, max_series: int = 100_000, min_series: int = 10_000) -> None:
        self._prefixes: dict[tuple, str] = {}
        self._dotted: dict[tuple, str] = {}  # the same under dots escaping
        self._headers: dict[tuple, str] = {}
        self._lock = threading.Lock()
        self._max = max_series
        self._min = min_series
        self._largest = 0  # series in the largest render so far: the live set, give or take

    def render(self, families: Iterable[Metric], *, openmetrics_format: bool, dots: bool = False) -> bytes:
        """The exposition of ``families``; ``dots``: with Prometheus's dots name escaping (escaping=dots)."""
        out: list[str] = []
        with self._lock:
            # series churned far past the live set (jobs come and go, each with ~60 series): start afresh.
            # A prefix costs ~600 bytes, so a fixed 100,000 let 60 MB of departed jobs' series pile up;
            # four times the largest render keeps the dead at most three times the live.
            if len(self._prefixes) + len(self._dotted) > min(self._max, max(self._min, 4 * self._largest)):
                self._prefixes.clear()
                self._dotted.clear()
            series = 0
            for metric in families:
                rows = getattr(metric, "rows", None)  # gpumon.jobs.series.families.RowFamily
                series += len(metric.samples) if rows is None else len(rows)
                lines = None if rows is None else self._row_lines(metric, rows, openmetrics_format, dots)
                if lines is None:  # a family of samples, or rows that need what only samples can do
                    lines = self._lines(metric, openmetrics_format, dots)
                out.append(
                    self._fallback(metric, openmetrics_format, dots) if lines is None else "".join(lines)
                )
            self._largest = max(self._largest, series)
        if openmetrics_format:
            out.append("# EOF\n")
        return "".join(out).encode("utf-8")

    def _lines(self, metric: Metric, om: bool, dots: bool) -> list[str] | None:
        """The family's lines, or None when it needs prometheus_client's own encoder."""
        if metric.type not in _SIMPLE_TYPES or metric.unit:
            return None
        prefixes = self._dotted if dots else self._prefixes
        lines = [self._header(metric, om, dots)]
        for s in metric.samples:
            if s.timestamp is not None or s.exemplar is not None or getattr(s, "native_histogram", None):
                return None
            key = (s.name, tuple(s.labels.items()))
            prefix = prefixes.get(key)
            if prefix is None:  # first sight of this series: check its names once, format it once
                prefix = prefixes[key] = self._prefix(metric.name, s.name, s.labels, dots)
            if not prefix:
                return None
            lines.append(f"{prefix}{floatToGoString(s.value)}\n")
        return lines

    def _row_lines(
        self, metric: Any, rows: list[tuple[str, tuple[str, ...], float]], om: bool, dots: bool
    ) -> list[str] | None:
        """A RowFamily's lines: its rows are keyed by the label values they carry, so a known series costs a
        tuple hash and its value. None when a series needs escaping: the samples' path handles it."""
        if metric.unit:
            return None
        prefixes = self._dotted if dots else self._prefixes
        name = metric.name
        lines = [self._header(metric, om, dots)]
        append = lines.append
        for suffix, values, value in rows:
            key = (name, suffix, values)
            prefix = prefixes.get(key)
            if prefix is None:
                names = metric.bucket_labelnames if suffix == "_bucket" else metric.labelnames
                prefix = prefixes[key] = self._prefix(
                    name, name + suffix, dict(zip(names, values, strict=True)), dots
                )
            if not prefix:
                return None
            append(f"{prefix}{floatToGoString(value)}\n")
        return lines

    def _header(self, metric: Metric, om: bool, dots: bool) -> str:
        # a family may declare another type for the text format (gpumon.gpu.compat_dcgm.DcgmCounter: a counter
        # without _total, which only the text format allows); unknown is "untyped" there
        text_type = getattr(metric, "text_type", None)
        key = (metric.name, metric.type, text_type, metric.documentation, om, dots)
        header = self._headers.get(key)
        if header is None:
            name = _dots(metric.name) if dots else metric.name
            kind = metric.type
            if om:
                doc = _escape_value(metric.documentation)
            else:
                doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
                name = name + "_total" if metric.type == "counter" else name
                kind = text_type or ("untyped" if kind == "unknown" else kind)
            header = self._headers[key] = f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"
        return header

    @staticmethod
    def _prefix(family: str, name: str, labels: dict[str, str], dots: bool) -> str:
        """``name{labels} `` ready for a value, or "" where the series needs escaping or is a _created."""
        if name == family + "_created" or not _METRIC_NAME.fullmatch(name):
            return ""
        if not all(_LABEL_NAME.fullmatch(k) for k in labels):
            return ""
        if dots:
            # the family's name is escaped, its samples' suffixes (_total, _bucket, _sum, _count) are not,
            # as in Prometheus's own encoder: prometheus_client 0.26 escapes the whole sample name, so
            # x_seconds_bucket becomes x__seconds__bucket, which no parser places in family x__seconds
            name = _dots(family) + name[len(family) :] if name.startswith(family) else _dots(name)
            labels = {_dots(k): v for k, v in labels.items()}
        if not labels:
            return f"{name} "
        body = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels.items()))
        return f"{name}{{{body}}} "

    @staticmethod
    def _fallback(metric: Metric, om: bool, dots: bool) -> str:
        escaping = "dots" if dots else "underscores"
        if om:
            return (
                generate_openmetrics(_One(metric), escaping=escaping).decode("utf-8").removesuffix("# EOF\n")
            )
        return generate_latest(_One(metric), escaping=escaping).decode("utf-8")
