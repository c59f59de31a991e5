"""Which container, pod and Slurm job a process belongs to, read from the text of ``/proc/<pid>/cgroup``.

Pure parsing, no I/O. Each line is ``hierarchy-id:controllers:path``; cgroup v2 has the single line
``0::/path``, v1 one line per hierarchy, and hybrid systems both. The path is read one segment at a time:

* container runtimes name the leaf after the container: ``docker-<id>.scope``, ``cri-containerd-<id>.scope``,
  ``crio-<id>.scope``, ``libpod-<id>.scope`` (systemd driver), ``/docker/<id>``, ``crio-<id>`` or a bare
  ``<id>`` below a pod (cgroupfs driver);
* the kubelet names the pod's cgroup ``pod<uid>`` (cgroupfs) or ``kubepods[-<qos>]-pod<uid>.slice`` (systemd,
  where the dashes of the UID become underscores because ``-`` is systemd's hierarchy separator);
* Slurm puts a step at ``.../uid_<uid>/job_<id>/step_<s>`` (cgroup/v1) or
  ``.../[<node>_]slurmstepd.scope/job_<id>/step_<s>`` (cgroup/v2).

The innermost match wins, so a pod inside a kind or minikube node container reports the pod, not the node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    container_id: str | None = None  # the runtime's id, without prefix or ".scope"
    runtime: str | None = None  # "docker", "containerd", "cri-o", "podman"; None when the path doesn't say
    pod_uid: str | None = None  # with dashes, as the Kubernetes API spells it
    slurm_job_id: str | None = None


_NOBODY = CgroupOwner()

# 64 hex is what docker, containerd, cri-o and podman all generate; the UUID form appears below pods run
# by runtimes that name containers by UUID (seen in elastic/apm-agent-python's cgroup tests).
_HEX64 = r"[0-9a-f]{64}"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_ID = rf"(?:{_HEX64}|{_UUID})"
_POD_UID = r"(?:[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})"

# Monitors that share a name with their container but are not in it: conmon is a host process (cri-o may
# park it in the pod's slice, so the pod stays attributed, but it is no container).
_MONITOR = re.compile(rf"(?:crio|libpod)-conmon-{_ID}(?:\.scope)?", re.IGNORECASE)
_RUNTIME_UNIT = re.compile(
    rf"(?P<prefix>cri-containerd|crio|docker|libpod)-(?P<id>{_ID})(?:\.scope)?", re.IGNORECASE
)
_RUNTIME_OF_PREFIX = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker", "libpod": "podman"}
_BARE_HEX64 = re.compile(_HEX64, re.IGNORECASE)
_BARE_UUID = re.compile(_UUID, re.IGNORECASE)
# "kubelet-" and other prefixes appear when the kubelet runs with --cgroup-root, e.g. inside kind nodes
_SYSTEMD_POD = re.compile(rf"(?:.*-)?kubepods(?:-[a-z]+)?-pod(?P<uid>{_POD_UID})\.slice", re.IGNORECASE)
_CGROUPFS_POD = re.compile(rf"pod(?P<uid>{_POD_UID})", re.IGNORECASE)
_SLURM_JOB = re.compile(r"job_(?P<id>\d+)")
_SLURM_V1_PARENT = re.compile(r"uid_\d+")

# v1 hierarchies that every container runtime and Slurm set up; used only to break ties between lines
_PREFERRED_CONTROLLERS = frozenset(
    {"", "cpu", "cpuacct", "memory", "devices", "pids", "freezer", "name=systemd"}
)


def parse_cgroup(text: str) -> CgroupOwner:
    """The owner named by the most informative line of a ``/proc/<pid>/cgroup`` file; all None if none."""
    best = _NOBODY
    best_rank: tuple[int, ...] = (0, 0, 0, 0)
    slurm_job: str | None = None
    for line in text.splitlines() if isinstance(text, str) else ():
        # the path itself may contain ':' (see _split_colon_segment), so split only twice
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        controllers, path = parts[1], parts[2]
        owner = parse_path(path)
        slurm_job = slurm_job or owner.slurm_job_id
        preferred = int(any(c in _PREFERRED_CONTROLLERS for c in controllers.split(",")))
        rank = (owner.container_id is not None, owner.pod_uid is not None, owner.slurm_job_id is not None)
        full_rank = (*map(int, rank), preferred)
        if any(rank) and full_rank > best_rank:
            best, best_rank = owner, full_rank
    if slurm_job is not None and best.slurm_job_id is None:
        # Slurm v1 may move only some hierarchies (freezer, cpuset) into the job: borrow it from there
        best = CgroupOwner(best.container_id, best.runtime, best.pod_uid, slurm_job)
    return best


def parse_path(path: str) -> CgroupOwner:
    """The owner named by one cgroup path (the third field of a ``/proc/<pid>/cgroup`` line)."""
    container_id: str | None = None
    runtime: str | None = None
    pod_uid: str | None = None
    slurm_job: str | None = None
    under_kubepods = False
    previous = ""
    for segment in _segments(path):
        lower = segment.lower()
        if lower.startswith("kubepods") or "-kubepods" in lower:
            under_kubepods = True
        if m := _SYSTEMD_POD.fullmatch(segment):
            # everything found so far was the outer host or node container: start again inside the pod
            pod_uid, container_id, runtime = m["uid"].replace("_", "-"), None, None
        elif under_kubepods and (m := _CGROUPFS_POD.fullmatch(segment)):
            pod_uid, container_id, runtime = m["uid"], None, None
        elif _MONITOR.fullmatch(segment) or (segment == "conmon" and runtime == "podman"):
            container_id, runtime = None, None
        elif m := _RUNTIME_UNIT.fullmatch(segment):
            container_id, runtime = m["id"], _RUNTIME_OF_PREFIX[m["prefix"].lower()]
        elif _BARE_HEX64.fullmatch(segment) or (pod_uid is not None and _BARE_UUID.fullmatch(segment)):
            # /docker/<id> is docker's cgroupfs layout; below a pod docker and containerd look the same.
            # A UUID only counts below a pod: elsewhere it is as likely an ECS task or a systemd unit.
            container_id = segment
            runtime = "docker" if previous == "docker" else None
        elif (m := _SLURM_JOB.fullmatch(segment)) and (
            previous.endswith("slurmstepd.scope") or _SLURM_V1_PARENT.fullmatch(previous)
        ):
            slurm_job = m["id"]
        previous = segment
    return CgroupOwner(container_id, runtime, pod_uid, slurm_job)


def _segments(path: str) -> list[str]:
    out: list[str] = []
    for segment in path.split("/"):
        # "/../../system.slice/..." is what a process outside our cgroup namespace looks like from inside it
        if segment in ("", ".", ".."):
            continue
        out.extend(_split_colon_segment(segment))
    return out


def _split_colon_segment(segment: str) -> list[str]:
    """containerd with the systemd cgroup driver on but cgroupfs in use leaves its ``slice:prefix:id``
    cgroupsPath literally in the tree (open-telemetry/opentelemetry-java#4507); read it as slice + scope."""
    parts = segment.split(":")
    if len(parts) == 3 and all(parts):
        return [parts[0], f"{parts[1]}-{parts[2]}.scope"]
    return [segment]
