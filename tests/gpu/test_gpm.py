"""Hopper profiling through NVML GPM (sample pairs, ≥ 100 ms apart) in the simulator and the backend, and
DCGM taking over the same metric names when a host engine serves them."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pynvml
import pytest

from gpumon.gpu.collector import build_families
from gpumon.gpu.dcgm import DcgmSource
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim.catalog import MiB

FAKE_DCGM = Path(__file__).resolve().parent / "fake_dcgm"
FAKE_MODULES = ("pydcgm", "dcgm_agent", "dcgm_fields", "dcgm_structs", "dcgmvalue", "dcgm_field_helpers")


@pytest.fixture
def node(sims, clock):
    made = []

    def make(spec: str = "1xH100-SXM", **kw):
        sim = sims(spec, static=True, clock=clock)
        backend = NvmlBackend(sim, clock=clock, **kw)
        sampler = Sampler(backend, clock=clock, timeout=1.0)
        sampler.open()
        made.append(sampler)
        return sim, sampler

    yield make
    for s in made:
        s.stop()


def busy(sim, gpu: int, seconds: float, **shares: float) -> None:
    """Add ``seconds`` of activity at the given shares, and traffic, to a static simulated GPU."""
    s = sim.gpus[gpu].state
    for unit, share in shares.items():
        s.activity[unit] += share * seconds
    s.pcie_tx_bytes += 10 * MiB * seconds
    s.nvlink_rx = [v + 100 * MiB * seconds / len(s.nvlink_rx) for v in s.nvlink_rx]


def test_gpm_ratios_and_rates_are_interval_averages(node, clock) -> None:
    sim, sampler = node()
    first = sampler.sweep().gpus[0].reading
    assert first.profiling is None  # one sample: nothing to difference yet
    busy(sim, 0, 2.0, tensor=0.42, sm=0.9, dram=0.61, occupancy=0.5, fp32=0.05)
    clock.advance(2.0)
    p = sampler.sweep().gpus[0].reading.profiling
    assert p.source == "gpm"
    assert p.tensor_active_ratio == pytest.approx(0.42)
    assert p.sm_active_ratio == pytest.approx(0.9)
    assert p.dram_active_ratio == pytest.approx(0.61)
    assert p.sm_occupancy_ratio == pytest.approx(0.5)
    assert p.fp32_active_ratio == pytest.approx(0.05)
    assert p.fp64_active_ratio == 0.0
    assert p.pcie_transmit_bytes_per_second == pytest.approx(10 * MiB)
    assert p.nvlink_receive_bytes_per_second == pytest.approx(100 * MiB)
    assert sampler.sweep().gpus[0].capabilities["gpm"] == "supported"


def test_samples_closer_than_100_ms_reuse_the_last_difference(node, clock) -> None:
    sim, sampler = node()
    sampler.sweep()
    busy(sim, 0, 1.0, tensor=0.3)
    clock.advance(1.0)
    p1 = sampler.sweep().gpus[0].reading.profiling
    busy(sim, 0, 0.05, tensor=1.0)
    clock.advance(0.05)
    p2 = sampler.sweep().gpus[0].reading.profiling
    assert p2 is p1
    clock.advance(0.1)
    p3 = sampler.sweep().gpus[0].reading.profiling
    assert p3.tensor_active_ratio == pytest.approx(0.05 / 0.15)  # the whole time since the last sample


def test_ratios_are_clamped_to_one(node, clock) -> None:
    sim, sampler = node()
    sampler.sweep()
    busy(sim, 0, 1.0, sm=1.004)  # counters round a little past 100 %
    clock.advance(1.0)
    assert sampler.sweep().gpus[0].reading.profiling.sm_active_ratio == 1.0


def test_pre_hopper_gpus_have_no_gpm_and_no_profiling_series(node, clock) -> None:
    _, sampler = node("1xA100")
    sampler.sweep()
    clock.advance(1.0)
    snap = sampler.sweep()
    assert snap.gpus[0].reading.profiling is None
    assert snap.gpus[0].capabilities["gpm"] == "not_supported"
    names = {f.name for f in build_families(snap)}
    assert "gpumon_gpu_tensor_active_ratio" not in names


def test_profiling_off_makes_no_gpm_calls(node, clock) -> None:
    sim, sampler = node(gpm=False)
    sim.faults.add("error:*:nvmlGpmSampleAlloc=Unknown")  # would be counted if called
    sampler.sweep()
    clock.advance(1.0)
    snap = sampler.sweep()
    assert snap.gpus[0].reading.profiling is None and not snap.errors


def test_a_failed_sample_restarts_the_difference(node, clock) -> None:
    sim, sampler = node()
    sampler.sweep()
    fault = sim.faults.add("error:0:nvmlGpmSampleGet=Unknown")
    clock.advance(1.0)
    snap = sampler.sweep()
    assert snap.gpus[0].reading.profiling is None
    assert ("0", sim.gpus[0].uuid, "nvmlGpmSampleGet", "Unknown") in snap.errors
    sim.faults.remove(fault)
    clock.advance(1.0)
    assert sampler.sweep().gpus[0].reading.profiling is None  # a fresh first sample
    busy(sim, 0, 1.0, tensor=0.7)
    clock.advance(1.0)
    assert sampler.sweep().gpus[0].reading.profiling.tensor_active_ratio == pytest.approx(0.7)


def test_exposition_carries_profiling_series_and_their_source(node, clock) -> None:
    sim, sampler = node()
    sampler.sweep()
    busy(sim, 0, 1.0, tensor=0.25)
    clock.advance(1.0)
    snap = sampler.sweep()
    fams = {f.name: f for f in build_families(snap)}
    uuid = sim.gpus[0].uuid
    (tensor,) = fams["gpumon_gpu_tensor_active_ratio"].samples
    assert tensor.labels == {"gpu": "0", "uuid": uuid} and tensor.value == pytest.approx(0.25)
    assert "gpumon_gpu_profiling_info" not in fams  # where they come from: --collect profiling-detail
    fams = {f.name: f for f in build_families(snap, details=frozenset({"profiling-detail"}))}
    (info,) = fams["gpumon_gpu_profiling_info"].samples
    assert info.labels["source"] == "gpm"


def test_simulated_training_shows_tensor_heavy_compute(sims) -> None:
    sim = sims("1xH100-SXM", warmup=300.0)
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    a, b = sim.nvmlGpmSampleAlloc(), sim.nvmlGpmSampleAlloc()
    sim.nvmlGpmSampleGet(h, a)
    sim.gpus[0].dynamics.advance_to(sim.now() + 30.0)
    sim._t0 -= 30.0  # thirty simulated seconds later
    sim.nvmlGpmSampleGet(h, b)
    req = pynvml.c_nvmlGpmMetricsGet_t()
    req.version, req.numMetrics, req.sample1, req.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, 2, a, b
    req.metrics[0].metricId = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    req.metrics[1].metricId = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
    sim.nvmlGpmMetricsGet(req)
    tensor, dram = req.metrics[0].value, req.metrics[1].value
    assert req.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert 0.0 <= tensor <= 100.0 and 0.0 <= dram <= 100.0
    assert tensor + dram > 1.0  # the job that runs at t=300 s keeps the GPU busy
    sim.nvmlGpmSampleFree(a)
    sim.nvmlGpmSampleFree(b)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlGpmSampleFree(a)


def test_dcgm_supplies_the_same_metric_names_when_available(node, clock, monkeypatch) -> None:
    for name in FAKE_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(FAKE_DCGM))
    agent = importlib.import_module("dcgm_agent")
    sim, sampler = node()
    uuid = sim.gpus[0].uuid
    agent.engine.gpus.update({0: uuid})
    agent.engine.set_value(0, 1004, 0.37)  # PIPE_TENSOR_ACTIVE
    source = DcgmSource(bindings_path=str(FAKE_DCGM))
    assert source.open([uuid]), source.reason
    sampler.backend.profiler = source
    try:
        snap = sampler.sweep()
        p = snap.gpus[0].reading.profiling
        assert p.source == "dcgm" and p.tensor_active_ratio == pytest.approx(0.37)
        fams = {f.name: f for f in build_families(snap, details=frozenset({"profiling-detail"}))}
        assert fams["gpumon_gpu_profiling_info"].samples[0].labels["source"] == "dcgm"
    finally:
        sampler.backend.profiler = None
        source.close()
        for name in FAKE_MODULES:
            sys.modules.pop(name, None)
