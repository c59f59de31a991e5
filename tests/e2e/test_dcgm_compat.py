"""`gpumon serve --compat dcgm` stands in for dcgm-exporter before a real Prometheus: every series of
dcgm-exporter's default counters file (name, type, labels) and every query of its Grafana dashboard 12239
(tests/fixtures/dcgm-exporter/, read from NVIDIA/dcgm-exporter)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml
from support.helpers import ROOT, require_tool, start_daemon
from support.stack import Prometheus, start_prometheus

pytestmark = pytest.mark.slow  # a real Prometheus

FIXTURES = ROOT / "tests" / "fixtures" / "dcgm-exporter"
# dcgm-exporter's labels on every GPU series (its default counters file adds the driver version as one)
LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
H100, L4 = "0", "1"  # the simulated node: an H100 (GPM, NVLink, no NVENC) and an L4 (NVENC, no GPM)
VIDEO = ("DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL")


def default_counters() -> list[tuple[str, str, str]]:
    """(field, type, why gpumon lacks it or "") for each enabled row of the default counters file."""
    rows = []
    for line in (FIXTURES / "default-counters.csv").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind, *why = (part.strip() for part in line.split(",", 2))
            rows.append((name, kind, why[0] if why else ""))
    return rows


def dashboard_queries() -> list[str]:
    text = (FIXTURES / "dashboard-12239.promql").read_text()
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def test_dcgm_exporters_default_counters_and_dashboard_12239_against_real_prometheus(tmp_path: Path) -> None:
    require_tool("prometheus")
    rows = default_counters()
    assert len([r for r in rows if r[1] != "label"]) == 25  # dcgm-exporter's default: 25 series per GPU
    daemon = start_daemon(
        "--simulate", "1xH100-SXM,1xL4", "--interval", "500ms", "--compat", "dcgm", "--node-name", "node-a"
    )
    prom = None
    try:
        target = daemon.url.removeprefix("http://")
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "dcgm", "static_configs": [{"targets": [target]}]}],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = Prometheus(start_prometheus(tmp_path / "prometheus.yml", tmp_path))
        # steady state: GPM needs a pair of samples, the NVLink rate a pair of scrapes
        prom.wait("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 30)
        prom.wait("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 15)
        prom.wait("DCGM_FI_DEV_XID_ERRORS", 15)

        missing, wrong = [], []
        for name, kind, why in rows:
            if kind == "label":
                continue
            found = {s["metric"]["gpu"]: s["metric"] for s in prom.query(name)}
            if why:
                assert not found, f"{name} is served, but the fixture says: {why}"
                continue
            # the video engines on both GPUs (NVML answers the H100's encoder call with 0, so DCGM has a
            # value there too); every other row on the H100
            need = {H100, L4} if name in VIDEO else {H100}
            if not need <= set(found):
                missing.append(f"{name}: GPUs {sorted(found)}")
            for labels in found.values():
                if not set(labels) >= LABELS or labels["Hostname"] != "node-a":
                    wrong.append(f"{name}: {sorted(labels)}")
        assert missing == [] and wrong == [], (missing, wrong)

        # types: Prometheus negotiates OpenMetrics, where a counter must end in _total, so DCGM's counters
        # are untyped there; in the text format dcgm-exporter serves, they are counters
        meta = prom.client.get("/api/v1/targets/metadata", params={"match_target": '{job="dcgm"}'}).json()
        seen = {m["metric"]: m["type"] for m in meta["data"]}
        text = httpx.get(daemon.url + "/metrics", headers={"Accept": "text/plain;version=0.0.4"}).text
        for name, kind, why in rows:
            if kind == "label" or why:
                continue
            assert seen.get(name) == ("gauge" if kind == "gauge" else "unknown"), (name, seen.get(name))
            assert f"# TYPE {name} {kind}\n" in text, name
        one = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # a filtered scrape types it as the full one does
        filtered = httpx.get(
            daemon.url + "/metrics", params={"name[]": one}, headers={"Accept": "text/plain;version=0.0.4"}
        ).text
        assert f"# TYPE {one} counter\n" in filtered
        # the dashboard, with its variables at "All"
        empty = []
        for query in dashboard_queries():
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", query)
            if m:
                r = prom.client.get(f"/api/v1/label/{m[2]}/values", params={"match[]": m[1]}).json()
                if not r["data"]:
                    empty.append(query)
                continue
            if not prom.query(query.replace("$instance", ".*").replace("$gpu", ".*")):
                empty.append(query)
        assert empty == [], empty
    finally:
        if prom is not None:
            prom.close()
            prom.process.stop()
        daemon.stop()


def test_the_fixture_rows_are_what_the_compat_table_calls_default() -> None:
    """The compat table's "default" column and the fixture agree, so docs/dcgm-compat.md says the same."""
    from gpumon.gpu.compat_dcgm import MAPPING

    table = {m.name: m.type for m in MAPPING if m.default}
    fixture = {name: kind for name, kind, why in default_counters() if kind != "label" and not why}
    assert table == fixture
