"""deploy/kubernetes: every variant renders with the real kubectl kustomize, every object is one the API
server would accept, and the DaemonSet's command line is one gpumon accepts, with the mounts its settings
need.

Built-in objects are validated by kubernetes-validate in strict mode (unknown fields are errors); the
prometheus-operator custom resources by the openAPIV3Schema of their published CRDs (tests/fixtures),
plus a walk that flags fields the schema does not declare (the API server would prune them silently). The
container's arguments go through gpumon's own parser and settings resolution, with the paths they name
looked up in a directory tree that holds exactly the pod's mounts.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import re
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from support.crds import undeclared_fields
from support.helpers import ROOT, require_tool

from gpumon import __version__, alerting
from gpumon.cli import _flags, build_parser
from gpumon.config import Settings, resolve
from gpumon.dashboards import rendered
from gpumon.dashboards.configmaps import (
    ANNOTATIONS_LIMIT,
    CONFIGMAPS_FILE,
    last_applied_size,
    render_configmaps,
)

K8S = ROOT / "deploy" / "kubernetes"
COMPONENTS = ("per-process", "profiling", "nvidia-runtime-class", "tls")
# name -> kustomization directory ("combined" is built in a temporary directory: the root and every component)
VARIANTS = {
    "root": K8S,
    "base": K8S / "base",
    "per-process": K8S / "overlays" / "per-process",
    "profiling": K8S / "overlays" / "profiling",
}
ALL_VARIANTS = [*VARIANTS, "combined"]
# the oldest Kubernetes release still commonly run, and the one of the kubectl these tests use
K8S_VERSIONS = ("1.29", "1.32")
CRD_GROUP = "monitoring.coreos.com"
SCHEMAS = ROOT / "tests" / "fixtures" / "prometheus-operator"  # in the repository: a clone runs every test
CRD_FILES = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}
CLUSTER_SCOPED = {"Namespace", "PriorityClass"}
IMAGE = f"ghcr.io/gpumon/gpumon:{__version__}"
NODE = "gpu-node-17"  # what the downward API gives spec.nodeName in these tests
FIELD_REFS = {"spec.nodeName": NODE}
UID = GID = 10001  # the Dockerfile's user
# settings that name a path inside the container
PATH_SETTINGS = ("proc_root", "ingest_socket", "baselines", "kubelet_socket", "config", "web_config")
SYSTEM_NODE_CRITICAL = 2_000_001_000
USER_PRIORITY_MAX = 1_000_000_000


# ---- rendering ----------------------------------------------------------------------------------------


def kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    kubectl = require_tool("kubectl")
    return subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


@functools.cache
def _render(directory: str) -> tuple[dict[str, Any], ...]:
    result = kustomize(Path(directory))
    assert result.returncode == 0, result.stderr
    # no deprecation warning or anything else: kustomize says nothing when all is well
    assert result.stderr == "", result.stderr
    docs = tuple(d for d in yaml.safe_load_all(result.stdout) if d is not None)
    assert docs, f"{directory} renders nothing"
    return docs


@pytest.fixture(scope="session")
def combined_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kustomization of a user's: the root (with the PrometheusRule) and every component together.
    kustomize wants relative paths, and reads nothing but them."""
    d = tmp_path_factory.mktemp("combined")
    (d / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(K8S, d)],
                "components": [os.path.relpath(K8S / "components" / c, d) for c in COMPONENTS],
            }
        )
    )
    return d


@pytest.fixture(params=ALL_VARIANTS)
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def docs(variant: str, combined_dir: Path) -> tuple[dict[str, Any], ...]:
    return render(variant, combined_dir)


def render(variant: str, combined_dir: Path) -> tuple[dict[str, Any], ...]:
    directory = combined_dir if variant == "combined" else VARIANTS[variant]
    return copy.deepcopy(_render(str(directory)))


def only(docs: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    spec: dict[str, Any] = only(docs, "DaemonSet", "gpumon")["spec"]["template"]["spec"]
    return spec


def main_container(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (container,) = [c for c in pod_spec(docs)["containers"] if c["name"] == "gpumon"]
    return container


# ---- validation: built-in objects with kubernetes-validate, custom resources with the CRD schemas --------


def validate_builtin(obj: dict[str, Any], version: str) -> None:
    """kubernetes-validate in strict mode (unknown fields are errors). Never asked about custom resources: it
    does not know them."""
    import kubernetes_validate

    assert not obj["apiVersion"].startswith(CRD_GROUP + "/"), "custom resources go to validate_custom"
    kubernetes_validate.validate(obj, version, strict=True)


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((SCHEMAS / CRD_FILES[kind]).read_text())
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def validate_custom(obj: dict[str, Any]) -> None:
    """A prometheus-operator resource against its CRD: the schema (types, enums, patterns) and no field it
    does not declare."""
    import jsonschema

    assert obj["apiVersion"] == f"{CRD_GROUP}/v1", obj["apiVersion"]
    schema = crd_schema(obj["kind"])
    jsonschema.Draft7Validator(schema).validate(obj)
    unknown = list(undeclared_fields(schema, obj))
    assert unknown == [], (
        f"{obj['kind']} {obj['metadata']['name']}: fields its CRD does not declare: {unknown}"
    )


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_builtin_object_passes_strict_validation(
    docs: tuple[dict[str, Any], ...], version: str
) -> None:
    builtin = [d for d in docs if not d["apiVersion"].startswith(CRD_GROUP + "/")]
    assert {d["kind"] for d in builtin} >= {
        "Namespace",
        "PriorityClass",
        "ServiceAccount",
        "DaemonSet",
        "Service",
    }
    for obj in builtin:
        validate_builtin(obj, version)


def test_every_custom_resource_matches_its_crd(docs: tuple[dict[str, Any], ...]) -> None:
    custom = [d for d in docs if d["apiVersion"].startswith(CRD_GROUP + "/")]
    assert {d["kind"] for d in custom} <= set(CRD_FILES)
    assert "ServiceMonitor" in {d["kind"] for d in custom}
    for obj in custom:
        validate_custom(obj)


def test_the_validation_rejects_broken_manifests(combined_dir: Path) -> None:
    """Each check above can fail: unknown fields and wrong types in built-in objects and custom resources."""
    import jsonschema
    import kubernetes_validate

    docs = render("root", combined_dir)
    ds = only(docs, "DaemonSet")
    validate_builtin(ds, K8S_VERSIONS[-1])
    misspelt = copy.deepcopy(ds)
    misspelt["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {"runAsNonRoot": True}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_builtin(misspelt, K8S_VERSIONS[-1])
    wrong_type = copy.deepcopy(ds)
    wrong_type["spec"]["minReadySeconds"] = "10"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_builtin(wrong_type, K8S_VERSIONS[-1])
    # kubernetes-validate does not know prometheus-operator's kinds: that is why they go to the CRD schemas
    sm = only(docs, "ServiceMonitor")
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(sm, K8S_VERSIONS[-1], strict=True)
    validate_custom(sm)
    for edit, where in [
        (lambda o: o["spec"].update(jobLabell="x"), "$.spec.jobLabell"),
        (lambda o: o["spec"]["endpoints"][0].update(relabellings=[]), "$.spec.endpoints[0].relabellings"),
        (
            lambda o: o["spec"]["endpoints"][0]["relabelings"][0].update(source_labels=["a"]),
            "$.spec.endpoints[0].relabelings[0].source_labels",
        ),
    ]:
        bad = copy.deepcopy(sm)
        edit(bad)
        jsonschema.Draft7Validator(crd_schema("ServiceMonitor")).validate(bad)  # plain JSON Schema misses it
        assert list(undeclared_fields(crd_schema("ServiceMonitor"), bad)) == [where]
        with pytest.raises(AssertionError, match=re.escape(where)):
            validate_custom(bad)
    for edit in [
        lambda o: o["spec"]["endpoints"][0].update(interval="15 seconds"),
        lambda o: o["spec"]["endpoints"][0]["relabelings"][0].update(action="rename"),
    ]:
        bad = copy.deepcopy(sm)
        edit(bad)
        with pytest.raises(jsonschema.ValidationError):
            validate_custom(bad)
    rule = copy.deepcopy(only(docs, "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["exprr"] = "up"
    with pytest.raises(AssertionError, match=re.escape("$.spec.groups[0].rules[0].exprr")):
        validate_custom(rule)


# ---- the variants ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_kustomization_renders_silently(name: str) -> None:
    result = kustomize(VARIANTS[name])
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_objects_and_namespaces(docs: tuple[dict[str, Any], ...], variant: str) -> None:
    names = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert len(names) == len(set(names)), names
    for d in docs:
        if d["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in d["metadata"], d["kind"]
        else:
            assert d["metadata"].get("namespace") == "gpumon", (d["kind"], d["metadata"]["name"])
    # the PrometheusRule is generated into base/, so every variant carries it
    assert sum(d["kind"] == "PrometheusRule" for d in docs) == 1, variant


def test_the_prometheus_rule_is_the_generated_one(combined_dir: Path) -> None:
    for variant in ALL_VARIANTS:
        rule = only(render(variant, combined_dir), "PrometheusRule")
        generated = yaml.safe_load(alerting.render_prometheus_rule())
        generated["metadata"]["namespace"] = "gpumon"
        assert rule == generated, "kustomize changed the PrometheusRule beyond its namespace"


def test_dashboard_configmaps_hold_every_dashboard_byte_for_byte(docs: tuple[dict[str, Any], ...]) -> None:
    files = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
    assert files
    maps = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("gpumon-dashboard")
    ]
    data = {}
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert len(cm["data"]) == 1, "one dashboard per ConfigMap keeps each under kubectl apply's limit"
        data.update(cm["data"])
        # what client-side kubectl apply stores in its annotation, for the object as applied (namespace set)
        assert last_applied_size(cm) < ANNOTATIONS_LIMIT, cm["metadata"]["name"]
    assert sorted(data) == [f.name for f in files]
    for f in files:
        assert data[f.name] == f.read_text(), (
            f"{f.name} differs in the ConfigMap: run python -m gpumon.dashboards"
        )


def test_dashboards_configmap_file_is_up_to_date() -> None:
    assert CONFIGMAPS_FILE.read_text() == render_configmaps(rendered()), "run python -m gpumon.dashboards"


def test_last_applied_size_counts_what_go_escapes() -> None:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "<&>é"}}
    compact = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    # Go writes \u003c\u0026\u003e for <&> (5 more bytes each) and é as its two UTF-8 bytes
    expected = len("kubectl.kubernetes.io/last-applied-configuration") + len(compact) + 3 * 5
    assert last_applied_size(obj) == expected


# ---- selectors, ports and the scrape configuration ------------------------------------------------------


def test_selectors_ports_and_scrape_configuration(docs: tuple[dict[str, Any], ...]) -> None:
    ds = only(docs, "DaemonSet", "gpumon")
    template_labels = ds["spec"]["template"]["metadata"]["labels"]
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template_labels.items()
    assert "app.kubernetes.io/version" not in selector, "a selector cannot change between releases"

    svc = only(docs, "Service", "gpumon")
    assert svc["spec"]["selector"].items() <= template_labels.items(), "the Service selects the gpumon pods"
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    container_ports = {p["name"]: p["containerPort"] for p in main_container(docs)["ports"]}
    for port in ports.values():
        target = port["targetPort"]
        assert target in container_ports or target in container_ports.values(), target

    sm = only(docs, "ServiceMonitor", "gpumon")
    assert sm["metadata"]["namespace"] == svc["metadata"]["namespace"] or "namespaceSelector" in sm["spec"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # the alert rules match job="gpumon": the job comes from the Service label jobLabel names
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "gpumon"
    assert 'up{job="gpumon"}' in alerting.render_prometheus_rule()
    for endpoint in sm["spec"]["endpoints"]:
        assert endpoint["port"] in ports, (
            f"the ServiceMonitor scrapes port {endpoint['port']}, not on the Service"
        )
        assert endpoint.get("path", "/metrics") == "/metrics"
        relabel = {(tuple(r.get("sourceLabels", ())), r.get("targetLabel")) for r in endpoint["relabelings"]}
        assert (("__meta_kubernetes_pod_node_name",), "node") in relabel
        assert all(r.get("action", "replace").lower() == "replace" for r in endpoint["relabelings"])


# ---- security ------------------------------------------------------------------------------------------


def capabilities_added(container: dict[str, Any]) -> set[str]:
    return set(container.get("securityContext", {}).get("capabilities", {}).get("add", []))


def effective_user(spec: dict[str, Any], container: dict[str, Any]) -> int:
    return int(container.get("securityContext", {}).get("runAsUser", spec["securityContext"]["runAsUser"]))


def test_the_base_is_hardened(combined_dir: Path) -> None:
    docs = render("base", combined_dir)
    spec = pod_spec(docs)
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert (pod["runAsUser"], pod["runAsGroup"]) == (UID, GID)
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["hostPID"] is False and not spec.get("hostNetwork") and not spec.get("hostIPC")
    assert spec["automountServiceAccountToken"] is False
    assert only(docs, "ServiceAccount", "gpumon")["automountServiceAccountToken"] is False
    c = main_container(docs)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and not capabilities_added(c)
    assert "runAsUser" not in sc and "privileged" not in sc
    for init in spec.get("initContainers", []):
        isc = init["securityContext"]
        assert isc["allowPrivilegeEscalation"] is False and isc["readOnlyRootFilesystem"] is True
        assert isc["capabilities"]["drop"] == ["ALL"]
        assert capabilities_added(init) <= {"CHOWN", "FOWNER"}
    # the only writable host path is the ingest socket's directory
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    for m in c["volumeMounts"]:
        if m["name"] in host_paths and host_paths[m["name"]] != "/run/gpumon":
            assert m.get("readOnly") is True, m


def test_privileges_per_variant(docs: tuple[dict[str, Any], ...], variant: str) -> None:
    """Exactly what each overlay grants, and nothing else: per-process the host PID namespace and uid 0
    without capabilities (the kubelet socket), profiling uid 0 with CAP_SYS_ADMIN."""
    spec = pod_spec(docs)
    c = main_container(docs)
    per_process = variant in ("per-process", "combined")
    profiling = variant in ("profiling", "combined")
    assert spec["hostPID"] is per_process
    assert capabilities_added(c) == ({"SYS_ADMIN"} if profiling else set())
    assert effective_user(spec, c) == (0 if per_process or profiling else UID)
    # root without CAP_DAC_OVERRIDE writes the ingest directory through its group: keep the gid
    assert int(c["securityContext"].get("runAsGroup", spec["securityContext"]["runAsGroup"])) == GID
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert (
        not c["securityContext"].get("privileged")
        and c["securityContext"]["allowPrivilegeEscalation"] is False
    )
    assert ("runtimeClassName" in spec) is (variant == "combined")


def test_scheduling_resources_image_and_gpu_access(docs: tuple[dict[str, Any], ...]) -> None:
    ds = only(docs, "DaemonSet", "gpumon")
    spec = pod_spec(docs)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    tolerations = spec["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in tolerations
    for t in tolerations:
        # no blanket toleration: a keyless one is limited to NoSchedule (NoExecute means "evacuate")
        assert "key" in t or t.get("effect") == "NoSchedule", t
    pc = only(docs, "PriorityClass", spec["priorityClassName"])
    assert pc["value"] <= USER_PRIORITY_MAX < SYSTEM_NODE_CRITICAL
    assert pc["preemptionPolicy"] == "Never" and pc["globalDefault"] is False
    for labels in (ds["metadata"]["labels"], ds["spec"]["template"]["metadata"]["labels"]):
        assert labels["app.kubernetes.io/version"] == __version__
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        assert container["image"] == IMAGE, "the image tag is the project's version (gpumon/__init__.py)"
        assert container["imagePullPolicy"] == "IfNotPresent"
        res = container["resources"]
        assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"]
        assert mebibytes(res["limits"]["memory"]) >= mebibytes(res["requests"]["memory"])
        # a GPU request would take a GPU away from the workloads (and show gpumon only that one)
        for kind in ("requests", "limits"):
            assert not any(name.startswith("nvidia.com/") for name in res.get(kind, {})), res
    env = {e["name"]: e.get("value") for e in main_container(docs)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def mebibytes(quantity: str) -> float:
    m = re.fullmatch(r"(\d+)(Mi|Gi)", quantity)
    assert m, f"memory quantities here are written in Mi or Gi, got {quantity}"
    return int(m.group(1)) * (1024 if m.group(2) == "Gi" else 1)


def test_the_init_container_prepares_the_mounted_socket_directory(docs: tuple[dict[str, Any], ...]) -> None:
    spec = pod_spec(docs)
    (init,) = spec["initContainers"]
    code = init["command"][-1]
    compile(code, "init", "exec")  # valid Python
    (mount,) = init["volumeMounts"]
    socket_mount = {m["name"]: m["mountPath"] for m in main_container(docs)["volumeMounts"]}[mount["name"]]
    assert mount["mountPath"] == socket_mount
    assert (
        f'os.chown("{socket_mount}", {UID}, {GID})' in code and f'os.chmod("{socket_mount}", 0o775)' in code
    )


# ---- the command line: what gpumon's parser and settings make of it ----------------------------------------


def container_env(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            field = e["valueFrom"]["fieldRef"]["fieldPath"]
            assert field in FIELD_REFS, f"no test value for the downward API field {field}"
            env[e["name"]] = FIELD_REFS[field]
    return env


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command and args. An unknown variable would be passed on literally:
    here it is an error."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        assert m.group(1) in env, f"{arg}: $({m.group(1)}) is not in the container's environment"
        return env[m.group(1)]

    return _REF.sub(sub, arg)


def test_expand_follows_kubernetes() -> None:
    assert expand("--node-name=$(NODE_NAME)", {"NODE_NAME": "n1"}) == "--node-name=n1"
    assert expand("$$(NODE_NAME)", {}) == "$(NODE_NAME)"
    with pytest.raises(AssertionError):
        expand("$(MISSING)", {})


def mounts(
    spec: dict[str, Any], container: dict[str, Any]
) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """mountPath -> (the volumeMount, its volume)."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in container["volumeMounts"]}


def mount_of(path: str, table: dict[str, tuple[dict[str, Any], dict[str, Any]]]) -> str | None:
    """The mount path that ``path`` lies in, if any."""
    p = PurePosixPath(path)
    found = [m for m in table if p == PurePosixPath(m) or PurePosixPath(m) in p.parents]
    return max(found, key=len) if found else None


def gpumon_settings(
    docs: tuple[dict[str, Any], ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[Settings, dict[str, str]]:
    """The container's command line through gpumon's own parser and resolve(), as `gpumon serve` would see it
    in the pod. Paths are looked up in a directory tree holding exactly the container's mounts (and /proc,
    which every container has); returns the settings and the in-container value of each path setting."""
    spec = pod_spec(docs)
    c = main_container(docs)
    assert c["command"] == ["gpumon"]
    env = container_env(c)
    argv = [expand(a, env) for a in c["args"]]
    assert argv[0] == "serve"
    parser, _ = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit:
        pytest.fail(f"gpumon rejects {argv}: {capsys.readouterr().err}")
    if extra:  # gpumon itself reports these as "unrecognized arguments" and exits 2
        pytest.fail(f"gpumon serve does not know {extra}")
    assert args.command == "serve"
    flags = _flags(args)
    fs = tmp_path / "container"
    for path in [*mounts(spec, c), "/proc"]:
        (fs / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    inside = {k: flags[k] for k in PATH_SETTINGS if flags.get(k)}
    for key, value in inside.items():
        assert value.startswith("/"), (
            f"{key}={value}: absolute paths only (the working directory is the image's)"
        )
        flags[key] = str(fs / value.lstrip("/"))
    assert not any(k.startswith("GPUMON_") for k in env)
    settings = resolve(flags, env=env)  # raises ConfigError as gpumon would exit 2
    return settings, inside


def test_gpumon_accepts_the_command_line(
    docs: tuple[dict[str, Any], ...], variant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings, inside = gpumon_settings(docs, tmp_path, capsys)
    spec = pod_spec(docs)
    c = main_container(docs)
    table = mounts(spec, c)

    # it listens on all interfaces at the port the Service, the probes and Prometheus use
    host, port = settings.listen.rsplit(":", 1)
    assert host == "0.0.0.0"
    (metrics,) = [p for p in c["ports"] if p["name"] == "metrics"]
    assert int(port) == metrics["containerPort"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] in ("metrics", metrics["containerPort"]), probe
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert settings.node_name == NODE
    assert settings.backend == "nvml" and not settings.simulated

    # the SDK's socket is in the host directory the training pods mount
    assert settings.ingest and settings.ingest_socket
    where = mount_of(inside["ingest_socket"], table)
    assert where is not None, "the ingest socket is not on a mounted volume"
    mount, volume = table[where]
    assert volume["hostPath"] == {"path": where, "type": "DirectoryOrCreate"}
    assert not mount.get("readOnly")
    assert not settings.ingest_allow_remote

    # the baseline library is the optional ConfigMap, mounted whole (no subPath: updates must reach the pod)
    where = mount_of(inside["baselines"], table)
    assert where is not None, "--baselines is not on a mounted volume"
    mount, volume = table[where]
    assert volume["configMap"] == {"name": "gpumon-baselines", "optional": True}
    assert mount.get("readOnly") is True and "subPath" not in mount
    assert PurePosixPath(inside["baselines"]).name == "baselines.toml"

    # processes need the host's PID namespace, /proc to be the host's, and the kubelet socket to be mounted
    per_process = variant in ("per-process", "combined")
    assert settings.processes is per_process
    assert spec["hostPID"] is settings.processes
    if settings.processes:
        proc = inside.get("proc_root", "/proc")
        if proc != "/proc":
            where = mount_of(proc, table)
            assert where is not None and table[where][1]["hostPath"]["path"] == "/proc"
        socket = inside["kubelet_socket"]
        where = mount_of(socket, table)
        assert where is not None, "the kubelet socket is not mounted"
        mount, volume = table[where]
        assert mount.get("readOnly") is True
        assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
        assert PurePosixPath(
            volume["hostPath"]["path"], PurePosixPath(socket).relative_to(where)
        ) == PurePosixPath("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert not settings.owner_labels

    # profiling: GPM everywhere; the profiling overlay adds the privilege, not the setting
    assert settings.profiling == "gpm" and settings.dcgm_address is None

    # TLS (components/tls): the web config comes from the Secret, the probes and Prometheus speak HTTPS,
    # and Prometheus brings the CA and the password; without it, all of that is plain HTTP
    tls = variant == "combined"
    assert bool(settings.web_config) is tls
    schemes = {
        c[probe]["httpGet"].get("scheme", "HTTP")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert schemes == {"HTTPS" if tls else "HTTP"}
    (endpoint,) = only(docs, "ServiceMonitor", "gpumon")["spec"]["endpoints"]
    assert endpoint.get("scheme", "http") == ("https" if tls else "http")
    if tls:
        where = mount_of(inside["web_config"], table)
        assert where is not None, "--web-config is not on a mounted volume"
        mount, volume = table[where]
        assert volume["secret"]["secretName"] == "gpumon-web" and mount.get("readOnly") is True
        # readable by gpumon's group only: the pod's fsGroup owns the Secret's files
        assert volume["secret"]["defaultMode"] == 0o440 and spec["securityContext"]["fsGroup"] == GID
        assert endpoint["tlsConfig"]["ca"]["secret"]["name"] == "gpumon-scrape"
        assert {endpoint["basicAuth"][k]["name"] for k in ("username", "password")} == {"gpumon-scrape"}


def test_a_broken_command_line_fails_the_check(
    combined_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check above can fail: an unknown flag, a bad value, a socket outside every mount."""
    from gpumon.config import ConfigError

    base = render("base", combined_dir)
    for edit, error in [
        (lambda args: args.append("--no-such-flag"), pytest.fail.Exception),
        (lambda args: args.append("--profiling=sometimes"), pytest.fail.Exception),
        (lambda args: args.append("--ingest-socket=/var/run/elsewhere/ingest.sock"), ConfigError),
        (lambda args: args.append("--proc-root=/host/proc"), ConfigError),
    ]:
        docs = copy.deepcopy(base)
        edit(main_container(docs)["args"])
        with pytest.raises(error):
            gpumon_settings(docs, tmp_path, capsys)
    docs = copy.deepcopy(base)
    main_container(docs)["args"].append("--node-name=$(NODE)")
    with pytest.raises(AssertionError, match="NODE"):
        gpumon_settings(docs, tmp_path, capsys)


def test_settings_cover_the_path_flags() -> None:
    """PATH_SETTINGS names real settings: a renamed one would escape the mount checks."""
    names = {f.name for f in dataclasses.fields(Settings)} | {"config"}
    assert set(PATH_SETTINGS) <= names
