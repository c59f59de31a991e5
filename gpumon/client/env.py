"""What a training process can learn about itself from its environment: rank, job name, GPUs.

Pure functions over a ``Mapping`` (``os.environ`` by default) so tests can pass plain dicts. Standard library
only, Python >= 3.9: this module runs inside training processes.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpumon.client.protocol import CONVENTIONS, DEFAULT_URL, DTYPES, KINDS, MAX_DEVICES, NAME_PATTERN

# (rank, world size, local rank) variables per launcher, in priority order. A whole launcher is taken or
# skipped: torchrun under Slurm runs one task per node, so SLURM_LOCALID would be 0 for every torchrun worker.
LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    # MPICH's Hydra launcher sets MPI_LOCALRANKID next to the PMI variables
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
)
_NAME_RE = re.compile(NAME_PATTERN)
_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.:/@+=-]")
_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9A-Za-z/.:-]+$")
_CUDA_RE = re.compile(r"^cuda:(\d+)$")


class Placement:
    """Where this process sits in its job: the launcher it came from and its ranks."""

    __slots__ = ("launcher", "local_rank", "rank", "world_size")

    def __init__(self, launcher: str | None, rank: int, world_size: int, local_rank: int | None) -> None:
        self.launcher = launcher
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank

    def __repr__(self) -> str:
        return (
            f"Placement(launcher={self.launcher!r}, rank={self.rank}, world_size={self.world_size}, "
            f"local_rank={self.local_rank})"
        )


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def detect_placement(env: Mapping[str, str] | None = None) -> Placement:
    """Rank, world size and local rank from torchrun, Slurm, Open MPI or MPICH/PMI, in that order.

    The first launcher whose rank variable holds a non-negative integer wins; outside any launcher this is
    rank 0 of a world of 1 with no local rank.
    """
    env = os.environ if env is None else env
    for launcher, rank_var, size_var, local_var in LAUNCHERS:
        rank = _int(env, rank_var)
        if rank is None:
            continue
        size = _int(env, size_var)
        return Placement(launcher, rank, size if size else 1, _int(env, local_var))
    return Placement(None, 0, 1, None)


def sanitize_name(raw: str, fallback: str = "python") -> str:
    """``raw`` made to match protocol.NAME_PATTERN: bad characters become "-", a leading non-alphanumeric run
    is dropped, the result is cut to 128 characters; ``fallback`` when nothing is left."""
    name = _BAD_NAME_CHARS.sub("-", raw.strip())
    name = re.sub(r"^[^A-Za-z0-9]+", "", name)[:128]
    return name if _NAME_RE.match(name) else fallback


def script_name(argv: Sequence[str] | None = None) -> str:
    """The running script's name without directory and ".py" ("python" for a REPL or ``python -c``)."""
    argv = sys.argv if argv is None else argv
    first = argv[0] if argv else ""
    if first in ("", "-c", "-m", "-"):
        return "python"
    base = os.path.basename(first.rstrip("/"))
    return base[:-3] if base.endswith(".py") else base


def detect_job(
    explicit: str | None = None, env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None
) -> str:
    """The job name, identical on every rank of a job: explicit, GPUMON_JOB, TORCHELASTIC_RUN_ID (unless
    torchrun's default "none"), "slurm-<id>" or "<SLURM_JOB_NAME>-<id>", else the script's name; sanitised."""
    env = os.environ if env is None else env
    if explicit:
        return sanitize_name(explicit)
    for candidate in (env.get("GPUMON_JOB"), env.get("TORCHELASTIC_RUN_ID")):
        if candidate and candidate.strip() and candidate.strip().lower() != "none":
            return sanitize_name(candidate)
    slurm_id = (env.get("SLURM_JOB_ID") or "").strip()
    if slurm_id:
        slurm_name = (env.get("SLURM_JOB_NAME") or "").strip()
        return sanitize_name(f"{slurm_name}-{slurm_id}" if slurm_name else f"slurm-{slurm_id}")
    return sanitize_name(script_name(argv))


def visible_devices(env: Mapping[str, str] | None = None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list of NVML indexes or UUIDs; None when unset (every GPU is visible).

    Follows CUDA's parsing: entries are read up to the first invalid one (so "-1" or "NoDevFiles" hide every
    GPU, and "" does too). UUID entries, including CUDA's accepted unique prefixes, pass through unchanged.
    """
    env = os.environ if env is None else env
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    out: list[str] = []
    for entry in raw.split(","):
        entry = entry.strip()
        if entry.isdigit():
            out.append(str(int(entry)))
        elif _UUID_RE.match(entry):
            out.append(entry)
        else:
            break
    return out


def ordinal_to_device(ordinal: int, visible: list[str] | None) -> str | None:
    """The NVML index or UUID behind CUDA ordinal ``ordinal``, or None when it cannot be known.

    CUDA ordinals equal NVML indexes only with the default ordering on homogeneous nodes: CUDA orders by
    speed (CUDA_DEVICE_ORDER=FASTEST_FIRST) and NVML by PCI bus id, so the mapping is exact only with
    CUDA_DEVICE_ORDER=PCI_BUS_ID or identical GPUs. A CUDA_VISIBLE_DEVICES of UUIDs is exact either way.
    A process bound to a single GPU (Slurm's per-task binding leaves one entry) uses that one whatever its
    local rank.
    """
    if visible is None:
        return str(ordinal)
    if ordinal < len(visible):
        return visible[ordinal]
    if len(visible) == 1:
        return visible[0]
    return None


def resolve_devices(
    device: object, local_rank: int | None, env: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """(devices for the report, problems to warn about) from the Reporter's ``device`` argument.

    Accepted forms: an int CUDA ordinal or "cuda:N" (mapped through CUDA_VISIBLE_DEVICES), an object with
    ``.type == "cuda"`` and an int ``.index`` (torch.device), a "GPU-…"/"MIG-…" UUID, a decimal string
    taken as an NVML index as-is (to bypass the mapping), or a list of those. None means the local rank's
    GPU, or the only visible GPU when there is no local rank; [] when nothing is known.
    """
    visible = visible_devices(env)
    if device is None:
        if local_rank is not None:
            found = ordinal_to_device(local_rank, visible)
            return ([found] if found is not None else []), []
        if visible is not None and len(visible) == 1:
            return [visible[0]], []
        return [], []
    items = list(device) if isinstance(device, (list, tuple)) else [device]
    devices: list[str] = []
    problems: list[str] = []
    for item in items:
        found = _one_device(item, visible)
        if found is None:
            problems.append(repr(item))
        elif found not in devices:
            devices.append(found)
    if len(devices) > MAX_DEVICES:
        problems.append(f"more than {MAX_DEVICES} devices")
        devices = devices[:MAX_DEVICES]
    return devices, problems


def _one_device(item: object, visible: list[str] | None) -> str | None:
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return ordinal_to_device(item, visible) if item >= 0 else None
    if isinstance(item, str):
        text = item.strip()
        match = _CUDA_RE.match(text)
        if match:
            return ordinal_to_device(int(match.group(1)), visible)
        if text.isdigit():
            return str(int(text))
        return text if _UUID_RE.match(text) else None
    # torch.device, without importing torch
    index = getattr(item, "index", None)
    if getattr(item, "type", None) == "cuda" and isinstance(index, int):
        return ordinal_to_device(index, visible)
    return None


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
    _resolve_flops(s, problems, flops_per_token, model, flops_convention, peak_flops)
    s.devices, bad = resolve_devices(device, s.local_rank, env)
    problems.extend(f"device {item} not understood; ignored" for item in bad)
    s.url = url or env.get("GPUMON_URL") or DEFAULT_URL
    s.token = token if token is not None else (env.get("GPUMON_INGEST_TOKEN") or None)
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
