"""One settings object from flags, GPUMON_* environment variables and an optional TOML file.

Precedence, highest first: command-line flag, environment variable, config file, built-in default.
The config file is read only when named (``--config PATH`` or ``GPUMON_CONFIG``); its keys are the long
flag names with underscores (``simulate_if_no_gpu = "8xH100-SXM"``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from gpumon.listen import ListenError, parse_listen

DEFAULT_PORT = 9478
DEFAULT_SIMULATION = "8xH100-SXM"
BACKENDS = ("auto", "nvml", "sim")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    """A setting is wrong; the message says which and how to fix it."""


DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
PROFILING = ("auto", "gpm", "dcgm", "off")
COMPAT = ("dcgm",)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"{what}: expected true or false, got {value!r}")


@dataclass
class Settings:
    listen: str = f"0.0.0.0:{DEFAULT_PORT}"
    interval: float = 1.0
    timeout: float | None = None  # per-GPU deadline for one sweep; default half the interval
    backend: str = "auto"
    simulate: str | None = None
    simulate_if_no_gpu: str | None = None
    seed: int = 0
    sim_faults: list[str] = field(default_factory=list)
    sim_jobs: list[str] = field(default_factory=list)  # simulated training jobs (gpumon/gpu/sim/jobs.py)
    sim_speed: float = 1.0  # simulated seconds per real second (soak tests: a simulated day in minutes)
    log_level: str = "info"
    events: bool = True  # the NVML event (XID) watcher
    processes: bool = True  # per-process GPU use and its owners
    profiling: str = "auto"  # auto: DCGM when reachable, else NVML GPM; gpm; dcgm; off
    dcgm_address: str | None = None  # an nv-hostengine host:port; None: embedded
    owner_labels: bool = False  # add the owning pod / Slurm job as labels on per-GPU series
    kubelet_socket: str = DEFAULT_KUBELET_SOCKET  # "" turns pod lookups off
    proc_root: str = "/proc"  # the host's /proc (mounted elsewhere when gpumon runs in a container)
    compat: str | None = None  # "dcgm": also emit dcgm-exporter's metric names
    # training telemetry (docs/training.md)
    ingest: bool = True  # accept SDK reports on POST /v1/report
    ingest_token: str | None = None  # when set, reports must carry "Authorization: Bearer <token>"
    ingest_socket: str | None = None  # also listen on this unix socket (SDK: GPUMON_URL=unix://PATH)
    ingest_allow_remote: bool = False  # accept reports from other hosts, not only loopback
    rank_ttl: float = 60.0  # drop a rank (and its series) after this long without a report
    rate_window: float = 60.0  # the sliding window of tokens/s, phase shares and the diagnosis
    max_jobs: int = 32
    max_ranks: int = 256
    peak_tflops: dict[str, float] = field(default_factory=dict)  # dtype or "*" -> per-GPU FLOP/s
    thresholds: dict[str, float] = field(default_factory=dict)  # diagnosis thresholds that differ
    baselines: str = field(default_factory=lambda: default_baselines_path())  # the baseline library file
    node_name: str | None = None  # gpumon_node_info{node}; default: the host name
    web_config: str | None = None  # exporter-toolkit web-config.yml: TLS, basic auth (gpumon/access/)

    @property
    def deadline(self) -> float:
        return self.timeout if self.timeout is not None else self.interval / 2.0

    @property
    def simulated(self) -> bool:
        return self.backend == "sim" or self.simulate is not None


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$")


def parse_duration(text: object, what: str) -> float:
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ConfigError(f"{what}: expected a duration such as 1s or 500ms, got {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        m = _DURATION.match(text)
        if not m:
            raise ConfigError(f"{what}: expected a duration such as 1s, 500ms or 2m, got {text!r}")
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]
    if not 0 < seconds <= 3600:
        raise ConfigError(f"{what}: must be more than 0 and at most 1h, got {text!r}")
    return seconds


def _env_name(key: str) -> str:
    return "GPUMON_" + key.upper()


def load_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    known = {f.name for f in fields(Settings)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})"
        )
    return data


def resolve(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Settings:
    """Merge flags (None = not given), environment and config file; validate everything."""
    env = os.environ if env is None else env
    config_path = flags.get("config") or env.get("GPUMON_CONFIG")
    from_file = load_file(config_path) if config_path else {}
    raw: dict[str, Any] = {}
    for f in fields(Settings):
        flag = flags.get(f.name)
        if flag is not None and flag != []:
            raw[f.name] = flag
        elif _env_name(f.name) in env:
            value: Any = env[_env_name(f.name)]
            # a sim job's GPU list has commas of its own, so GPUMON_SIM_JOBS separates jobs with ";"
            sep = {"sim_faults": ",", "sim_jobs": ";"}.get(f.name)
            raw[f.name] = [v.strip() for v in value.split(sep) if v.strip()] if sep else value
        elif f.name in from_file:
            raw[f.name] = from_file[f.name]
    return validate(raw)


def _text(raw: Mapping[str, Any], key: str) -> str:
    """A setting that must be a string (flags and environment always are; a TOML file may say otherwise)."""
    value = raw[key]
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def validate(raw: Mapping[str, Any]) -> Settings:
    from gpumon.config_sim import validate_sim_jobs, validate_simulation  # here: they import this module

    s = Settings()
    if "listen" in raw:
        s.listen = _text(raw, "listen")
        try:
            parse_listen(s.listen)
        except ListenError as exc:
            raise ConfigError(str(exc)) from None
    if "interval" in raw:
        s.interval = parse_duration(raw["interval"], "interval")
    if raw.get("timeout") is not None:
        s.timeout = parse_duration(raw["timeout"], "timeout")
        if s.timeout > s.interval:
            raise ConfigError(f"timeout ({s.timeout:g}s) must not exceed the interval ({s.interval:g}s)")
    if "backend" in raw:
        s.backend = _text(raw, "backend").lower()
        if s.backend not in BACKENDS:
            raise ConfigError(f"backend: expected one of {', '.join(BACKENDS)}, got {raw['backend']!r}")
    validate_simulation(raw, s)
    if "log_level" in raw:
        s.log_level = _text(raw, "log_level").lower()
        if s.log_level not in LOG_LEVELS:
            raise ConfigError(f"log-level: expected one of {', '.join(LOG_LEVELS)}, got {raw['log_level']!r}")
    for key in ("events", "processes", "owner_labels", "ingest", "ingest_allow_remote"):
        if key in raw:
            setattr(s, key, parse_bool(raw[key], key.replace("_", "-")))
    _validate_telemetry(raw, s)
    _validate_training(raw, s)
    validate_sim_jobs(raw, s)
    return s


def default_baselines_path(env: Mapping[str, str] | None = None) -> str:
    """Where the daemon and ``gpumon baseline`` look by default, so the two agree on one machine without
    configuration: /var/lib/gpumon for root (the daemon's service user), the XDG data directory otherwise."""
    env = os.environ if env is None else env
    if os.geteuid() == 0:
        return "/var/lib/gpumon/baselines.toml"
    data = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "gpumon", "baselines.toml")


def _count(raw: Mapping[str, Any], key: str, hi: int) -> int:
    value = raw[key]
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= hi:
        raise ConfigError(f"{key.replace('_', '-')}: expected a whole number from 1 to {hi}, got {value!r}")
    return int(text)


def _validate_training(raw: Mapping[str, Any], s: Settings) -> None:
    from gpumon.training.diagnosis import Thresholds, parse_thresholds
    from gpumon.training.peaks import parse_override

    if raw.get("baselines"):
        s.baselines = os.path.expanduser(_text(raw, "baselines"))
    if raw.get("web_config"):
        s.web_config = os.path.expanduser(_text(raw, "web_config"))
    if raw.get("node_name"):
        s.node_name = _text(raw, "node_name").strip()
        if not s.node_name.isprintable():
            raise ConfigError(f"node-name: expected printable text, got {raw['node_name']!r}")
    if raw.get("ingest_token"):
        s.ingest_token = _text(raw, "ingest_token")
        if len(s.ingest_token) < 16 or not s.ingest_token.isprintable() or " " in s.ingest_token:
            raise ConfigError("ingest-token: use at least 16 printable characters without spaces")
    if raw.get("ingest_socket"):
        s.ingest_socket = _text(raw, "ingest_socket")
        parent = os.path.dirname(os.path.abspath(s.ingest_socket))
        if not os.path.isdir(parent):
            raise ConfigError(f"ingest-socket: directory {parent} does not exist")
    for key in ("rank_ttl", "rate_window"):
        if key in raw:
            setattr(s, key, parse_duration(raw[key], key.replace("_", "-")))
    if "max_jobs" in raw:
        s.max_jobs = _count(raw, "max_jobs", 10_000)
    if "max_ranks" in raw:
        s.max_ranks = _count(raw, "max_ranks", 100_000)
    if raw.get("peak_tflops") not in (None, "", {}):
        value = raw["peak_tflops"]
        if isinstance(value, dict):
            value = ",".join(f"{k}={v}" for k, v in value.items())
        try:
            s.peak_tflops = parse_override(str(value))
        except ValueError as exc:
            raise ConfigError(f"peak-tflops: {exc}") from None
    if raw.get("thresholds"):
        value = raw["thresholds"]
        items = value if isinstance(value, dict | list) else [str(value)]
        try:
            parsed = parse_thresholds(items)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        default = Thresholds()
        s.thresholds = {k: v for k, v in vars(parsed).items() if v != getattr(default, k)}


def _validate_telemetry(raw: Mapping[str, Any], s: Settings) -> None:
    if "profiling" in raw:
        s.profiling = _text(raw, "profiling").lower()
        if s.profiling not in PROFILING:
            raise ConfigError(f"profiling: expected one of {', '.join(PROFILING)}, got {raw['profiling']!r}")
    if raw.get("dcgm_address"):
        s.dcgm_address = _text(raw, "dcgm_address")
        if s.profiling in ("gpm", "off"):
            raise ConfigError(f"--dcgm-address conflicts with --profiling {s.profiling}")
    if "kubelet_socket" in raw:
        s.kubelet_socket = _text(raw, "kubelet_socket")
    if "proc_root" in raw:
        s.proc_root = _text(raw, "proc_root")
        if not os.path.isdir(s.proc_root):
            raise ConfigError(f"proc-root: {s.proc_root} is not a directory (the host's /proc)")
    if raw.get("compat"):
        s.compat = _text(raw, "compat").lower()
        if s.compat not in COMPAT:
            raise ConfigError(f"compat: expected one of {', '.join(COMPAT)}, got {raw['compat']!r}")


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
