"""Joins what NVML says runs on each GPU with who owns it: process → container, pod, Slurm job, user, and
GPU → the pod the kubelet allocated it to, or the one Slurm job all its processes belong to."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

from gpumon.gpu.attribution.kubelet import PodOwner
from gpumon.gpu.attribution.ownership import GpuOwnership, OwnedProcess
from gpumon.gpu.attribution.proc import ProcessResolver

if TYPE_CHECKING:
    from gpumon.gpu.snapshot import GpuStatus


class Attributor:
    """Runs on the sampling thread after each sweep; /proc reads are cached per process lifetime."""

    def __init__(
        self,
        resolver: ProcessResolver,
        pods: Callable[[], Mapping[str, PodOwner]] | None = None,
        note: str = "",
        pods_healthy: Callable[[], bool] | None = None,
    ) -> None:
        self.resolver = resolver
        self.pods = pods  # the kubelet's GPU → pod allocation (a cheap reference read), if any
        self.note = note  # where owners come from, for gpumon doctor
        self.pods_healthy = pods_healthy  # did the last kubelet List succeed (gpumon_collector_success)

    def attribute(self, gpus: Sequence[GpuStatus]) -> Mapping[str, GpuOwnership]:
        allocation = self.pods() if self.pods is not None else {}
        out: dict[str, GpuOwnership] = {}
        live: set[int] = set()
        for st in gpus:
            readings = st.reading.processes if st.reading is not None else None
            pod = allocation.get(st.info.uuid)
            procs: dict[int, OwnedProcess] = {}
            for r in readings or ():
                live.add(r.pid)
                procs[r.pid] = self._process(r.pid, pod)
            out[st.info.uuid] = GpuOwnership(MappingProxyType(procs), _gpu_owner(pod, procs.values()))
        self.resolver.prune(live)
        return MappingProxyType(out)

    def _process(self, pid: int, pod: PodOwner | None) -> OwnedProcess:
        o = self.resolver.resolve(pid)
        if o is None:  # gone between NVML's answer and now, or in another PID namespace
            return OwnedProcess(pid)
        # the kubelet names the pod the GPU was given to; a process in some other container gets no name
        in_pod = pod is not None and (o.pod_uid is not None or o.container_id is not None)
        names = (pod.namespace, pod.pod, pod.container) if in_pod and pod is not None else ("", "", "")
        return OwnedProcess(
            pid,
            o.name or "",
            o.user or "",
            o.container_id or "",
            o.pod_uid or "",
            *names,
            o.slurm_job_id or "",
        )


def _gpu_owner(pod: PodOwner | None, procs: Iterable[OwnedProcess]) -> tuple[str, str, str, str] | None:
    jobs = {p.slurm_job_id for p in procs if p.slurm_job_id}
    job = jobs.pop() if len(jobs) == 1 else ""  # several jobs on one GPU: no single owner to name
    if pod is None and not job:
        return None
    return (pod.namespace, pod.pod, pod.container, job) if pod else ("", "", "", job)
