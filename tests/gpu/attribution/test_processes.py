"""Per-process GPU use and its owners, end to end through the simulated NVML, a /proc tree and a pod
allocation: no stale series for processes that ended, owners on the GPU series only when asked for."""

from __future__ import annotations

import pynvml
import pytest

from gpumon.gpu.attribution.kubelet import PodOwner
from gpumon.gpu.attribution.owners import Attributor
from gpumon.gpu.attribution.proc import ProcessResolver
from gpumon.gpu.collector import build_families
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim.catalog import MiB
from gpumon.gpu.sim.device import SimProcess
from gpumon.gpu.sim.processes import job_processes

POD_CGROUP = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0"
    ".slice/cri-containerd-" + "ab" * 32 + ".scope\n"
)
SLURM_CGROUP = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_1\n"


@pytest.fixture
def node(sims, clock):
    made = []

    def make(spec: str = "2xH100-SXM", pods=None, details=frozenset({"process-utilization"})):
        sim = sims(spec, static=True, clock=clock)
        allocation = pods if pods is not None else {}
        sampler = Sampler(
            NvmlBackend(sim, clock=clock, details=details),
            clock=clock,
            timeout=1.0,
            attributor=Attributor(ProcessResolver(sim.proc_root()), lambda: allocation),
        )
        sampler.open()
        made.append((sim, sampler))
        return sim, sampler

    yield make
    for sim, sampler in made:
        sampler.stop()
        sim.remove_proc_root()


def series(snap, name: str, **kw) -> dict[tuple, float]:
    fams = {f.name: f for f in build_families(snap, **kw)}
    fam = fams.get(name)
    return {} if fam is None else {tuple(sorted(s.labels.items())): s.value for s in fam.samples}


def test_processes_with_memory_utilisation_and_owners(node, clock) -> None:
    sim, sampler = node(pods=None)
    sim.gpus[0].processes = [SimProcess(4321, 30_000 * MiB, 0.8, 0.3, name="torchrun", cgroup=POD_CGROUP)]
    sim.gpus[1].processes = [
        SimProcess(5000, 10 * MiB, 0.0, 0.0, name="worker", cgroup=SLURM_CGROUP),
        SimProcess(
            5001,
            20 * MiB,
            0.5,
            0.1,
            name="worker",
            cgroup="0::/user.slice\n",
            environ={"SLURM_JOB_ID": "4242"},
        ),
    ]
    clock.advance(1.0)
    snap = sampler.sweep()
    g0 = snap.gpus[0].reading.processes
    assert [(p.pid, p.used_memory_bytes) for p in g0] == [(4321, 30_000 * MiB)]
    assert g0[0].sm_utilization_ratio == pytest.approx(0.8) and g0[0].memory_utilization_ratio == 0.3
    assert g0[0].last_seen is not None and g0[0].gpu_instance_id is None
    u0, u1 = sim.gpus[0].uuid, sim.gpus[1].uuid
    owned = snap.owners[u0].processes[4321]
    assert (owned.name, owned.container_id, owned.pod_uid) == (
        "torchrun",
        "ab" * 32,
        "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
    )
    assert owned.pod == ""  # no kubelet allocation: the pod is known by UID only
    assert {p.slurm_job_id for p in snap.owners[u1].processes.values()} == {"4242"}
    assert snap.owners[u1].owner == ("", "", "", "4242")
    assert series(snap, "gpumon_gpu_processes") == {
        (("gpu", "0"), ("uuid", u0)): 1.0,
        (("gpu", "1"), ("uuid", u1)): 2.0,
    }
    mem = series(snap, "gpumon_process_memory_used_bytes")
    assert mem[(("gpu", "0"), ("pid", "4321"), ("uuid", u0))] == 30_000 * MiB


def test_process_utilisation_is_opt_in_and_costs_no_call_when_off(node, clock) -> None:
    """By default a process has its memory and owner; its SM and memory use (one more NVML call per GPU, three
    more series per process) come with --collect process-utilization."""
    sim, sampler = node(details=frozenset())
    sim.gpus[0].processes = [SimProcess(4321, 30_000 * MiB, 0.8, 0.3, name="torchrun")]
    clock.advance(1.0)
    calls: list[tuple] = []
    real = sim.nvmlDeviceGetProcessUtilization
    sim.nvmlDeviceGetProcessUtilization = lambda *a: calls.append(a) or real(*a)
    snap = sampler.sweep()
    (p,) = snap.gpus[0].reading.processes
    assert (p.used_memory_bytes, p.sm_utilization_ratio, p.last_seen) == (30_000 * MiB, None, None)
    assert calls == []
    assert series(snap, "gpumon_process_sm_utilization_ratio") == {}
    on = series(snap, "gpumon_process_sm_utilization_ratio", details=frozenset({"process-utilization"}))
    assert on == {}  # switched on, but this backend did not read it: absent, never 0


def test_a_process_that_exits_leaves_no_series_behind(node, clock) -> None:
    sim, sampler = node()
    sim.gpus[0].processes = [SimProcess(111, MiB), SimProcess(222, 2 * MiB)]
    snap = sampler.sweep()
    assert {dict(k)["pid"] for k in series(snap, "gpumon_process_info")} == {"111", "222"}
    sim.gpus[0].processes = [SimProcess(222, 2 * MiB)]
    clock.advance(1.0)
    snap = sampler.sweep()
    for name in ("gpumon_process_info", "gpumon_process_memory_used_bytes"):
        assert {dict(k)["pid"] for k in series(snap, name)} == {"222"}, name
    sim.gpus[0].processes = []
    clock.advance(1.0)
    snap = sampler.sweep()
    assert series(snap, "gpumon_process_info") == {}
    assert series(snap, "gpumon_gpu_processes")[(("gpu", "0"), ("uuid", sim.gpus[0].uuid))] == 0


def test_a_reused_pid_is_attributed_afresh(node, clock) -> None:
    sim, sampler = node()
    sim.gpus[0].processes = [SimProcess(777, MiB, cgroup=SLURM_CGROUP, start_ticks=100)]
    assert sampler.sweep().owners[sim.gpus[0].uuid].processes[777].slurm_job_id == "4242"
    sim._proc_written.discard(777)  # the kernel hands pid 777 to a new process
    sim.gpus[0].processes = [SimProcess(777, MiB, cgroup=POD_CGROUP, start_ticks=900)]
    clock.advance(1.0)
    owned = sampler.sweep().owners[sim.gpus[0].uuid].processes[777]
    assert owned.slurm_job_id == "" and owned.container_id == "ab" * 32


def test_the_kubelet_allocation_names_the_pod_and_owns_the_gpu(node, clock) -> None:
    pods: dict[str, PodOwner] = {}
    sim, sampler = node(pods=pods)
    pods[sim.gpus[0].uuid] = PodOwner("research", "llama-70b-0", "trainer")
    sim.gpus[0].processes = [SimProcess(4321, MiB, cgroup=POD_CGROUP)]
    snap = sampler.sweep()
    owned = snap.owners[sim.gpus[0].uuid].processes[4321]
    assert (owned.namespace, owned.pod, owned.container) == ("research", "llama-70b-0", "trainer")
    assert series(snap, "gpumon_gpu_owner_info") == {
        (
            ("container", "trainer"),
            ("gpu", "0"),
            ("namespace", "research"),
            ("pod", "llama-70b-0"),
            ("slurm_job_id", ""),
            ("uuid", sim.gpus[0].uuid),
        ): 1.0
    }


def test_owner_labels_are_added_to_gpu_series_only_when_enabled(node, clock) -> None:
    pods: dict[str, PodOwner] = {}
    sim, sampler = node(pods=pods)
    pods[sim.gpus[0].uuid] = PodOwner("research", "llama-70b-0", "trainer")
    snap = sampler.sweep()
    plain = series(snap, "gpumon_gpu_power_watts")
    labelled = series(snap, "gpumon_gpu_power_watts", owner_labels=True)
    assert all(len(k) == 2 for k in plain)
    assert len(labelled) == len(plain)  # one series per GPU either way
    by_gpu = {dict(k)["gpu"]: dict(k) for k in labelled}
    assert by_gpu["0"]["pod"] == "llama-70b-0" and by_gpu["0"]["namespace"] == "research"
    assert by_gpu["1"]["pod"] == "" and by_gpu["1"]["slurm_job_id"] == ""
    # a new owner replaces the labels: still one series per GPU
    pods[sim.gpus[0].uuid] = PodOwner("research", "llama-70b-1", "trainer")
    clock.advance(1.0)
    again = series(sampler.sweep(), "gpumon_gpu_power_watts", owner_labels=True)
    assert len(again) == len(plain)
    assert {dict(k)["pod"] for k in again} == {"llama-70b-1", ""}


def test_garbage_pids_from_the_driver_are_dropped(node) -> None:
    sim, sampler = node()
    sim.gpus[0].processes = [SimProcess(0, MiB), SimProcess(2**31, MiB), SimProcess(55, MiB)]
    assert [p.pid for p in sampler.sweep().gpus[0].reading.processes] == [55]


def test_idle_processes_have_no_utilisation_and_not_found_is_not_an_error(node, clock) -> None:
    sim, sampler = node()
    sim.gpus[0].processes = [SimProcess(55, MiB, 0.4)]
    sampler.sweep()
    sim.faults.add("error:0:nvmlDeviceGetProcessUtilization=NotFound")  # no samples since last time
    clock.advance(1.0)
    snap = sampler.sweep()
    (p,) = snap.gpus[0].reading.processes
    assert p.sm_utilization_ratio is None and p.used_memory_bytes == MiB
    assert not snap.errors
    assert snap.gpus[0].capabilities["process_utilization"] == "supported"


def test_unsupported_process_listing_is_absent_not_zero(node) -> None:
    sim, sampler = node()
    sim.faults.add("unsupported:1:nvmlDeviceGetComputeRunningProcesses")
    snap = sampler.sweep()
    assert snap.gpus[1].reading.processes is None
    assert (("gpu", "1"), ("uuid", sim.gpus[1].uuid)) not in series(snap, "gpumon_gpu_processes")
    assert snap.gpus[1].capabilities["processes"] == "not_supported"


def test_simulated_jobs_alternate_between_pods_and_slurm(sims) -> None:
    sim = sims("1xH100-SXM", warmup=300.0)
    sim.nvmlInit()
    (proc,) = sim.nvmlDeviceGetComputeRunningProcesses(sim.nvmlDeviceGetHandleByIndex(0))
    assert proc.pid >= 20000 and proc.usedGpuMemory > 0
    assert proc.gpuInstanceId == 0xFFFFFFFF
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetComputeRunningProcesses(None)
    # the node's first four jobs, each seen a minute into it: pod, Slurm, pod, Slurm
    gpu = sim.gpus[0]
    kinds: dict[int, str] = {}
    t = 0.0
    while len(kinds) < 4:
        t += 60.0
        job = gpu.dynamics.workload.job_at(t)
        if job is None or job.number in kinds:
            continue
        (p,) = job_processes(gpu, sim.seed, t)
        slurm = "slurmstepd.scope/job_" in p.cgroup and p.environ.get("SLURM_JOB_ID") == str(
            1000 + job.number
        )
        pod = p.pod is not None and "/kubepods.slice/" in p.cgroup
        assert slurm != pod, p.cgroup
        kinds[job.number] = "pod" if pod else "slurm"
    assert kinds == {0: "pod", 1: "slurm", 2: "pod", 3: "slurm"}


def test_kubelet_health_is_a_collector_status(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    healthy = [True]
    sampler = Sampler(
        NvmlBackend(sim),
        timeout=1.0,
        attributor=Attributor(ProcessResolver(sim.proc_root()), dict, "", lambda: healthy[0]),
    )
    sampler.open()
    try:
        status = {c.name: c.success for c in sampler.sweep().collectors}
        assert status["kubelet"] is True and status["attribution"] is True
        healthy[0] = False
        assert {c.name: c.success for c in sampler.sweep().collectors}["kubelet"] is False
    finally:
        sampler.stop()
        sim.remove_proc_root()
