"""One settings object from flags, GPUMON_* environment variables and an optional TOML file.

Precedence, highest first: command-line flag, environment variable, config file, built-in default.
The config file is read only when named (``--config PATH`` or ``GPUMON_CONFIG``); its keys are the long
flag names with underscores (``simulate_if_no_gpu = "8xH100-SXM"``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from gpumon.config.settings import (
    BACKENDS,
    COMPAT,
    LOG_LEVELS,
    PROFILING,
    ConfigError,
    Settings,
    parse_bool,
    parse_duration,
    text_setting,
)
from gpumon.files import MiB, NotAFile, read_text
from gpumon.web.listen import ListenError, parse_listen

MAX_FILE_BYTES = MiB  # a config file is a few hundred bytes; /dev/zero is not one


def _env_name(key: str) -> str:
    return "GPUMON_" + key.upper()


def load_file(path: str) -> dict[str, Any]:
    try:
        data = tomllib.loads(read_text(path, MAX_FILE_BYTES))
    except NotAFile as exc:  # a directory, a device, too large, not UTF-8
        raise ConfigError(f"config file {path} {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise ConfigError(f"config file {path} nests arrays or tables deeper than any setting") from None
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
            sep = {"sim_faults": ",", "sim_jobs": ";", "collect": ","}.get(f.name)
            raw[f.name] = [v.strip() for v in value.split(sep) if v.strip()] if sep else value
        elif f.name in from_file:
            raw[f.name] = from_file[f.name]
    return validate(raw)


def validate(raw: Mapping[str, Any]) -> Settings:
    # here, not at the top: it imports the simulator (~0.1 s), which commands that only read a constant or
    # ConfigError from this package should not pay for
    from gpumon.config.sim import validate_sim_jobs, validate_simulation

    s = Settings()
    if "listen" in raw:
        s.listen = text_setting(raw, "listen")
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
        s.backend = text_setting(raw, "backend").lower()
        if s.backend not in BACKENDS:
            raise ConfigError(f"backend: expected one of {', '.join(BACKENDS)}, got {raw['backend']!r}")
    validate_simulation(raw, s)
    if "log_level" in raw:
        s.log_level = text_setting(raw, "log_level").lower()
        if s.log_level not in LOG_LEVELS:
            raise ConfigError(f"log-level: expected one of {', '.join(LOG_LEVELS)}, got {raw['log_level']!r}")
    for key in ("events", "processes", "nics", "owner_labels", "ingest", "ingest_allow_remote"):
        if key in raw:
            setattr(s, key, parse_bool(raw[key], key.replace("_", "-")))
    _validate_telemetry(raw, s)
    _validate_training(raw, s)
    validate_sim_jobs(raw, s)
    return s


def _count(raw: Mapping[str, Any], key: str, hi: int) -> int:
    value = raw[key]
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= hi:
        raise ConfigError(f"{key.replace('_', '-')}: expected a whole number from 1 to {hi}, got {value!r}")
    return int(text)


def _validate_training(raw: Mapping[str, Any], s: Settings) -> None:
    from gpumon.jobs.diagnosis import Thresholds, parse_thresholds
    from gpumon.jobs.peaks import parse_override

    if raw.get("baselines"):
        s.baselines = os.path.expanduser(text_setting(raw, "baselines"))
    if raw.get("web_config"):
        s.web_config = os.path.expanduser(text_setting(raw, "web_config"))
    if raw.get("node_name"):
        s.node_name = text_setting(raw, "node_name").strip()
        if not s.node_name.isprintable():
            raise ConfigError(f"node-name: expected printable text, got {raw['node_name']!r}")
    if raw.get("ingest_token"):
        s.ingest_token = text_setting(raw, "ingest_token")
        if len(s.ingest_token) < 16 or not s.ingest_token.isprintable() or " " in s.ingest_token:
            raise ConfigError("ingest-token: use at least 16 printable characters without spaces")
    if raw.get("ingest_socket"):
        s.ingest_socket = text_setting(raw, "ingest_socket")
        parent = os.path.dirname(os.path.abspath(s.ingest_socket))
        if not os.path.isdir(parent):
            raise ConfigError(f"ingest-socket: directory {parent} does not exist")
    if raw.get("nccl_inspector_dir") is not None:
        path = text_setting(raw, "nccl_inspector_dir").strip()
        if path and not path.isprintable():
            raise ConfigError(f"nccl-inspector-dir: expected a path of printable characters, got {path!r}")
        # "" leaves it off, as an empty environment variable does; a relative path is the daemon's own
        s.nccl_inspector_dir = os.path.abspath(os.path.expanduser(path)) if path else None
    if s.nccl_inspector_dir is not None:
        if os.path.exists(s.nccl_inspector_dir) and not os.path.isdir(s.nccl_inspector_dir):
            raise ConfigError(f"nccl-inspector-dir: {s.nccl_inspector_dir} is not a directory")
        if not s.ingest:
            raise ConfigError("nccl-inspector-dir: joins the dumps to the ranks' reports; drop --no-ingest")
    for key in ("rank_ttl", "rate_window", "counter_hold"):
        if key in raw:
            setattr(s, key, parse_duration(raw[key], key.replace("_", "-")))
    for key in ("header_timeout", "request_timeout"):
        if key in raw:
            setattr(s, key, parse_duration(raw[key], key.replace("_", "-")))
    if s.request_timeout < s.header_timeout:
        raise ConfigError(
            f"request-timeout ({s.request_timeout:g}s) must not be shorter than header-timeout "
            f"({s.header_timeout:g}s): a request's headers are part of it"
        )
    if "max_connections" in raw:
        s.max_connections = _count(raw, "max_connections", 1_000_000)
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
        s.profiling = text_setting(raw, "profiling").lower()
        if s.profiling not in PROFILING:
            raise ConfigError(f"profiling: expected one of {', '.join(PROFILING)}, got {raw['profiling']!r}")
    if raw.get("dcgm_address"):
        s.dcgm_address = text_setting(raw, "dcgm_address")
        if s.profiling in ("gpm", "off"):
            raise ConfigError(f"--dcgm-address conflicts with --profiling {s.profiling}")
    if "kubelet_socket" in raw:
        s.kubelet_socket = text_setting(raw, "kubelet_socket")
    if "proc_root" in raw:
        s.proc_root = text_setting(raw, "proc_root")
        if not os.path.isdir(s.proc_root):
            raise ConfigError(f"proc-root: {s.proc_root} is not a directory (the host's /proc)")
    if "sys_root" in raw:
        s.sys_root = text_setting(raw, "sys_root")
        if not os.path.isdir(s.sys_root):
            raise ConfigError(f"sys-root: {s.sys_root} is not a directory (the host's /sys)")
    if raw.get("compat"):
        s.compat = text_setting(raw, "compat").lower()
        if s.compat not in COMPAT:
            raise ConfigError(f"compat: expected one of {', '.join(COMPAT)}, got {raw['compat']!r}")
    if "compat_hostname_label" in raw:
        s.compat_hostname_label = text_setting(raw, "compat_hostname_label").strip()
        if s.compat_hostname_label not in ("Hostname", "hostname"):
            raise ConfigError(
                f"compat-hostname-label: expected Hostname or hostname, got {raw['compat_hostname_label']!r}"
            )
        if s.compat != "dcgm" and s.compat_hostname_label != "Hostname":  # the default changes nothing
            raise ConfigError(
                "compat-hostname-label: names a label of the --compat dcgm series; add --compat dcgm"
            )
    if "collect" in raw:
        s.collect = _details(raw["collect"])


def _details(value: object) -> list[str]:
    """Opt-in detail names from a list (flags, a TOML array) or one comma-separated string; ``all`` is every
    one. Unknown names are an error that lists the known ones."""
    from gpumon.metrics.registry import ALL_DETAILS, DETAILS

    items = value if isinstance(value, list) else [value]
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"collect: expected names such as nvlink-links, got {item!r}")
        names += [n.strip().lower() for n in item.split(",") if n.strip()]
    for name in names:
        if name not in DETAILS and name != ALL_DETAILS:
            raise ConfigError(f"collect: unknown {name!r} (known: {', '.join(DETAILS)}, {ALL_DETAILS})")
    if ALL_DETAILS in names:
        return list(DETAILS)
    return sorted(set(names), key=list(DETAILS).index)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
