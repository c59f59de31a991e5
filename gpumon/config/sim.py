"""Simulator settings: --simulate, --simulate-if-no-gpu, --seed, --sim-fault, --sim-speed, --sim-job and
--sim-unreported-jobs.

Validated apart from the daemon's own settings because they only exist for simulated GPUs, and the
simulated training jobs depend on the listen and ingest settings being settled first.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Mapping
from typing import Any

from gpumon.config.settings import DEFAULT_SIMULATION, ConfigError, Settings, parse_bool, text_setting
from gpumon.gpu.sim import Fault, FaultSpecError, SpecError, parse_spec
from gpumon.gpu.sim.nvml import MAX_SPEED
from gpumon.web.listen import is_loopback, parse_listen


def validate_simulation(raw: Mapping[str, Any], s: Settings) -> None:
    """The simulated GPUs, their seed and faults (s.backend is already set)."""
    for key in ("simulate", "simulate_if_no_gpu"):
        if raw.get(key):
            spec = text_setting(raw, key)
            try:
                parse_spec(spec)
            except SpecError as exc:
                raise ConfigError(f"{key.replace('_', '-')}: {exc}") from None
            setattr(s, key, spec)
    if s.simulate and s.backend == "nvml":
        raise ConfigError("--simulate conflicts with --backend nvml: pick one")
    if s.simulate_if_no_gpu and s.backend != "auto":
        raise ConfigError("--simulate-if-no-gpu only applies with --backend auto")
    if raw.get("replay") is not None:
        _replay(raw, s)
    if "seed" in raw:
        seed = raw["seed"]
        if (
            isinstance(seed, bool)
            or not isinstance(seed, int | str)
            or not str(seed).strip().lstrip("-").isdigit()
        ):
            raise ConfigError(f"seed: expected an integer, got {seed!r}")
        s.seed = int(seed)
    faults = raw.get("sim_faults") or []
    if isinstance(faults, str):
        faults = [faults]
    if not isinstance(faults, list) or not all(isinstance(f, str) for f in faults):
        raise ConfigError(f"sim_faults: expected a list of fault strings, got {faults!r}")
    for spec in faults:
        try:
            Fault.parse(str(spec))
        except FaultSpecError as exc:
            raise ConfigError(f"sim-fault: {exc}") from None
    s.sim_faults = [str(f) for f in faults]
    if s.sim_faults and not (s.simulated or s.simulate_if_no_gpu):
        raise ConfigError("--sim-fault needs simulated GPUs (--simulate SPEC)")
    if "sim_unreported_jobs" in raw:
        s.sim_unreported_jobs = parse_bool(raw["sim_unreported_jobs"], "sim-unreported-jobs")
        if s.sim_unreported_jobs and not (s.simulated or s.simulate_if_no_gpu):
            raise ConfigError("--sim-unreported-jobs needs simulated GPUs (--simulate SPEC)")
    if "sim_speed" in raw:
        s.sim_speed = _speed(raw["sim_speed"])
        if s.sim_speed != 1.0 and not (s.simulated or s.simulate_if_no_gpu):
            raise ConfigError("--sim-speed needs simulated GPUs (--simulate SPEC): real time runs at 1")


def _replay(raw: Mapping[str, Any], s: Settings) -> None:
    from gpumon.gpu.capture import CaptureError, load

    s.replay = os.path.expanduser(text_setting(raw, "replay"))
    if not s.replay:
        raise ConfigError("--replay: give the capture file to replay")
    if s.simulate or s.simulate_if_no_gpu or s.backend != "auto":
        raise ConfigError(
            "--replay is a GPU source of its own: drop --simulate, --simulate-if-no-gpu and --backend"
        )
    try:
        load(s.replay)
    except CaptureError as exc:
        raise ConfigError(f"--replay {exc}") from None


def _speed(value: object) -> float:
    """--sim-speed: simulated seconds per real second, a number above 0 and at most MAX_SPEED."""
    number = math.nan
    if not isinstance(value, bool) and isinstance(value, int | float | str):
        with contextlib.suppress(ValueError):
            number = float(value)
    if not 0.0 < number <= MAX_SPEED:  # NaN (not a number, or "nan") fails too
        raise ConfigError(
            f"sim-speed: expected a number above 0 and at most {MAX_SPEED:g} (simulated seconds per real "
            f"second, e.g. 100), got {value!r}"
        )
    return number


def validate_sim_jobs(raw: Mapping[str, Any], s: Settings) -> None:
    from gpumon.gpu.sim.jobs import parse_jobs
    from gpumon.gpu.sim.ranks import check

    jobs = raw.get("sim_jobs") or []
    jobs = [jobs] if isinstance(jobs, str) else jobs
    if not isinstance(jobs, list) or not all(isinstance(j, str) for j in jobs):
        raise ConfigError(f"sim_jobs: expected a list of job specs, got {jobs!r}")
    if not jobs:
        return
    if s.sim_speed != 1.0:
        raise ConfigError(
            f"--sim-job ranks report through the SDK in real time: drop --sim-speed {s.sim_speed:g} (or the "
            "sim jobs)"
        )
    spec = s.simulate or (DEFAULT_SIMULATION if s.backend == "sim" else s.simulate_if_no_gpu)
    if spec is None:
        raise ConfigError("--sim-job needs simulated GPUs (--simulate SPEC)")
    if not s.ingest:
        raise ConfigError("--sim-job reports to this daemon's ingest: drop --no-ingest")
    host = parse_listen(s.listen)[0]
    local = is_loopback(host) or host in ("0.0.0.0", "::")  # the unspecified addresses include loopback
    if not (local or s.ingest_socket or s.ingest_allow_remote):
        raise ConfigError(
            f"--sim-job ranks report over loopback, which --listen {s.listen} does not serve: listen on "
            "0.0.0.0 or 127.0.0.1, or add --ingest-socket PATH"
        )
    models = parse_spec(spec)
    try:
        check(parse_jobs(jobs, len(models)), models)
    except ValueError as exc:
        raise ConfigError(f"sim-job: {exc}") from None
    s.sim_jobs = [j.strip() for j in jobs]
