"""The daemon's settings: the one object every part reads, its defaults, and the parsers of its value types.

Built by gpumon.config.resolve from flags, environment and file; the simulator's settings are checked by
gpumon.config.sim. Both build on this module, which imports neither.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
    replay: str | None = None  # answer NVML calls from this capture (docs/captures.md)
    seed: int = 0
    sim_faults: list[str] = field(default_factory=list)
    sim_jobs: list[str] = field(default_factory=list)  # simulated training jobs (gpumon/gpu/sim/jobs.py)
    sim_speed: float = 1.0  # simulated seconds per real second (soak tests: a simulated day in minutes)
    sim_unreported_jobs: bool = False  # GPUs without a sim job run jobs that do not report, not idle
    log_level: str = "info"
    events: bool = True  # the NVML event (XID) watcher
    processes: bool = True  # per-process GPU use and its owners
    profiling: str = "auto"  # auto: DCGM when reachable, else NVML GPM; gpm; dcgm; off
    dcgm_address: str | None = None  # an nv-hostengine host:port; None: embedded
    owner_labels: bool = False  # add the owning pod / Slurm job as labels on per-GPU series
    kubelet_socket: str = DEFAULT_KUBELET_SOCKET  # "" turns pod lookups off
    proc_root: str = "/proc"  # the host's /proc (mounted elsewhere when gpumon runs in a container)
    nics: bool = True  # the RDMA NICs, from sysfs (gpumon/net)
    sys_root: str | None = None  # the host's /sys; None: /sys, and no NICs for simulated or replayed GPUs
    compat: str | None = None  # "dcgm": also emit dcgm-exporter's metric names
    compat_hostname_label: str = "Hostname"  # or "hostname", as dcgm-exporter's main branch spells it
    collect: list[str] = field(default_factory=list)  # opt-in detail by name (gpumon.metrics DETAILS)
    # training telemetry (docs/training.md)
    ingest: bool = True  # accept SDK reports on POST /v1/report
    ingest_token: str | None = None  # when set, reports must carry "Authorization: Bearer <token>"
    ingest_socket: str | None = None  # also listen on this unix socket (SDK: GPUMON_URL=unix://PATH)
    ingest_allow_remote: bool = False  # accept reports from other hosts, not only loopback
    nccl_inspector_dir: str | None = None  # NCCL Inspector dumps to read (gpumon/nccl)
    rank_ttl: float = 60.0  # drop a rank (and its series) after this long without a report
    # a rare event's new counter shows 0 this long before its value: longer than every scraper's interval
    counter_hold: float = 60.0
    rate_window: float = 60.0  # the sliding window of tokens/s, phase shares and the diagnosis
    max_jobs: int = 32
    max_ranks: int = 256
    peak_tflops: dict[str, float] = field(default_factory=dict)  # dtype or "*" -> per-GPU FLOP/s
    thresholds: dict[str, float] = field(default_factory=dict)  # diagnosis thresholds that differ
    baselines: str = field(default_factory=lambda: default_baselines_path())  # the baseline library file
    node_name: str | None = None  # gpumon_node_info{node}; default: the host name
    web_config: str | None = None  # exporter-toolkit web-config.yml: TLS, basic auth (gpumon/web/)
    # connection hygiene (gpumon/web/connections.py)
    header_timeout: float = 10.0  # a request's line and headers must arrive within this
    request_timeout: float = 30.0  # a whole request (headers and body) must arrive within this
    max_connections: int = 1024  # open HTTP connections at most (lowered to fit the fd limit)

    @property
    def deadline(self) -> float:
        return self.timeout if self.timeout is not None else self.interval / 2.0

    @property
    def details(self) -> frozenset[str]:
        return frozenset(self.collect)

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
        if not m and _DURATION.match(text.strip().removeprefix("-")):
            raise ConfigError(f"{what}: must be more than 0 and at most 1h, got {text!r}")
        if not m:
            raise ConfigError(f"{what}: expected a duration such as 1s, 500ms or 2m, got {text!r}")
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[m.group(2)]
    if not 0 < seconds <= 3600:
        raise ConfigError(f"{what}: must be more than 0 and at most 1h, got {text!r}")
    return seconds


def text_setting(raw: Mapping[str, Any], key: str) -> str:
    """A setting that must be a string (flags and environment always are; a TOML file may say otherwise)."""
    value = raw[key]
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def default_baselines_path(env: Mapping[str, str] | None = None) -> str:
    """Where the daemon and ``gpumon baseline`` look by default, so the two agree on one machine without
    configuration: /var/lib/gpumon for root (the daemon's service user), the XDG data directory otherwise."""
    env = os.environ if env is None else env
    if os.geteuid() == 0:
        return "/var/lib/gpumon/baselines.toml"
    data = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "gpumon", "baselines.toml")
