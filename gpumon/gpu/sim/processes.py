"""Compute processes for the simulator, with a /proc tree to attribute them by.

Each simulated job runs one process per GPU. Even-numbered jobs are Kubernetes pods (a systemd-driver
kubepods cgroup with a containerd container id, and an entry in ``pod_owners()``, the simulator's stand-in
for the kubelet pod-resources API); odd-numbered jobs are Slurm jobs (a slurmstepd cgroup v2 path). The
processes' stat, comm, status, cgroup and environ files are written under ``proc_root()``, so gpumon's
real /proc resolver attributes them exactly as it would on a host; as in /proc, a process's directory goes
when it ends (when no GPU lists it any more), so a long simulation leaves no trail.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pynvml

from gpumon.gpu.attribution.kubelet import PodOwner
from gpumon.gpu.sim.device import SimGpu, SimProcess
from gpumon.gpu.sim.dynamics import _mix


def job_processes(gpu: SimGpu, seed: int, now: float) -> list[SimProcess]:
    """The processes a training-dynamics GPU runs at simulated time ``now``."""
    workload = getattr(gpu.dynamics, "workload", None)
    if workload is None:
        return []
    job = workload.job_at(now)
    if job is None:
        return []
    s = gpu.state
    pid = 20000 + job.number * 64 + gpu.index
    proc = SimProcess(pid, int(s.memory_used), s.util, s.mem_util, start_ticks=int(job.start * 100) + 1)
    if job.number % 2 == 0:
        uid = f"{_mix(seed, job.number, 1):016x}{_mix(seed, job.number, 2):016x}"
        pod_uid = f"{uid[:8]}-{uid[8:12]}-{uid[12:16]}-{uid[16:20]}-{uid[20:32]}"
        container = f"{_mix(seed, job.number, 3):016x}" * 4
        proc.cgroup = (
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-{container}.scope\n"
        )
        # a --sim-job's pod is named after the job and the rank; the node's own jobs are anonymous
        spec = getattr(workload, "spec", None)
        proc.pod = (
            f"{spec.name.lower()}-worker-{spec.rank(gpu.index)}"[:63]
            if spec is not None
            else f"llm-pretrain-{job.number}-worker-0"
        )
    else:
        slurm_job = 1000 + job.number
        proc.cgroup = f"0::/system.slice/slurmstepd.scope/job_{slurm_job}/step_0/user/task_{gpu.index}\n"
        proc.environ = {"SLURM_JOB_ID": str(slurm_job), "SLURM_PROCID": str(gpu.index)}
    return [proc]


class SimProcesses:
    """The process half of SimNvml."""

    gpus: list[SimGpu]
    seed: int

    if TYPE_CHECKING:

        def _gpu(self, handle: Any, op: str) -> SimGpu: ...
        def now(self) -> float: ...
        def wall_elapsed(self) -> float: ...

    def _processes_init(self) -> None:
        self._proc_lock = threading.Lock()
        self._proc_root: str | None = None
        self._proc_written: set[int] = set()
        self._proc_listed: dict[int, frozenset[int]] = {}  # GPU index → pids it listed last
        self._proc_epoch = time.time()

    def processes(self, gpu: SimGpu) -> list[SimProcess]:
        """A test's fixed list (``gpu.processes``), the real SDK processes driving the GPU, or the running
        job's processes."""
        fixed = getattr(gpu, "processes", None)
        if fixed is not None:
            return list(fixed)
        driven = getattr(getattr(gpu.dynamics, "workload", None), "processes", None)
        procs = driven(gpu.state.util, gpu.state.mem_util) if driven is not None else None
        return procs if procs is not None else job_processes(gpu, self.seed, self.now())

    def nvmlDeviceGetComputeRunningProcesses(self, handle: SimGpu) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        procs = self.processes(gpu)
        self._write_proc(gpu.index, procs)
        out = []
        for p in procs:  # what nvmlStructToFriendlyObject makes of c_nvmlProcessInfo_v3_t
            info = pynvml.nvmlFriendlyObject(
                {
                    "pid": p.pid,
                    "usedGpuMemory": p.used_memory,
                    "gpuInstanceId": p.gpu_instance,
                    "computeInstanceId": p.compute_instance,
                }
            )
            out.append(info)
        return out

    def nvmlDeviceGetProcessUtilization(self, handle: SimGpu, timeStamp: int) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetProcessUtilization")
        # NVML stamps samples in unix µs: wall time, even when simulated time runs faster (--sim-speed)
        stamp = int((self._proc_epoch + self.wall_elapsed()) * 1e6)
        samples = []
        for p in self.processes(gpu):
            if stamp <= timeStamp:
                continue
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp = p.pid, stamp
            sample.smUtil, sample.memUtil = round(p.sm_util * 100), round(p.mem_util * 100)
            samples.append(sample)
        if not samples:  # NVML's answer when nothing ran since timeStamp
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return samples

    def pod_owners(self) -> MappingProxyType[str, PodOwner]:
        """GPU UUID → pod, as the kubelet would report for the simulated Kubernetes jobs."""
        owners: dict[str, PodOwner] = {}
        for gpu in self.gpus:
            for p in self.processes(gpu):
                if p.pod is not None:
                    owners[gpu.uuid] = PodOwner("ml-train", p.pod, "trainer")
        return MappingProxyType(owners)

    def proc_root(self) -> str:
        """A directory laid out like /proc for the simulated processes (made on first use)."""
        with self._proc_lock:
            if self._proc_root is None:
                self._proc_root = tempfile.mkdtemp(prefix="gpumon-sim-proc-")
            return self._proc_root

    def remove_proc_root(self) -> None:
        with self._proc_lock:
            if self._proc_root is not None:
                shutil.rmtree(self._proc_root, ignore_errors=True)
                self._proc_root = None
                self._proc_written.clear()
                self._proc_listed.clear()

    def _write_proc(self, gpu: int, procs: list[SimProcess]) -> None:
        if self._proc_root is None:
            return
        with self._proc_lock:
            listed = frozenset(p.pid for p in procs)
            before = self._proc_listed.get(gpu, frozenset())
            self._proc_listed[gpu] = listed
            still = set().union(*self._proc_listed.values())
            for pid in before - still:  # ended: no GPU lists it any more
                shutil.rmtree(os.path.join(self._proc_root, str(pid)), ignore_errors=True)
                self._proc_written.discard(pid)
            for p in procs:
                if p.pid in self._proc_written:
                    continue
                d = os.path.join(self._proc_root, str(p.pid))
                os.makedirs(d, exist_ok=True)
                ids = f"{p.pid} {p.pid}"
                stat = f"{p.pid} ({p.name}) S 1 {ids} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {p.start_ticks}"
                files = {
                    "stat": stat + " 0 0\n",
                    "comm": p.name + "\n",
                    "status": f"Name:\t{p.name}\nUid:\t{p.uid}\t{p.uid}\t{p.uid}\t{p.uid}\n",
                    "cgroup": p.cgroup,
                    "environ": "".join(f"{k}={v}\0" for k, v in p.environ.items()),
                }
                for name, text in files.items():
                    with open(os.path.join(d, name), "w") as fh:
                        fh.write(text)
                self._proc_written.add(p.pid)
