"""deploy/systemd: the unit and each drop-in pass ``systemd-analyze verify`` without a word, their exposure
stays at or below the thresholds deploy/systemd/README.md documents, the hardening is all there, and the
command line and the environment file speak gpumon's real CLI and settings."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from support.helpers import IN_CI, ROOT, require_tool

from gpumon.cli import _flags, build_parser
from gpumon.config import Settings, resolve

SYSTEMD = ROOT / "deploy" / "systemd"
UNIT = SYSTEMD / "gpumon.service"
DROPINS = SYSTEMD / "gpumon.service.d"
ENV_FILE = SYSTEMD / "gpumon.env"
README = SYSTEMD / "README.md"

# Settings naming a file that must exist once set: their example values are not defaults to resolve.
FILE_SETTINGS = {"GPUMON_CONFIG", "GPUMON_WEB_CONFIG"}
# Settings an operator of a real node does not set in the environment file: the simulator's, and proc_root
# (for containers that see the host's /proc elsewhere).
NOT_FOR_OPERATORS = {
    "simulate",
    "replay",  # a capture replayed is a test bench, not a node
    "simulate_if_no_gpu",
    "seed",
    "sim_faults",
    "sim_jobs",
    "sim_unreported_jobs",
    "sim_speed",
    "proc_root",
    "sys_root",  # the unit runs on the host: its /sys
}

# The security checks the base unit fails on purpose; each is a row of README.md's "What is left out" (or the
# NVIDIA device ACL itself). Any other failing check means a hardening directive went missing.
ACCEPTED_EXPOSURE = {
    "RootDirectory=/RootImage=",
    "PrivateDevices=",
    "RestrictAddressFamilies=~AF_UNIX",
    "RestrictAddressFamilies=~AF_(INET|INET6)",
    "ProtectProc=",
    "ProcSubset=",
    "PrivateNetwork=",
    "PrivateUsers=",
    "DeviceAllow=",
    "IPAddressDeny=",
}
# /proc/devices names of the NVIDIA character devices NVML opens (before and since driver 550) and MIG's
# capability devices; nvidia-uvm is CUDA's and stays out.
NVIDIA_DEVICE_GROUPS = {
    "char-nvidia-frontend": "rw",
    "char-nvidia": "rw",
    "char-nvidiactl": "rw",
    "char-nvidia-caps": "r",
}


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file, each a list of (key, value) in order (keys repeat; "" resets lists)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith(("#", ";"))):
            continue
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        line, logical = logical + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"not a unit file line: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(section: list[tuple[str, str]], key: str) -> list[str]:
    return [v for k, v in section if k == key]


def single(section: list[tuple[str, str]], key: str) -> str | None:
    found = values(section, key)
    assert len(found) <= 1, f"{key}= is set {len(found)} times"
    return found[0] if found else None


def service() -> list[tuple[str, str]]:
    return parse_unit(UNIT.read_text())["Service"]


def exec_start() -> list[str]:
    (line,) = values(service(), "ExecStart")
    return shlex.split(line.lstrip("-@:+!"))


def documented_thresholds() -> dict[str, float]:
    """README.md's exposure table: configuration ("gpumon.service" or a drop-in file name) -> threshold."""
    rows = re.findall(
        r"^\| (?:with )?`([\w.-]+)` \| (\d+\.\d) \w+ \| (\d+\.\d) \|$", README.read_text(), flags=re.M
    )
    assert rows, "deploy/systemd/README.md has no exposure table"
    return {name: float(threshold) for name, _, threshold in rows}


CONFIGURATIONS = ["gpumon.service", *sorted(p.name for p in DROPINS.glob("*.conf"))]


@pytest.fixture(scope="module")
def unit_dirs() -> Path:
    """The host's own units (sysinit.target, multi-user.target, ...): verify resolves dependencies there."""
    for d in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        if (d / "multi-user.target").exists():
            return d
    if IN_CI:
        pytest.fail("CI needs systemd's unit files (.ci/run installs the systemd package)")
    pytest.skip("no systemd unit directory on this machine")


def install(tmp_path: Path, unit_dirs: Path, configuration: str) -> Path:
    """A file system root with the unit installed as deploy/systemd/README.md says, one drop-in (or none), and
    the program ExecStart names, where the README's install puts it; systemd-analyze --root reads it."""
    root = tmp_path / "root"
    shutil.copytree(unit_dirs, root / "usr/lib/systemd/system", symlinks=True)
    system = root / "etc/systemd/system"
    system.mkdir(parents=True)
    shutil.copy(UNIT, system / "gpumon.service")
    if configuration != "gpumon.service":
        (system / "gpumon.service.d").mkdir()
        shutil.copy(DROPINS / configuration, system / "gpumon.service.d" / configuration)
    program = root / exec_start()[0].lstrip("/")
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return root


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    exe = require_tool("systemd-analyze")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_unit_verifies_without_a_word(tmp_path: Path, unit_dirs: Path, configuration: str) -> None:
    # verify exits 0 on unknown keys, bad values it ignores and missing programs alike: only silence is clean
    root = install(tmp_path, unit_dirs, configuration)
    result = analyze("verify", "--man=no", f"--root={root}", "gpumon.service")
    assert result.returncode == 0 and result.stderr == "" and result.stdout == "", result.stderr


def test_verify_notices_what_it_should(tmp_path: Path, unit_dirs: Path) -> None:
    """The clean result above means something: a typo and a missing program are reported."""
    root = install(tmp_path, unit_dirs, "gpumon.service")
    unit = root / "etc/systemd/system/gpumon.service"
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSytem=strict"))
    assert "Unknown key" in analyze("verify", "--man=no", f"--root={root}", "gpumon.service").stderr
    (root / exec_start()[0].lstrip("/")).unlink()
    assert "is not executable" in analyze("verify", "--man=no", f"--root={root}", "gpumon.service").stderr


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_exposure_within_documented_threshold(tmp_path: Path, unit_dirs: Path, configuration: str) -> None:
    thresholds = documented_thresholds()
    assert configuration in thresholds, f"deploy/systemd/README.md documents no exposure for {configuration}"
    threshold = thresholds[configuration]
    root = install(tmp_path, unit_dirs, configuration)
    result = analyze(
        "security",
        "--offline=yes",
        f"--threshold={round(threshold * 10)}",
        f"--root={root}",
        "gpumon.service",
    )
    m = re.search(r"Overall exposure level for gpumon\.service: (\d+\.\d+)", result.stdout)
    assert m, result.stdout + result.stderr
    assert float(m.group(1)) <= threshold, f"{configuration}: exposure {m.group(1)} > {threshold}"
    assert result.returncode == 0, result.stderr


def test_drop_ins_state_the_documented_threshold() -> None:
    thresholds = documented_thresholds()
    for path in DROPINS.glob("*.conf"):
        said = re.findall(r"threshold (\d+\.\d)", path.read_text())
        assert said and all(float(s) == thresholds[path.name] for s in said), path.name


def test_only_the_documented_security_checks_fail(tmp_path: Path, unit_dirs: Path) -> None:
    root = install(tmp_path, unit_dirs, "gpumon.service")
    result = analyze("security", "--offline=yes", "--json=short", f"--root={root}", "gpumon.service")
    checks = json.loads(result.stdout)
    failing = {c["name"] for c in checks if c["set"] is False or float(c["exposure"] or 0) > 0}
    assert failing == ACCEPTED_EXPOSURE, (
        f"newly exposed: {sorted(failing - ACCEPTED_EXPOSURE)}; "
        f"now hardened (update the list and README.md): {sorted(ACCEPTED_EXPOSURE - failing)}"
    )


def test_hardening_directives_are_present() -> None:
    s = service()
    expected = {
        "Type": "exec",
        "DynamicUser": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateMounts": "yes",
        "NoNewPrivileges": "yes",
        "RestrictSUIDSGID": "yes",
        "RemoveIPC": "yes",
        "KeyringMode": "private",
        "UMask": "0077",
        "CapabilityBoundingSet": "",
        "AmbientCapabilities": "",
        "DevicePolicy": "closed",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "ProtectClock": "yes",
        "ProtectHostname": "yes",
        "RestrictNamespaces": "yes",
        "RestrictRealtime": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "SystemCallArchitectures": "native",
        "SystemCallErrorNumber": "EPERM",
        "StateDirectory": "gpumon",
        "RuntimeDirectory": "gpumon",
        "Restart": "on-failure",
        "RestartPreventExitStatus": "2",
        # soft and hard: the filter below refuses setrlimit (@resources), so gpumon cannot raise it itself
        "LimitNOFILE": "65536",
    }
    for key, value in expected.items():
        assert single(s, key) == value, f"{key}={single(s, key)!r}, expected {value!r}"
    assert set((single(s, "RestrictAddressFamilies") or "").split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert values(s, "SystemCallFilter") == ["@system-service", "~@privileged @resources"]
    allowed = dict(v.split() for v in values(s, "DeviceAllow"))
    assert allowed == NVIDIA_DEVICE_GROUPS
    assert single(s, "User") in (None, "gpumon") and single(s, "Group") in (None, "gpumon")
    assert parse_unit(UNIT.read_text())["Install"] == [("WantedBy", "multi-user.target")]


def test_directives_that_would_break_gpumon_are_absent() -> None:
    s = service()
    # other users' /proc/<pid> (attribution), /proc/driver/nvidia (NVML), /dev/nvidia*, real uids
    assert single(s, "ProtectProc") in (None, "default")
    assert single(s, "ProcSubset") in (None, "all")
    assert single(s, "PrivateDevices") in (None, "no")
    assert single(s, "PrivateUsers") in (None, "no")
    assert single(s, "PrivateNetwork") in (None, "no")
    # gpumon does not call sd_notify: Type=notify would time out and kill it
    assert single(s, "Type") != "notify" and single(s, "NotifyAccess") is None


def test_drop_ins_only_add_what_they_document() -> None:
    per_process = parse_unit((DROPINS / "per-process.conf").read_text())["Service"]
    for key in ("CapabilityBoundingSet", "AmbientCapabilities"):
        # both: another user's /proc/<pid>/environ is 0400 *and* ptrace-checked (either alone gets EACCES)
        assert values(per_process, key) == ["CAP_SYS_PTRACE CAP_DAC_READ_SEARCH"]
    profiling = parse_unit((DROPINS / "profiling.conf").read_text())["Service"]
    for key in ("CapabilityBoundingSet", "AmbientCapabilities"):
        # the NVIDIA driver's "administrator" for profiling counters is capable(CAP_SYS_ADMIN)
        assert values(profiling, key) == ["CAP_SYS_ADMIN"]
    web = parse_unit((DROPINS / "web-config.conf").read_text())["Service"]
    assert not {k for k, _ in web} - {"LoadCredential", "Environment"}


def unit_environment() -> dict[str, str]:
    env: dict[str, str] = {}
    for line in values(service(), "Environment"):
        for assignment in shlex.split(line):
            key, _, value = assignment.partition("=")
            env[key] = value
    return env


def env_file_assignments(commented: bool) -> dict[str, str]:
    """VAR=value lines of gpumon.env: the active ones, or those shown commented out (the defaults)."""
    prefix = r"#" if commented else r""
    pattern = re.compile(rf"^{prefix}(GPUMON_[A-Z0-9_]+)=(.*)$")
    return {
        m.group(1): m.group(2) for line in ENV_FILE.read_text().splitlines() if (m := pattern.match(line))
    }


def settings_names() -> set[str]:
    return {"GPUMON_" + f.name.upper() for f in dataclasses.fields(Settings)} | {"GPUMON_CONFIG"}


def resolve_as_the_unit(argv: list[str], env: dict[str, str], tmp_path: Path) -> Settings:
    """gpumon's own parser and settings resolution, with /run/gpumon (RuntimeDirectory=, which systemd
    creates before the start) standing in a temporary directory."""
    runtime = tmp_path / "run" / "gpumon"
    runtime.mkdir(parents=True, exist_ok=True)
    env = {k: v.replace("/run/gpumon/", f"{runtime}/") for k, v in env.items()}
    parser, _ = build_parser()
    args, extra = parser.parse_known_args(argv)
    assert not extra, f"gpumon does not know {extra}"
    return resolve(_flags(args), env=env)


def test_exec_start_runs_gpumon_serve_with_the_units_settings(tmp_path: Path) -> None:
    argv = exec_start()
    assert Path(argv[0]).name == "gpumon" and argv[1] == "serve"
    assert argv[0] == "/opt/gpumon/bin/gpumon", "the path deploy/systemd/README.md installs to"
    env = unit_environment()
    assert set(env) <= settings_names()
    settings = resolve_as_the_unit(argv[1:], env, tmp_path)
    # a non-root daemon's built-in default is under its home: the unit must name the state directory
    assert settings.baselines == f"/var/lib/{single(service(), 'StateDirectory')}/baselines.toml"
    assert settings.ingest_socket is not None and settings.ingest_socket.startswith(str(tmp_path / "run"))
    assert settings.backend == "auto" and not settings.simulated
    assert values(service(), "EnvironmentFile") == ["-/etc/gpumon/gpumon.env"]


def test_environment_file_names_real_settings() -> None:
    active, shown = env_file_assignments(commented=False), env_file_assignments(commented=True)
    named = set(active) | set(shown)
    unknown = named - settings_names()
    assert not unknown, f"gpumon.env names settings gpumon does not have: {sorted(unknown)}"
    wanted = {"GPUMON_" + f.name.upper() for f in dataclasses.fields(Settings)} - {
        "GPUMON_" + n.upper() for n in NOT_FOR_OPERATORS
    }
    assert not wanted - named, f"gpumon.env does not show {sorted(wanted - named)}"
    assert not active, "every line is a commented default; operators uncomment what they change"


def test_environment_file_defaults_are_gpumons(tmp_path: Path) -> None:
    """Uncommenting any shown value changes nothing: they are the real defaults, in valid syntax."""
    shown = {k: v for k, v in env_file_assignments(commented=True).items() if v and k not in FILE_SETTINGS}
    argv = exec_start()[1:]
    baseline = resolve_as_the_unit(argv, unit_environment(), tmp_path)
    uncommented = resolve_as_the_unit(argv, {**unit_environment(), **shown}, tmp_path)
    assert uncommented.deadline == baseline.deadline  # "half the interval", written out
    uncommented.timeout = baseline.timeout
    assert uncommented == baseline
