"""MIG through the simulated NVML: instances enumerated with their UUIDs and profiles, per-instance memory and
GPM, whole-GPU utilisation absent (NVML does not give it under MIG), and the simulation spec syntax."""

from __future__ import annotations

import pynvml
import pytest

from gpumon.gpu.collector import build_families
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim.catalog import MiB, SpecError, parse_spec
from gpumon.gpu.sim.mig_layout import place


@pytest.fixture
def mig_node(sims, clock):
    made = []

    def make(spec: str = "1xH100-SXM/mig=3g.40gb+2g.20gb+1g.10gb,1xH100-SXM"):
        sim = sims(spec, static=True, clock=clock)
        sampler = Sampler(NvmlBackend(sim, clock=clock), clock=clock, timeout=1.0)
        sampler.open()
        made.append(sampler)
        return sim, sampler

    yield make
    for s in made:
        s.stop()


def test_instances_are_enumerated_with_uuid_profile_and_memory(mig_node) -> None:
    sim, sampler = mig_node()
    sim.gpus[0].state.memory_used = 30_000 * MiB
    snap = sampler.sweep()
    migs = snap.gpus[0].reading.mig
    assert [(m.gpu_instance_id, m.compute_instance_id, m.profile) for m in migs] == [
        (2, 0, "3g.40gb"),
        (3, 0, "2g.20gb"),
        (9, 0, "1g.10gb"),
    ]
    assert all(m.uuid.startswith("MIG-") for m in migs) and len({m.uuid for m in migs}) == 3
    assert migs[0].memory_total_bytes == 40448 * MiB
    # the load runs in the first instance of the layout; the others idle, as in the captures
    assert [m.memory_used_bytes for m in migs] == [30_000 * MiB, 0, 0]
    assert snap.gpus[1].reading.mig is None  # MIG off on the other GPU


def test_gpu_instance_ids_and_sizes_are_the_h100_captures() -> None:
    """nvidia_gpu_exporter's H100 MIG capture (driver 590.48.01): 3g.40gb, 2g.20gb and two 1g.10gb are GPU
    instances 2, 3, 9 and 10 (ids follow the placement), of 40448, 20096, 9984 and 9984 MiB (the simulator
    numbered them 1..4 and gave N x 1000 MiB)."""
    (model,) = parse_spec("1xH100-SXM/mig=3g.40gb+2g.20gb+1g.10gb+1g.10gb")
    slots = place(model.key, model.memory_mib, model.mig_layout)
    assert [(s.gpu_instance_id, s.profile, s.memory_mib) for s in slots] == [
        (2, "3g.40gb", 40448),
        (3, "2g.20gb", 20096),
        (9, "1g.10gb", 9984),
        (10, "1g.10gb", 9984),
    ]
    assert [s.busy for s in slots] == [True, False, False, False]
    whole = place("H100-SXM", model.memory_mib, ("7g.80gb",))
    assert [(s.gpu_instance_id, s.compute_instance_id) for s in whole] == [(0, 0)]
    two = place("H100-SXM", model.memory_mib, ("3g.40gb", "3g.40gb"))
    assert [s.gpu_instance_id for s in two] == [1, 2]


def test_compute_instances_sharing_a_gpu_instance_are_counted_once(sims, clock) -> None:
    """nvidia_gpu_exporter's H200 MIG capture: two "1c.3g.71gb" compute instances (0 and 1) in GPU instance
    2, each reporting the GPU instance's whole 71424 MiB, beside 2g.35gb (33280 MiB) and 1g.18gb (16384 MiB).
    gpumon reports memory and GPM once per GPU instance, so a sum() over them counts no byte twice."""
    sim = sims("1xH200/mig=1c.3g.71gb+1c.3g.71gb+2g.35gb+1g.18gb", static=True, clock=clock)
    sim.gpus[0].state.memory_used = 50_000 * MiB
    sampler = Sampler(NvmlBackend(sim, clock=clock), clock=clock, timeout=1.0)
    sampler.open()
    try:
        sampler.sweep()
        clock.advance(1.0)
        snap = sampler.sweep()
    finally:
        sampler.stop()
    migs = snap.gpus[0].reading.mig
    assert [(m.gpu_instance_id, m.compute_instance_id, m.profile) for m in migs] == [
        (2, 0, "1c.3g.71gb"),
        (2, 1, "1c.3g.71gb"),
        (3, 0, "2g.35gb"),
        (9, 0, "1g.18gb"),
    ]
    assert migs[0].memory_used_bytes == migs[1].memory_used_bytes == 50_000 * MiB  # as NVML: both see it all
    assert [m.memory_total_bytes for m in migs] == [71424 * MiB, 71424 * MiB, 33280 * MiB, 16384 * MiB]
    fams = {f.name: f for f in build_families(snap)}
    assert len(fams["gpumon_mig_info"].samples) == 4
    used = fams["gpumon_mig_memory_used_bytes"].samples
    assert [s.labels["gpu_instance"] for s in used] == ["2", "3", "9"]
    assert sum(s.value for s in used) == 50_000 * MiB
    assert (
        sum(s.value for s in fams["gpumon_mig_memory_total_bytes"].samples) == (71424 + 33280 + 16384) * MiB
    )
    assert len(fams["gpumon_mig_sm_active_ratio"].samples) == 3


def test_whole_gpu_utilisation_is_absent_under_mig_and_present_without(mig_node) -> None:
    _, sampler = mig_node()
    snap = sampler.sweep()
    assert snap.gpus[0].reading.utilization_ratio is None
    assert snap.gpus[0].capabilities["utilization"] == "not_supported"
    assert snap.gpus[1].reading.utilization_ratio is not None
    assert snap.gpus[0].reading.remapped_rows_correctable is None


def test_nvlink_is_not_supported_on_a_gpu_in_mig_mode(mig_node) -> None:
    """Real NVML answers NOT_SUPPORTED to NVLink queries on a GPU in MIG mode (nvidia_gpu_exporter's H100 MIG
    capture, driver 590.48.01); the simulator answered 18 links up and terabytes of traffic."""
    sim, sampler = mig_node()
    mig, plain = sim.gpus[0], sim.gpus[1]
    with pytest.raises(pynvml.NVMLError) as err:
        sim.nvmlDeviceGetNvLinkState(mig, 0)
    assert err.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert sim.nvmlDeviceGetNvLinkState(plain, 0) == pynvml.NVML_FEATURE_ENABLED
    fids = [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)]
    assert [v.nvmlReturn for v in sim.nvmlDeviceGetFieldValues(mig, fids)] == [
        pynvml.NVML_ERROR_NOT_SUPPORTED
    ] * 2
    assert [v.nvmlReturn for v in sim.nvmlDeviceGetFieldValues(plain, fids)] == [pynvml.NVML_SUCCESS] * 2
    snap = sampler.sweep()
    uuids = {s.labels["uuid"] for f in build_families(snap) if "nvlink" in f.name for s in f.samples}
    assert uuids == {snap.gpus[1].info.uuid}  # no NVLink series for the GPU in MIG mode


def test_per_instance_gpm_follows_the_instance(mig_node, clock) -> None:
    sim, sampler = mig_node()
    sampler.sweep()
    sim.gpus[0].state.activity["tensor"] += 0.5
    sim.gpus[0].state.pcie_rx_bytes += 70 * MiB
    clock.advance(1.0)
    snap = sampler.sweep()
    by_gi = {m.gpu_instance_id: m.profiling for m in snap.gpus[0].reading.mig}
    assert by_gi[2].tensor_active_ratio == pytest.approx(0.5)
    # the busy instance (the layout's first) has the traffic; the idle ones none
    assert by_gi[2].pcie_receive_bytes_per_second == pytest.approx(70 * MiB)
    assert by_gi[3].pcie_receive_bytes_per_second == by_gi[3].tensor_active_ratio == 0.0
    fams = {f.name: f for f in build_families(snap)}
    tensor = {s.labels["gpu_instance"]: s.value for s in fams["gpumon_mig_tensor_active_ratio"].samples}
    assert tensor["2"] == pytest.approx(0.5) and set(tensor) == {"2", "3", "9"}
    info = fams["gpumon_mig_info"].samples
    assert {s.labels["profile"] for s in info} == {"3g.40gb", "2g.20gb", "1g.10gb"}
    assert {s.labels["gpu"] for s in info} == {"0"}


def test_the_layout_is_re_enumerated_now_and_then(mig_node, clock) -> None:
    sim, sampler = mig_node("1xH100-SXM/mig=3g.40gb+3g.40gb")
    assert len(sampler.sweep().gpus[0].reading.mig) == 2
    sim.gpus[0].mig.pop()  # an operator destroyed an instance
    for _ in range(10):
        clock.advance(1.0)
        snap = sampler.sweep()
    assert len(snap.gpus[0].reading.mig) == 1


def test_empty_slots_are_not_errors(mig_node) -> None:
    _, sampler = mig_node()
    assert not sampler.sweep().errors


def test_mig_handles_answer_like_nvml(sims) -> None:
    sim = sims("1xA100/mig=7g.80gb", static=True)
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetMigMode(h) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    m = sim.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert sim.nvmlDeviceIsMigDeviceHandle(m) and not sim.nvmlDeviceIsMigDeviceHandle(h)
    assert sim.nvmlDeviceGetName(m).endswith(" MIG 7g.80gb")
    assert sim.nvmlDeviceGetGpuInstanceId(m) == 0  # the whole GPU as one instance: GI 0
    assert sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m) is h
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetGpuInstanceId(h)  # a full GPU is not a MIG device


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("1xL4/mig=1g.10gb", "has no MIG"),
        ("1xH100-SXM/mig=4g.40gb+4g.40gb", "do not fit"),
        ("1xH100-SXM/mig=4g.40gb+3g.40gb+1g.10gb", "do not fit"),
        ("1xH100-SXM/mig=7g.80gb+1g.10gb", "do not fit"),
        ("1xH100-SXM/mig=big", "not like 3g.40gb"),
        (
            "1xH100-SXM/mig=1g.5gb",
            "no MIG profile 1g.5gb; it has 1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        ("1xH200/mig=3g.40gb", "no MIG profile 3g.40gb"),
        ("1xH100-SXM/mig=3c.3g.40gb", "takes 1 to 2 slices"),
        ("1xH100-SXM/mig=1c.1g.10gb", "write 1g.10gb"),
    ],
)
def test_bad_mig_specs_are_refused(spec: str, error: str) -> None:
    with pytest.raises(SpecError, match=error):
        parse_spec(spec)
