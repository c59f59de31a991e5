"""A real Prometheus scrapes gpumon over TLS with basic auth, the way an operator would configure it: the CA
in tls_config, the password in a file. A second job with the wrong password must be refused (401)."""

from __future__ import annotations

import time
from pathlib import Path

import bcrypt
import pytest
import yaml
from support.certs import make
from support.helpers import require_tool, start_daemon
from support.stack import Prometheus, start_prometheus

pytestmark = pytest.mark.slow  # a real Prometheus over TLS

PASSWORD = "scrape-over-tls"


def test_prometheus_scrapes_over_tls_with_basic_auth(tmp_path: Path) -> None:
    require_tool("prometheus")  # before anything starts: in CI its absence fails the test
    certs = make(tmp_path / "certs")
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)},
                "basic_auth_users": {"prometheus": hashed},
            }
        )
    )
    daemon = start_daemon("--simulate", "2xH100-SXM", "--web-config", str(web), ready=False)
    prom = None
    try:
        assert daemon.url.startswith("https://")
        target = daemon.url.removeprefix("https://")
        (tmp_path / "password").write_text(PASSWORD + "\n")
        (tmp_path / "wrong").write_text("not-the-password\n")

        def job(name: str, password_file: str) -> dict[str, object]:
            return {
                "job_name": name,
                "scheme": "https",
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "tls_config": {"ca_file": str(certs.ca)},
                "basic_auth": {"username": "prometheus", "password_file": str(tmp_path / password_file)},
                "static_configs": [{"targets": [target]}],
            }

        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [job("gpumon", "password"), job("wrong", "wrong")],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        process = start_prometheus(tmp_path / "prometheus.yml", tmp_path)
        prom = Prometheus(process)
        prom.wait('up{job="gpumon"} == 1', 30, "a successful scrape over TLS with basic auth")
        series = prom.wait('gpumon_gpu_utilization_ratio{job="gpumon"}', 15)
        assert {s["metric"]["gpu"] for s in series} == {"0", "1"}
        end = time.monotonic() + 15
        errors: list[str] = []
        while time.monotonic() < end and not errors:
            targets = prom.client.get("/api/v1/targets").json()["data"]["activeTargets"]
            errors = [t["lastError"] for t in targets if t["labels"]["job"] == "wrong" and t["lastError"]]
            time.sleep(0.5)
        assert errors and "401" in errors[0], errors
        assert prom.query('up{job="wrong"} == 0')
    finally:
        if prom is not None:
            prom.close()
            prom.process.stop()
        daemon.stop()
