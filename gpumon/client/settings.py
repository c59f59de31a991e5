"""The Reporter's settings: its constructor arguments checked, filled in from the environment, defaulted.

A bad argument becomes a problem to log and its default, never an exception: monitoring must never stop a
training run. Standard library only: this module runs inside training processes.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any, Protocol

from gpumon.client.devices import resolve_devices
from gpumon.client.launcher import detect_job, detect_placement, sanitize_name
from gpumon.client.process.allocator import cuda_ordinal
from gpumon.client.protocol import (
    CONVENTIONS,
    DEFAULT_URL,
    DTYPES,
    KINDS,
    MAX_COUNT,
    MAX_DIMENSION,
    MAX_TP,
    MODEL_FIELDS,
    NAME_PATTERN,
    SETUP_CHOICES,
    SETUP_FLAGS,
)


class FlopsModel(Protocol):
    """What the Reporter's ``model`` argument must offer (gpumon.client.model.ModelSpec does)."""

    def flops_per_token(self, train: bool = True, convention: str = "palm") -> float: ...


_DTYPE_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "tf32": "tf32",
    "tensorfloat32": "tf32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "fp8": "fp8",
}


def normalize_dtype(dtype: object) -> str | None:
    """One of protocol.DTYPES for a name or alias (case-insensitive; "torch.bfloat16" and torch dtypes
    work through ``str()``; any "fp8…"/"float8…" variant is "fp8"), or None when unknown."""
    name = str(dtype).strip().lower()
    if name.startswith("torch."):
        name = name[len("torch.") :]
    if name.startswith(("fp8", "float8", "e4m3", "e5m2")):
        return "fp8"
    return _DTYPE_ALIASES.get(name)


def env_flag(raw: str | None) -> bool | None:
    """GPUMON_REPORT and friends: "0", "false", "no", "off" are False, "1", "true", "yes", "on" True, anything
    else (unset included) None."""
    if raw is None:
        return None
    text = raw.strip().lower()
    if text in ("0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    return None


def _positive(value: object) -> float | None:
    if value.__class__ is bool or not isinstance(value, (int, float)):
        try:
            value = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
    number = float(value)  # type: ignore[arg-type]
    return number if 0.0 < number < float("inf") else None


class Settings:
    """Everything a Reporter sends besides its counters, resolved once at construction."""

    def __init__(self) -> None:
        self.job = "python"
        self.rank = 0
        self.world_size = 1
        self.local_rank: int | None = None
        self.devices: list[str] = []
        self.kind = "train"
        self.workload: str | None = None
        self.dtype: str | None = None
        self.flops_per_token: float | None = None
        self.flops_convention: str | None = None
        self.peak_flops: float | None = None
        self.url = DEFAULT_URL
        self.token: str | None = None
        self.interval = 1.0
        self.resumed_step: int | None = None
        self.state_dir: str | None = None  # where the rank's state file lives (rankstate.py)
        self.setup: dict[str, Any] | None = None  # the report's "setup": what the memory estimator needs
        self.cuda_ordinal: int | None = None  # the device argument's CUDA ordinal, for the allocator


def resolve(
    env: Mapping[str, str],
    job: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    device: object = None,
    kind: str = "train",
    workload: str | None = None,
    dtype: object = None,
    flops_per_token: float | None = None,
    model: object = None,
    flops_convention: str | None = None,
    peak_flops: float | None = None,
    url: str | None = None,
    token: str | None = None,
    interval: float | None = None,
    resumed_step: int | None = None,
    micro_batch: int | None = None,
    zero_stage: int | None = None,
    setup: Mapping[str, Any] | None = None,
    state_dir: str | None = None,
) -> tuple[Settings, list[str]]:
    """(settings, problems): explicit arguments, else the environment, else defaults. A bad argument is a
    problem to log and is replaced by its default: monitoring must never stop a training run."""
    s = Settings()
    problems: list[str] = []
    placement = detect_placement(env)
    s.rank = _explicit_int("rank", rank, 0, placement.rank, problems)
    s.world_size = _explicit_int("world_size", world_size, 1, placement.world_size, problems)
    s.local_rank = _explicit_int("local_rank", local_rank, 0, placement.local_rank, problems)
    if s.rank >= s.world_size:
        problems.append(f"rank {s.rank} >= world_size {s.world_size}; world_size set to {s.rank + 1}")
        s.world_size = s.rank + 1
    s.job = detect_job(job if isinstance(job, str) else None, env)
    if isinstance(job, str) and job and s.job != job:
        problems.append(f"job {job!r} sent as {s.job!r} (names match {NAME_PATTERN})")
    if kind in KINDS:
        s.kind = kind
    else:
        problems.append(f"kind={kind!r} is not one of {KINDS}; using 'train'")
    if workload is not None:
        s.workload = sanitize_name(str(workload), fallback="") or None
        if s.workload != workload:
            problems.append(f"workload {workload!r} sent as {s.workload!r}")
    if dtype is not None:
        s.dtype = normalize_dtype(dtype)
        if s.dtype is None:
            problems.append(f"dtype {dtype!r} is not one of {DTYPES} or an alias; sent as null")
    if isinstance(model, str):  # a preset's name
        from gpumon.client.model import preset  # only then: the SDK works without the model module

        try:
            model = preset(model)
        except ValueError as exc:
            problems.append(f"model: {exc}; no FLOPs or memory estimate")
            model = None
    _resolve_flops(s, problems, flops_per_token, model, flops_convention, peak_flops)
    s.resumed_step = check_step(resumed_step, problems)
    s.setup = _setup(model, micro_batch, zero_stage, setup, problems)
    s.cuda_ordinal = cuda_ordinal(device)
    s.devices, bad = resolve_devices(device, s.local_rank, env)
    problems.extend(f"device {item} not understood; ignored" for item in bad)
    s.url = url or env.get("GPUMON_URL") or DEFAULT_URL
    s.token = token if token is not None else (env.get("GPUMON_INGEST_TOKEN") or None)
    directory = state_dir if state_dir is not None else env.get("GPUMON_STATE_DIR")
    if directory:
        if os.path.isdir(directory):
            s.state_dir = str(directory)
        else:
            problems.append(f"state directory {directory!r} is not a directory; restarts are not linked")
    raw_interval = interval if interval is not None else env.get("GPUMON_REPORT_INTERVAL")
    if raw_interval is not None:
        seconds = _positive(raw_interval)
        if seconds is None:
            problems.append(f"report interval {raw_interval!r} is not a positive number; using 1 s")
        else:
            # below 10 ms the thread would cost the training loop more than the reports are worth
            s.interval = max(0.01, seconds)
    return s, problems


def _explicit_int(name: str, value: object, floor: int, detected: Any, problems: list[str]) -> Any:
    if value is None:
        return detected
    if value.__class__ is bool or not isinstance(value, int) or value < floor:
        problems.append(f"{name}={value!r} is not an integer >= {floor}; using {detected!r} (environment)")
        return detected
    return value


def _resolve_flops(
    s: Settings, problems: list[str], per_token: object, model: object, convention: object, peak: object
) -> None:
    if convention is not None and convention not in CONVENTIONS:
        problems.append(f"flops_convention={convention!r} is not one of {CONVENTIONS}; ignored")
        convention = None
    if per_token is not None:
        s.flops_per_token = _positive(per_token)
        if s.flops_per_token is None:
            problems.append(f"flops_per_token={per_token!r} is not a positive number; sent as null")
        else:
            s.flops_convention = str(convention) if convention else "user"
    elif model is not None:
        # the model computes with a named formula; "user" names no formula it could apply
        used = str(convention) if convention in ("palm", "megatron") else "palm"
        try:
            computed = model.flops_per_token(train=s.kind == "train", convention=used)  # type: ignore[attr-defined]
        except Exception as exc:
            problems.append(f"model.flops_per_token() failed ({type(exc).__name__}: {exc}); sent as null")
        else:
            s.flops_per_token = _positive(computed)
            if s.flops_per_token is None:
                problems.append(f"model.flops_per_token() returned {computed!r}; sent as null")
            else:
                s.flops_convention = used
    if peak is not None:
        s.peak_flops = _positive(peak)
        if s.peak_flops is None:
            problems.append(f"peak_flops={peak!r} is not a positive number; sent as null")


def check_step(value: object, problems: list[str]) -> int | None:
    """A resumed global step: a non-negative integer (a NumPy integer too), else a problem and None."""
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and value.__class__ is not bool and 0 <= int(value) < MAX_COUNT:
        return int(value)
    problems.append(f"resumed_step={value!r} is not an integer >= 0; ignored")
    return None


def _setup(
    model: object, micro_batch: object, zero_stage: object, extra: object, problems: list[str]
) -> dict[str, Any] | None:
    """The report's ``setup``: sent only with a model shape (a ModelSpec or preset) and a micro-batch."""
    if micro_batch is None and zero_stage is None and extra is None:
        return None
    from gpumon.client.model import ModelSpec  # only then: the SDK works without the model module

    if not isinstance(model, ModelSpec):
        problems.append("micro_batch/zero_stage/setup need model= (a ModelSpec or a preset name); not sent")
        return None
    if micro_batch.__class__ is not int or not 0 < micro_batch <= MAX_DIMENSION:  # type: ignore[operator]
        problems.append(
            f"micro_batch={micro_batch!r} is not an integer from 1 to {MAX_DIMENSION}; no estimate"
        )
        return None
    too_large = [
        f for f in MODEL_FIELDS if isinstance(getattr(model, f), int) and getattr(model, f) > MAX_DIMENSION
    ]
    if too_large:  # the daemon would refuse every report with it
        problems.append(f"model.{too_large[0]} is above {MAX_DIMENSION}; no memory estimate")
        return None
    out: dict[str, Any] = {
        "model": {name: getattr(model, name) for name in MODEL_FIELDS},
        "micro_batch": micro_batch,
        "zero_stage": 0,
    }
    if model.name is not None:  # a label-safe name, or none: the daemon refuses a report with a bad one
        out["model"]["name"] = sanitize_name(str(model.name), fallback="") or None
    if zero_stage is not None:
        if zero_stage.__class__ is int and 0 <= zero_stage <= 3:  # type: ignore[operator]
            out["zero_stage"] = zero_stage
        else:
            problems.append(f"zero_stage={zero_stage!r} is not 0, 1, 2 or 3; sent as 0")
    if extra is None:
        return out
    if not isinstance(extra, Mapping):
        problems.append(f"setup={extra!r} is not a dict; ignored")
        return out
    for key, value in extra.items():
        if _setup_value_ok(key, value):
            out[key] = value
        else:
            problems.append(f"setup[{key!r}]={value!r} not understood; ignored")
    return out


def _setup_value_ok(key: object, value: object) -> bool:
    if key in SETUP_CHOICES:
        return isinstance(value, str) and value in SETUP_CHOICES[key]  # type: ignore[index]
    if key in SETUP_FLAGS:
        return isinstance(value, bool)
    return key == "tp" and value.__class__ is int and 1 <= value <= MAX_TP  # type: ignore[operator]
