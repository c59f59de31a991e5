"""The Dockerfile: hadolint finds nothing, and what the image promises holds when read from the file: pinned
bases, a numeric non-root user, a health check that really probes gpumon, `gpumon serve` as the command,
the NVIDIA toolkit's variables, no build tools in the final stage, and a build context (.dockerignore) that
holds exactly what the COPY lines need. No Docker engine is needed (nor built: the tests read the file)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import pytest
import yaml
from support.certs import make
from support.helpers import ROOT, free_port, require_tool, start_daemon

import gpumon
from gpumon.cli import _flags, build_parser
from gpumon.config import DEFAULT_PORT, resolve

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
# the Kubernetes manifests run the image as this user and group (runAsUser, runAsGroup, fsGroup)
IMAGE_UID = "10001:10001"
EXACT_TAG = re.compile(r"^v?\d+(\.\d+){1,3}(-[a-z0-9][a-z0-9.-]*)?$")
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|cc|c\+\+|clang|make|cmake|ninja|build-essential|autoconf|automake|libtool|pkg-config"
    r"|rustc|cargo|git|[\w.+-]+-dev|[\w.+-]+-devel)\b"
)


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str) -> tuple[list[Instruction], list[Stage]]:
    """Instructions (continuations joined, comment lines inside them dropped, as Docker does) and stages."""
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        keyword, _, args = whole.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif stages:
            stages[-1].instructions.append(ins)
    return instructions, stages


def key_values(args: str) -> dict[str, str]:
    """ENV/LABEL/ARG ``k=v k2="v 2"`` pairs (the legacy ``ENV k v`` form is not used here)."""
    pairs = {}
    for word in shlex.split(args):
        key, sep, value = word.partition("=")
        assert sep or len(shlex.split(args)) == 1, f"not key=value: {word!r}"
        pairs[key] = value
    return pairs


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"not exec form: {args}"
    return value


def dockerfile() -> tuple[list[Instruction], list[Stage]]:
    return parse_dockerfile(DOCKERFILE.read_text())


def final_stage() -> Stage:
    return dockerfile()[1][-1]


def final_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in final_stage().all("ENV"):
        env.update(key_values(ins.args))
    return env


def final_args() -> dict[str, str]:
    args: dict[str, str] = {}
    for ins in final_stage().all("ARG"):
        args.update(key_values(ins.args))
    return args


def substitute(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables[m.group(1) or m.group(2)], text)


def image_command() -> list[str]:
    """What `docker run IMAGE` executes: ENTRYPOINT followed by CMD (both exec form)."""
    stage = final_stage()
    (entrypoint,) = stage.all("ENTRYPOINT")
    (cmd,) = stage.all("CMD")
    return exec_form(entrypoint.args) + exec_form(cmd.args)


# ---- hadolint -------------------------------------------------------------------------------------------


def test_hadolint_finds_nothing(tmp_path: Path) -> None:
    exe = require_tool("hadolint")
    config = tmp_path / "hadolint.yaml"
    config.write_text("{}\n")  # hermetic: no user or repository configuration relaxes the rules
    result = subprocess.run(
        [exe, "--config", str(config), "--format", "json", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [] and result.returncode == 0, json.dumps(findings, indent=1) + result.stderr


def test_every_hadolint_ignore_says_why() -> None:
    for number, line in enumerate(DOCKERFILE.read_text().splitlines(), 1):
        if "hadolint ignore=" in line:
            assert re.search(r"hadolint ignore=[\w,]+\s+\S.{10,}", line), f"line {number}: give a reason"


# ---- the file itself ------------------------------------------------------------------------------------


def test_every_base_image_is_pinned_to_an_exact_version() -> None:
    _, stages = dockerfile()
    assert len(stages) >= 2, "multi-stage: a builder and a runtime stage"
    names = set()
    for stage in stages:
        if stage.image in names:
            continue  # FROM an earlier stage
        ref = stage.image.split("@", 1)[0]
        _, sep, tag = ref.rpartition(":")
        assert sep and "/" not in tag, f"{stage.image}: no tag"
        assert tag != "latest" and EXACT_TAG.match(tag), f"{stage.image}: not an exact version tag"
        if stage.name:
            names.add(stage.name)
    assert not re.search(r":latest\b", DOCKERFILE.read_text())


def test_final_stage_runs_as_the_numeric_non_root_user() -> None:
    users = final_stage().all("USER")
    assert users, "the final stage sets no USER: the image would run as root"
    uid = users[-1].args
    assert uid == IMAGE_UID and all(part.isdigit() and int(part) != 0 for part in uid.split(":"))
    # the account exists in the image with the same numbers (tools and NSS look the uid up)
    runs = " ".join(i.args for i in final_stage().all("RUN"))
    assert "--uid 10001" in runs and "--gid 10001" in runs


def test_command_is_gpumon_serve_and_parses_with_the_real_cli() -> None:
    argv = image_command()
    assert argv[:2] == ["gpumon", "serve"], argv
    parser, _ = build_parser()
    args, extra = parser.parse_known_args(argv[1:])
    assert not extra
    env = {k: v for k, v in final_env().items() if k.startswith("GPUMON_")}
    settings = resolve(_flags(args), env=env)
    assert settings.listen.endswith(f":{DEFAULT_PORT}") and not settings.simulated
    assert settings.baselines == "/var/lib/gpumon/baselines.toml"


def test_exposes_gpumons_default_port() -> None:
    exposed = [p.split("/")[0] for ins in final_stage().all("EXPOSE") for p in ins.args.split()]
    assert exposed == [str(DEFAULT_PORT)]


def test_nvidia_container_toolkit_variables() -> None:
    env = final_env()
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "all"
    assert "utility" in env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(",")
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1" and env.get("PYTHONUNBUFFERED") == "1"


def test_oci_labels() -> None:
    labels: dict[str, str] = {}
    for ins in final_stage().all("LABEL"):
        labels.update(key_values(ins.args))
    labels = {k: substitute(v, final_args()) for k, v in labels.items()}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    prefix = "org.opencontainers.image."
    assert labels[prefix + "title"] == "gpumon"
    assert labels[prefix + "description"] == project["description"]
    assert labels[prefix + "licenses"] == project["license"]["text"]
    assert labels[prefix + "source"].startswith("https://github.com/")
    assert labels[prefix + "version"] == gpumon.__version__


def test_final_stage_installs_wheels_only_without_build_tools_or_caches() -> None:
    runs = [i.args for i in final_stage().all("RUN")]
    for run in runs:
        managers = r"(?:apt-get|apt|apk|yum|dnf|microdnf)\s+(?:-\S+\s+)*(?:install|add)\s+[^&;|]*"
        for install in re.findall(managers, run):
            assert not BUILD_TOOLS.search(install), f"build tools in the final stage: {install}"
        if re.search(r"\bpip3?\s+install\b", run):
            assert "--no-cache-dir" in run and "--no-index" in run, f"pip from the built wheels only: {run}"
    pip = substitute(next(r for r in runs if "pip install" in r), final_args())
    # the kubernetes extra (grpcio: pod names), pinned to the version the labels name
    assert f"gpumon[kubernetes]=={gpumon.__version__}" in pip
    # nothing from the builder is copied into a layer: the wheels are bind-mounted for the install only
    assert not [i for i in final_stage().all("COPY") if "--from" in i.args]
    assert "--mount=type=bind,from=builder" in pip


def test_builder_builds_the_wheels_from_this_repository() -> None:
    builder = dockerfile()[1][0]
    assert builder.name == "builder"
    assert any(
        re.search(r"pip3? wheel .*--wheel-dir /wheels .*\.\[kubernetes\]", i.args) for i in builder.all("RUN")
    )


# ---- the health check -----------------------------------------------------------------------------------


def healthcheck_code() -> str:
    (check,) = final_stage().all("HEALTHCHECK")
    argv = exec_form(check.args.split("CMD", 1)[1].strip())
    assert argv[:2] == ["python", "-c"], "a probe without curl: the image has Python and nothing else"
    assert "/healthz" in argv[2]
    return argv[2]


def probe(code: str, env: dict[str, str], cmdline: list[str] | None, tmp_path: Path) -> int:
    """Run the health check's code here; ``cmdline`` stands in for PID 1's (the daemon's) when given."""
    if cmdline is not None:
        fake = tmp_path / "cmdline"
        fake.write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
        assert "'/proc/1/cmdline'" in code
        code = code.replace("'/proc/1/cmdline'", repr(str(fake)))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=30)
    return result.returncode


@pytest.mark.slow
def test_healthcheck_probes_the_daemon_where_it_listens(tmp_path: Path) -> None:
    code = healthcheck_code()
    daemon = start_daemon("--simulate", "2xH100-SXM")
    try:
        port = daemon.url.rsplit(":", 1)[1]
        # the port from GPUMON_LISTEN, a wildcard address probed on loopback
        assert probe(code, {"GPUMON_LISTEN": f"0.0.0.0:{port}"}, [], tmp_path) == 0
        # the port from the daemon's own --listen, both spellings, which wins over the environment
        cmd = ["python", "/usr/local/bin/gpumon", "serve"]
        env = {"GPUMON_LISTEN": f"127.0.0.1:{free_port()}"}
        assert probe(code, env, [*cmd, "--listen", f"0.0.0.0:{port}"], tmp_path) == 0
        assert probe(code, env, [*cmd, f"--listen=127.0.0.1:{port}"], tmp_path) == 0
        # nobody there: unhealthy
        assert probe(code, env, cmd, tmp_path) != 0
    finally:
        daemon.stop()


@pytest.mark.slow
def test_healthcheck_speaks_tls_when_the_web_config_says_so(tmp_path: Path) -> None:
    """A web config with TLS (--web-config or GPUMON_WEB_CONFIG) makes the probe speak HTTPS, no password."""
    code = healthcheck_code()
    certs = make(tmp_path / "certs")
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"a-scrape-password", bcrypt.gensalt(4)).decode()
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(certs.server_cert), "key_file": str(certs.server_key)},
                "basic_auth_users": {"prometheus": hashed},
            }
        )
    )
    daemon = start_daemon("--simulate", "2xH100-SXM", "--web-config", str(web), ready=False)
    try:
        assert daemon.url.startswith("https://")
        listen = "127.0.0.1:" + daemon.url.rsplit(":", 1)[1]
        cmd = ["python", "/usr/local/bin/gpumon", "serve", f"--listen={listen}"]
        end = time.monotonic() + 15
        while probe(code, {"GPUMON_WEB_CONFIG": str(web)}, cmd, tmp_path) != 0:
            assert time.monotonic() < end, "the probe never found the TLS daemon healthy"
            time.sleep(0.2)
        assert probe(code, {}, [*cmd, "--web-config", str(web)], tmp_path) == 0
        # plain HTTP against the TLS listener fails: the probe must not guess
        assert probe(code, {}, cmd, tmp_path) != 0
    finally:
        daemon.stop()


# ---- the build context ------------------------------------------------------------------------------------


def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(.dockerignore) patterns in order as (exception, regex); Go filepath.Match syntax plus ``**``."""
    patterns = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line[1:].strip() if exception else line
        pattern = pattern.strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex, i = regex + "[" + pattern[i + 1 : end].replace("!", "^", 1) + "]", end + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        patterns.append((exception, re.compile(regex + "$")))
    return patterns


def excluded(path: str) -> bool:
    """Whether Docker leaves ``path`` (relative to the context) out: the last pattern matching the path or
    one of its parent directories decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for exception, regex in dockerignore_patterns():
        if any(regex.match(c) for c in candidates):
            verdict = not exception
    return verdict


def test_every_copy_source_is_in_the_build_context() -> None:
    instructions, _ = dockerfile()
    copies = [i for i in instructions if i.keyword in ("COPY", "ADD")]
    assert copies
    for ins in copies:
        words = [w for w in shlex.split(ins.args) if not w.startswith("--")]
        if "--from" in ins.args:
            continue
        for source in words[:-1]:
            path = ROOT / source
            assert path.exists(), f"line {ins.line}: {source} does not exist"
            files = [p for p in path.rglob("*.py")] if path.is_dir() else [path]
            assert files, f"line {ins.line}: {source} is empty"
            for f in files:
                rel = f.relative_to(ROOT).as_posix()
                assert not excluded(rel), f"line {ins.line}: {rel} is left out by .dockerignore"


def test_dockerignore_keeps_the_context_small() -> None:
    for path in (
        ".git/HEAD",
        ".venv/bin/python",
        ".pytest_cache/v/cache/nodeids",
        ".ruff_cache/CACHEDIR.TAG",
        ".mypy_cache/3.11/gpumon",
        "gpumon/__pycache__/config.cpython-312.pyc",
        "gpumon/cli/__pycache__/serve.cpython-312.pyc",
        "gpumon.egg-info/PKG-INFO",
        "build/lib/gpumon/__init__.py",
        "dist/gpumon-0.1.0-py3-none-any.whl",
        "tests/test_repo.py",
        "bench/results.json",
        ".env",
        "Dockerfile",
    ):
        assert excluded(path), f"{path} would be sent to the Docker daemon"
    for path in ("pyproject.toml", "README.md", "gpumon/__init__.py", "gpumon/cli/serve.py"):
        assert not excluded(path), path


@pytest.mark.parametrize(
    ("path", "expected"),
    [("a/b/__pycache__/x.pyc", True), ("gpumon/x.py", False), ("gpumonx/y.py", True), ("README.md", False)],
)
def test_dockerignore_matcher_follows_docker(path: str, expected: bool) -> None:
    assert excluded(path) is expected
