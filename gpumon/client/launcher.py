"""What a process learns from the launcher that started it: its ranks and its job's name.

torchrun, Slurm, Open MPI and MPICH are read from a ``Mapping`` (``os.environ`` by default) so tests can pass
plain dicts. Standard library only: this module runs inside training processes.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence

from gpumon.client.protocol import NAME_PATTERN

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
