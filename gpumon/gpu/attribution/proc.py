"""Who owns a host PID: its name, user, container, pod and Slurm job, read from ``/proc`` and cached.

NVML reports GPU processes by host PID. Everything here but the stat file is read once per process: a PID
is cached together with its start time (field 22 of ``/proc/<pid>/stat``), so a hit costs one small read
and a PID the kernel has handed to a new process is noticed and read again.

``proc_root`` lets the daemon run in a container with the host's ``/proc`` mounted elsewhere
(``/host/proc``). User names then come from the container's own passwd database (and NSS), which may not
know the host's users: those are reported by number.
"""

from __future__ import annotations

import errno
import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass

from gpumon.gpu.attribution.cgroup import CgroupOwner, parse_cgroup


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    pid: int
    name: str | None  # /proc/<pid>/comm: at most 15 bytes
    user: str | None  # the real uid's name, or the uid as a string when it has none
    container_id: str | None
    runtime: str | None
    pod_uid: str | None
    slurm_job_id: str | None  # from the cgroup path, else SLURM_JOB_ID in the environment


class _Vanished(Exception):
    """The process exited while we read it."""


# stat's comm may hold spaces and ')' itself; the fields after it start at field 3 (state)
_STARTTIME_AFTER_COMM = 22 - 3
_ENV_KEY = b"SLURM_JOB_ID="


class ProcessResolver:
    """Maps PIDs to owners. Not thread-safe: one sampler thread owns it."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._root = proc_root
        self._cache: dict[int, tuple[int, ProcessOwner]] = {}
        # a uid lookup may leave the machine (LDAP, sssd): once per uid is enough
        self._users: dict[int, str] = {}

    def resolve(self, pid: int) -> ProcessOwner | None:
        """The owner of ``pid``, or None when there is no such process (any more)."""
        try:
            stat = self._read(pid, "stat")
        except _Vanished:
            self._cache.pop(pid, None)
            return None
        if stat is None:
            # present but unreadable (hidepid=1, say): nothing to key a cache entry on, so read what we can
            self._cache.pop(pid, None)
            return self._read_owner_or_none(pid)
        start = start_time(stat)
        if start is None:
            self._cache.pop(pid, None)
            return None
        hit = self._cache.get(pid)
        if hit is not None and hit[0] == start:
            return hit[1]
        owner = self._read_owner_or_none(pid)
        # the PID may have died and been reused while we read: then what we read may mix two processes
        if owner is None or self._current_start(pid) != start:
            self._cache.pop(pid, None)
            return None
        self._cache[pid] = (start, owner)
        return owner

    def prune(self, live: Iterable[int]) -> None:
        """Forget every PID not in ``live``."""
        keep = set(live)
        for pid in [p for p in self._cache if p not in keep]:
            del self._cache[pid]

    def _read_owner(self, pid: int) -> ProcessOwner:
        comm = self._read(pid, "comm")
        status = self._read(pid, "status")
        cgroup_text = self._read(pid, "cgroup")
        cg = parse_cgroup(cgroup_text.decode(errors="replace")) if cgroup_text else CgroupOwner()
        job = cg.slurm_job_id
        if job is None:
            environ = self._read(pid, "environ")
            job = _slurm_job_from_environ(environ) if environ else None
        name = comm.decode(errors="replace").rstrip("\n") if comm else ""
        return ProcessOwner(
            pid=pid,
            name=name or None,
            user=self._user(status),
            container_id=cg.container_id,
            runtime=cg.runtime,
            pod_uid=cg.pod_uid,
            slurm_job_id=job,
        )

    def _read_owner_or_none(self, pid: int) -> ProcessOwner | None:
        try:
            return self._read_owner(pid)
        except _Vanished:
            return None

    def _current_start(self, pid: int) -> int | None:
        try:
            stat = self._read(pid, "stat")
        except _Vanished:
            return None
        return start_time(stat) if stat is not None else None

    def _read(self, pid: int, name: str) -> bytes | None:
        """The file's bytes; None if it cannot be read; _Vanished if the process is gone."""
        path = os.path.join(self._root, str(pid), name)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, ProcessLookupError) as e:
            # ESRCH, or the whole /proc/<pid> gone, is an exit; a single missing file is just missing
            if e.errno == errno.ESRCH or not os.path.isdir(os.path.join(self._root, str(pid))):
                raise _Vanished from e
            return None
        except OSError:
            # PermissionError above all: environ of another user's process without CAP_SYS_PTRACE
            return None

    def _user(self, status: bytes | None) -> str | None:
        uid = real_uid(status) if status else None
        if uid is None:
            return None
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name


def start_time(stat: bytes) -> int | None:
    try:
        return int(stat[stat.rindex(b")") + 1 :].split()[_STARTTIME_AFTER_COMM])
    except (ValueError, IndexError):
        return None


def running(stat: bytes) -> bool:
    """The process of this /proc/PID/stat has not died: a zombie (killed, not yet reaped by its parent)
    keeps its /proc entry, but its threads and its GPU context are gone."""
    try:
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")
    except ValueError:
        return False


def real_uid(status: bytes) -> int | None:
    for line in status.splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            try:
                return int(fields[1])  # real, effective, saved, filesystem
            except (IndexError, ValueError):
                return None
    return None


def _slurm_job_from_environ(environ: bytes) -> str | None:
    for entry in environ.split(b"\0"):
        if entry.startswith(_ENV_KEY):
            value = entry[len(_ENV_KEY) :].decode(errors="replace").strip()
            return value if value.isdigit() else None
    return None
