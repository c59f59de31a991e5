"""deploy/compose: the demo stack's files are checked as the containers will see them. Each service's
bind mounts are laid out in a temporary directory that mirrors its file system, and promtool, amtool and
our own checks of Grafana's provisioning run on that mirror. So the rule files, the dashboards and the
data source must resolve where the containers will look. The gpumon services' command lines parse with
gpumon's real CLI, every image is pinned, every port is published on loopback only, and Prometheus
scrapes what compose runs. No Docker engine is needed."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from support.helpers import ROOT, require_tool

from gpumon.cli import _flags, build_parser
from gpumon.config import Settings, resolve

COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
DASHBOARDS = {p.name for p in (ROOT / "grafana" / "dashboards").glob("*.json")}
EXACT_TAG = re.compile(r"^v?\d+(\.\d+){1,3}(-[a-z0-9][a-z0-9.-]*)?$")
# what the official images run when compose does not say otherwise
DEFAULT_LISTEN = {"prometheus": 9090, "alertmanager": 9093, "grafana": 3000}


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def by_image(name: str) -> tuple[str, dict[str, Any]]:
    """The one service running the image ``name`` (e.g. prom/prometheus)."""
    found = [(n, s) for n, s in services().items() if s.get("image", "").split(":")[0] == name]
    assert len(found) == 1, f"expected one {name} service, found {[n for n, _ in found]}"
    return found[0]


def gpumon_services() -> dict[str, dict[str, Any]]:
    """Services built from this repository's Dockerfile."""
    found = {}
    for name, svc in services().items():
        build = svc.get("build")
        if build is not None:
            context = (
                COMPOSE_DIR / (build if isinstance(build, str) else build.get("context", "."))
            ).resolve()
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            assert context == ROOT and (context / dockerfile).resolve() == ROOT / "Dockerfile", name
            found[name] = svc
    assert found, "no service builds gpumon from the repository"
    return found


def command(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command", [])
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def flag(svc: dict[str, Any], name: str, default: str) -> str:
    """The value of ``--name=value`` (or ``--name value``) in a service's command."""
    argv = command(svc)
    for i, arg in enumerate(argv):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return default


def mounts(svc: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, container path, is a bind mount) of a service's volumes, short or long syntax."""
    found = []
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            source, target, bind = v.get("source", ""), v["target"], v.get("type") == "bind"
        else:
            parts = v.split(":")
            source, target = (parts[0], parts[1]) if len(parts) > 1 else ("", parts[0])
            bind = source.startswith((".", "/", "~"))
        found.append((source, target, bind))
    return found


def mirror(svc: dict[str, Any], root: Path) -> Path:
    """Lay out what the container sees of its mounts under ``root``: each bind-mounted file or directory
    copied to its container path (outer mounts first, so nested ones land inside), named volumes empty."""
    for source, target, bind in sorted(mounts(svc), key=lambda m: m[1].count("/")):
        dest = root / target.lstrip("/")
        if not bind:
            dest.mkdir(parents=True, exist_ok=True)
            continue
        host = (COMPOSE_DIR / source).resolve()
        assert host.exists(), f"{source} does not exist: Docker would mount an empty directory there"
        if host.is_dir():
            shutil.copytree(host, dest, dirs_exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(host, dest)
    return root


def inside(root: Path, container_path: str) -> Path:
    return root / container_path.lstrip("/")


def prometheus_config_path() -> str:
    return flag(by_image("prom/prometheus")[1], "--config.file", "/etc/prometheus/prometheus.yml")


def prometheus_config(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    root = mirror(by_image("prom/prometheus")[1], tmp_path / "prometheus")
    path = inside(root, prometheus_config_path())
    return path, yaml.safe_load(path.read_text())


def listen_port(name: str, svc: dict[str, Any]) -> int:
    if name in gpumon_services():
        return int(gpumon_settings(svc).listen.rsplit(":", 1)[1])
    image = svc["image"].split(":")[0].split("/")[-1]
    address = flag(svc, "--web.listen-address", f":{DEFAULT_LISTEN[image]}")
    return int(address.rsplit(":", 1)[1])


def gpumon_settings(svc: dict[str, Any]) -> Settings:
    """The settings gpumon resolves in the container: the image's command line and environment
    (Dockerfile ENTRYPOINT and ENV) with the service's command and environment."""
    from test_docker import final_env, image_command

    argv = image_command()[:1] + command(svc) if "command" in svc else image_command()
    assert argv[0] == "gpumon"
    env = {k: v for k, v in final_env().items() if k.startswith("GPUMON_")}
    environment = svc.get("environment", {})
    if isinstance(environment, list):
        environment = dict(e.split("=", 1) for e in environment)
    env.update({k: str(v) for k, v in environment.items()})
    parser, _ = build_parser()
    args, extra = parser.parse_known_args(argv[1:])
    assert not extra, f"gpumon does not know {extra}"
    assert args.command == "serve"
    return resolve(_flags(args), env=env)


# ---- the compose file --------------------------------------------------------------------------------------


def test_compose_specification_without_version() -> None:
    spec = compose()
    assert "version" not in spec, "the Compose Specification has no version: key (obsolete, warned about)"
    assert set(spec) <= {"name", "services", "volumes", "networks", "configs", "secrets"} | {
        k for k in spec if k.startswith("x-")
    }
    for name, svc in services().items():
        assert "image" in svc or "build" in svc, name
    named = {s for svc in services().values() for s, _, bind in mounts(svc) if not bind and s}
    assert named <= set(spec.get("volumes") or {}), "named volumes must be declared"


def test_every_image_is_pinned() -> None:
    for name, svc in services().items():
        image = svc.get("image")
        if image is None:
            continue
        _, sep, tag = image.split("@", 1)[0].rpartition(":")
        assert sep and "/" not in tag and tag != "latest", f"{name}: {image} is not pinned"
        if "build" not in svc:  # pulled from a registry: an exact release
            assert EXACT_TAG.match(tag), f"{name}: {image} is not an exact version"


def test_ports_are_published_on_loopback_only() -> None:
    for name, svc in services().items():
        for port in svc.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                parts = str(port).split(":")
                assert len(parts) == 3 and parts[0] == "127.0.0.1", (
                    f"{name}: {port} is published on all interfaces"
                )


def test_published_ports_reach_the_services() -> None:
    hosts = []
    for name, svc in services().items():
        for port in svc.get("ports", []):
            _, host, container = str(port).split(":")
            assert int(container) == listen_port(name, svc), f"{name}: {port}"
            hosts.append(host)
    assert len(hosts) == len(set(hosts)), "two services publish the same port"


def test_gpumon_services_simulate_a_training_job() -> None:
    for name, svc in gpumon_services().items():
        settings = gpumon_settings(svc)
        assert settings.simulated and settings.sim_jobs, f"{name}: the demo needs simulated GPUs and a job"
        assert settings.listen.startswith("0.0.0.0:"), f"{name}: must listen beyond the container's loopback"
        assert settings.node_name, f"{name}: a node name for the dashboards' Node variable"
    seeds = [gpumon_settings(svc).seed for svc in gpumon_services().values()]
    assert len(set(seeds)) == len(seeds), "distinct seeds: distinct GPU UUIDs and dynamics per node"
    faults = [f for svc in gpumon_services().values() for f in gpumon_settings(svc).sim_faults]
    assert any(f.startswith("xid:") for f in faults), "the demo shows an alert firing"


# ---- Prometheus --------------------------------------------------------------------------------------------


def test_promtool_checks_the_config_and_rules_as_mounted(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    path, config = prometheus_config(tmp_path)
    result = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # the rule files resolve (relative to the config file, as in the container) to the shipped ones
    resolved = {(path.parent / f).resolve() for f in config["rule_files"]}
    shipped = {ROOT / "alerts" / "recording.rules.yml", ROOT / "alerts" / "alerting.rules.yml"}
    assert {p.name for p in resolved} == {p.name for p in shipped}
    for f in resolved:
        assert f.read_bytes() == (ROOT / "alerts" / f.name).read_bytes()
        assert "SUCCESS" in result.stdout and f.name in result.stdout


def test_scrape_job_gpumon_targets_the_gpumon_services(tmp_path: Path) -> None:
    _, config = prometheus_config(tmp_path)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    # the rules assume it: GpumonExporterDown and GpumonExporterAbsent match up{job="gpumon"}
    assert "gpumon" in jobs
    assert 'up{job="gpumon"}' in (ROOT / "alerts" / "alerting.rules.yml").read_text()
    targets = [t for sc in jobs["gpumon"]["static_configs"] for t in sc["targets"]]
    expected = {f"{name}:{listen_port(name, svc)}" for name, svc in gpumon_services().items()}
    assert set(targets) == expected and len(targets) == len(expected)


def test_alerts_go_to_the_alertmanager_service(tmp_path: Path) -> None:
    _, config = prometheus_config(tmp_path)
    name, svc = by_image("prom/alertmanager")
    targets = [
        t for am in config["alerting"]["alertmanagers"] for sc in am["static_configs"] for t in sc["targets"]
    ]
    assert targets == [f"{name}:{listen_port(name, svc)}"]


# ---- Alertmanager ------------------------------------------------------------------------------------------


def test_amtool_checks_the_config_as_mounted(tmp_path: Path) -> None:
    amtool = require_tool("amtool")
    _, svc = by_image("prom/alertmanager")
    root = mirror(svc, tmp_path / "alertmanager")
    path = inside(root, flag(svc, "--config.file", "/etc/alertmanager/alertmanager.yml"))
    result = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(path.read_text())
    for receiver in config["receivers"]:
        # nothing leaves the machine: the alerts are in Alertmanager's UI and Grafana
        assert set(receiver) == {"name"}, f"{receiver['name']} needs an external service"
    for labels, receiver in (("severity=critical", "demo-pager"), ("severity=warning", "demo-chat")):
        routed = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={path}", labels],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert routed.stdout.strip() == receiver, routed.stdout + routed.stderr


# ---- Grafana -----------------------------------------------------------------------------------------------


def grafana_root(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    _, svc = by_image("grafana/grafana")
    return svc, mirror(svc, tmp_path / "grafana")


def provisioning(root: Path, kind: str) -> list[dict[str, Any]]:
    directory = inside(root, "/etc/grafana/provisioning") / kind
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    assert files, f"nothing mounted at /etc/grafana/provisioning/{kind}"
    return [yaml.safe_load(f.read_text()) for f in files]


def test_grafana_loads_the_three_dashboards_from_a_mounted_directory(tmp_path: Path) -> None:
    svc, root = grafana_root(tmp_path)
    providers = [p for doc in provisioning(root, "dashboards") for p in doc["providers"]]
    assert providers
    for provider in providers:
        directory = inside(root, provider["options"]["path"])
        assert (
            {p.name for p in directory.glob("*.json")}
            == DASHBOARDS
            == {
                "gpumon-fleet.json",
                "gpumon-node.json",
                "gpumon-training.json",
            }
        )
        for dashboard in directory.glob("*.json"):
            assert dashboard.read_bytes() == (ROOT / "grafana" / "dashboards" / dashboard.name).read_bytes()
    home = svc["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert inside(root, home).is_file(), f"home dashboard {home} is not mounted"


def test_grafana_data_source_is_the_stacks_prometheus(tmp_path: Path) -> None:
    _, root = grafana_root(tmp_path)
    sources = [s for doc in provisioning(root, "datasources") for s in doc["datasources"]]
    prometheus = [s for s in sources if s["type"] == "prometheus"]
    assert len(prometheus) == 1 and prometheus[0].get("isDefault") is True
    url = urlsplit(prometheus[0]["url"])
    name, prom = by_image("prom/prometheus")
    assert (url.hostname, url.port) == (name, listen_port(name, prom))
    # the dashboards pick their data source through a variable that starts at the default one
    for dashboard in DASHBOARDS:
        model = json.loads((ROOT / "grafana" / "dashboards" / dashboard).read_text())
        variables = {v["name"]: v for v in model["templating"]["list"]}
        assert (
            variables["datasource"]["type"] == "datasource"
            and variables["datasource"]["query"] == "prometheus"
        )
    # $__rate_interval follows timeInterval: it must be the real scrape interval
    _, config = prometheus_config(tmp_path)
    assert prometheus[0]["jsonData"]["timeInterval"] == config["global"]["scrape_interval"]
    alertmanager = [s for s in sources if s["type"] == "alertmanager"]
    am_name, am = by_image("prom/alertmanager")
    for source in alertmanager:
        url = urlsplit(source["url"])
        assert (url.hostname, url.port) == (am_name, listen_port(am_name, am))


def test_grafana_anonymous_viewers() -> None:
    _, svc = by_image("grafana/grafana")
    env = svc["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
