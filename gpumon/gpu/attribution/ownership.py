"""Who owns a GPU and each process on it: the values attribution produces and every snapshot carries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

OWNER_LABELS = ("namespace", "pod", "container", "slurm_job_id")


@dataclass(frozen=True, slots=True)
class OwnedProcess:
    pid: int
    name: str = ""
    user: str = ""
    container_id: str = ""
    pod_uid: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""
    slurm_job_id: str = ""


@dataclass(frozen=True, slots=True)
class GpuOwnership:
    processes: Mapping[int, OwnedProcess]
    owner: tuple[str, str, str, str] | None  # OWNER_LABELS values; None: nobody identifiable owns it
