"""The daemon as users run it: a real ``gpumon serve`` subprocess, real HTTP over loopback, real promtool."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import Daemon, require_tool, start_daemon
from support.poll import poll

FULL_NODE = "2xH100-SXM,1xA100,1xRTX-A6000"  # between them, every quantity gpumon exports


@pytest.fixture(scope="module")
def node() -> Iterator[Daemon]:
    """One daemon for the tests that only read from it: a daemon's start is most of such a test's time."""
    d = start_daemon("--simulate", FULL_NODE, "--interval", "200ms")
    yield d
    d.stop()


def family_names(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


def test_metrics_in_prometheus_text_format(node) -> None:
    r = node.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    names = family_names(r.text)
    assert {
        "gpumon_gpu_power_watts",
        "gpumon_gpu_up",
        "gpumon_build_info",
        "process_resident_memory_bytes",
    } <= names
    assert 'gpumon_build_info{backend="sim"' in r.text


def test_metrics_in_openmetrics_when_asked(node) -> None:
    r = node.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert r.text.endswith("# EOF\n")
    assert "# TYPE gpumon_gpu_energy_joules counter" in r.text


def test_metrics_gzip_when_accepted(node) -> None:
    r = node.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert r.headers["content-encoding"] == "gzip"
    raw = node.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in raw.headers
    assert "gpumon_gpu_up" in r.text  # httpx decoded it
    assert r.headers["vary"] == raw.headers["vary"] == "Accept-Encoding"  # caches keep the two apart
    refused = node.get("/metrics", headers={"Accept-Encoding": "gzip;q=0"})
    assert "content-encoding" not in refused.headers


def test_metrics_name_filter(node) -> None:
    r = node.get("/metrics", params=[("name[]", "gpumon_gpu_up"), ("name[]", "gpumon_gpu_power_watts")])
    assert family_names(r.text) == {"gpumon_gpu_up", "gpumon_gpu_power_watts"}


def test_promtool_finds_nothing_to_complain_about(node) -> None:
    promtool = require_tool("promtool")
    body = node.get("/metrics").text
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr


def test_openmetrics_output_parses_as_openmetrics(node) -> None:
    # promtool lints only the Prometheus text format; the OpenMetrics parser is strict about the rest
    body = node.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}).text
    names = {f.name for f in openmetrics_families(body)}
    assert {"gpumon_gpu_up", "gpumon_gpu_energy_joules", "gpumon_gpu_info"} <= names


def test_health_readiness_and_landing(node) -> None:
    assert node.get("/healthz").text == "ok\n"
    assert node.get("/readyz").status_code == 200
    page = node.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "Simulated GPUs" in page.text and 'href="/metrics"' in page.text
    assert node.get("/nope").status_code == 404


def test_v1_gpus_is_the_snapshot_in_base_units(node) -> None:
    body = node.get("/v1/gpus").json()
    assert body["backend"] == "sim" and body["simulated"] is True
    assert [g["name"] for g in body["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2 + [
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA RTX A6000",
    ]
    h100 = body["gpus"][0]
    assert h100["up"] is True and h100["uuid"].startswith("GPU-")
    assert 0 < h100["reading"]["power_watts"] <= 700
    assert h100["reading"]["memory_total_bytes"] == 81559 * 2**20
    assert len(h100["reading"]["nvlinks"]) == 18
    assert h100["capabilities"]["fan"] == "not_supported"
    assert body["gpus"][2]["capabilities"]["pcie_bytes"] == "not_supported"
    assert body["host"]["cpu_count"] >= 1 and body["driver"]["driver_version"]


def test_values_change_between_sweeps_and_counters_grow(node) -> None:
    def energy() -> float:
        for f in text_string_to_metric_families(node.get("/metrics").text):
            if f.name == "gpumon_gpu_energy_joules":
                return f.samples[0].value
        raise AssertionError("no energy counter")

    first = energy()
    time.sleep(0.6)
    assert energy() > first


@pytest.mark.slow
def test_a_lost_gpu_is_reported_while_the_daemon_keeps_serving(daemon) -> None:
    # a generous deadline: on a loaded 2-core CI machine a healthy read can take longer than 100 ms
    d = daemon(
        "--simulate", "4xH100-SXM", "--interval", "250ms", "--timeout", "240ms", "--sim-fault", "lost:2@0.5+2"
    )
    deadline = time.monotonic() + 10
    seen_down = seen_back = False
    while time.monotonic() < deadline and not seen_back:
        gpus = d.get("/v1/gpus").json()["gpus"]
        assert [g["up"] for i, g in enumerate(gpus) if i != 2] == [True] * 3
        if not gpus[2]["up"]:
            seen_down = True
            assert gpus[2]["down_reason"].startswith("GpuIsLost")
        elif seen_down:
            seen_back = True
        time.sleep(0.05)
    assert seen_down and seen_back
    assert 'gpumon_errors_total{error="GpuIsLost",gpu="2"' in d.get("/metrics").text


@pytest.mark.slow
def test_a_hung_gpu_does_not_stall_scrapes(daemon) -> None:
    # a generous deadline, as its neighbour's: on a loaded 2-core CI machine a healthy read of GPU 0 can
    # take longer than the 100 ms a 200 ms interval gives by default, and be called down too
    d = daemon(
        "--simulate",
        "2xH100-SXM",
        "--interval",
        "500ms",
        "--timeout",
        "450ms",
        "--sim-fault",
        "hang:1:nvmlDeviceGetUtilizationRates@0.3",
    )

    # the hang starts 0.3 s in and is called at its deadline, or within 3 intervals if the daemon is late
    def hung_down() -> list[dict[str, Any]] | None:
        gpus = d.get("/v1/gpus").json()["gpus"]
        return None if gpus[1]["up"] else gpus

    gpus = poll(hung_down, 10, "the hung GPU to be called down", every=0.05)
    r = d.get("/metrics", timeout=2.0)
    assert 'gpumon_gpu_up{gpu="1"' in r.text and 'gpumon_gpu_up{gpu="0"' in r.text
    assert gpus[0]["up"] and not gpus[1]["up"]
    assert "nvmlDeviceGetUtilizationRates" in gpus[1]["down_reason"]
    assert d.get("/healthz").status_code == 200


def test_sigterm_stops_the_daemon_cleanly(daemon) -> None:
    d = daemon("--simulate", "1xH100-SXM")
    assert d.stop() == 0
    assert any("gpumon stopped" in line for line in d.log)


@pytest.mark.parametrize("accept", ["application/openmetrics-text; version=abc", "text/plain; version=x.y"])
def test_an_unparseable_accept_version_still_gets_text_metrics(node, accept) -> None:
    r = node.get("/metrics", headers={"Accept": accept})
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "gpumon_gpu_up" in r.text


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [
        (
            "application/openmetrics-text; version=",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        (
            "text/plain; version=1.0.0; escaping=bogus",
            "text/plain; version=1.0.0; charset=utf-8; escaping=underscores",
        ),
        ("*/*;q=banana", "text/plain; version=0.0.4; charset=utf-8"),
    ],
)
def test_odd_accept_headers_are_negotiated_like_prometheus_client_does(node, accept, content_type) -> None:
    r = node.get("/metrics", headers={"Accept": accept})
    assert r.status_code == 200 and r.headers["content-type"] == content_type
    assert "gpumon_gpu_up" in r.text


def test_dots_escaping_doubles_underscores(node) -> None:
    r = node.get("/metrics", headers={"Accept": "text/plain; version=1.0.0; escaping=dots"})
    assert r.status_code == 200 and "escaping=dots" in r.headers["content-type"]
    assert "gpumon__gpu__up{" in r.text  # dots escaping doubles underscores, as prometheus_client writes it
    r = node.get("/metrics", headers={"Accept": "text/plain; version=1.0.0; escaping=underscores"})
    assert "gpumon_gpu_up{" in r.text


@pytest.mark.slow
def test_deep_telemetry_end_to_end_xid_compat_and_owner_labels(daemon) -> None:
    d = daemon(
        "--simulate", "2xH100-SXM", "--sim-unreported-jobs", "--interval", "200ms", "--compat", "dcgm",
        "--owner-labels", "--sim-fault", "xid:1:79@1",
    )  # fmt: skip
    deadline = time.monotonic() + 10
    text = ""
    while time.monotonic() < deadline and 'xid="79"' not in text:
        text = d.get("/metrics").text
        time.sleep(0.1)
    assert re.search(r'gpumon_gpu_xid_errors_total\{.*gpu="1".*xid="79"\} 1\.0', text)
    assert "DCGM_FI_DEV_XID_ERRORS{" in text and "DCGM_FI_DEV_GPU_UTIL{" in text
    owner = r'gpumon_gpu_power_watts\{container="trainer",gpu="0",namespace="ml-train",pod="llm-'
    assert re.search(owner, text)
    assert re.search(r'gpumon_process_info\{[^}]*pod="llm-pretrain-\d+-worker-0"', text)
    body = d.get("/v1/gpus").json()
    gpus = body["gpus"]
    assert gpus[0]["capabilities"]["events"] == "supported" and gpus[0]["capabilities"]["gpm"] == "supported"
    (x,) = gpus[1]["xids"]
    assert (x["code"], x["count"], x["severity"]) == (79, 1, "critical") and "bus" in x["description"]
    assert body["events"]["recent"][-1]["xid_info"]["code"] == 79
    assert gpus[0]["owner"]["owner"]["pod"].startswith("llm-pretrain-")
    assert gpus[0]["owner"]["processes"][0]["pid"] >= 20000


@pytest.mark.parametrize(
    ("header", "gzipped"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("x-gzip", True),
        ("*", True),
        ("GZIP;q=0.5", True),
        ("gzip;q=0", False),
        ("gzip;q=0, *", False),
        ("nogzip", False),
        ("identity", False),
        ("", False),
        ("gzip;q=nonsense", False),
    ],
)
def test_accept_encoding_is_parsed_not_searched(header: str, gzipped: bool) -> None:
    from gpumon.web.server import accepts_gzip

    assert accepts_gzip(header) is gzipped
