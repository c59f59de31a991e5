"""Every capture in tests/fixtures/captures/ replayed through the production NVML backend: the values are
the capture's, what the board did not support is absent, the real exposition passes promtool, and doctor
reports the captured node's capabilities.

The H200 captures were recorded on a real NVIDIA H200 (driver 580.159.04, CUDA 13.0, nvidia-ml-py
13.610.43) with bench/device/capture_real_gpu.sh: h200-idle.json idle, h200-load.json while
bench/device/gpu_load.py ran bf16 matrix products on it.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from support.helpers import ROOT, require_tool, run_gpumon, start_daemon

from gpumon.gpu.capture import ReplayNvml, load
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.snapshot import GpuStatus
from gpumon.metrics.registry import DETAILS

CAPTURES = sorted((ROOT / "tests" / "fixtures" / "captures").glob("*.json"))
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


def last(capture_path: Path, op: str, *args: Any) -> Any:
    """The last answer the capture recorded for ``op`` on gpu0 with these further arguments."""
    answers = [
        c
        for c in load(str(capture_path)).calls
        if c["op"] == op and c["args"][1:] == list(args) and "value" in c
    ]
    return answers[-1]["value"]


def last_field(capture_path: Path, field_id: int) -> tuple[int, Any]:
    out = None
    for c in load(str(capture_path)).calls:
        if c["op"] == "nvmlDeviceGetFieldValues" and "value" in c:
            for item in c["value"]["items"]:
                f = item["fields"]
                if f["fieldId"] == field_id and f["scopeId"] == 0:
                    out = (f["nvmlReturn"], f["value"])
    assert out is not None
    return out


def field_answers(capture_path: Path, field_id: int) -> list[Any]:
    """Every value the batch answered for this field (whole GPU), in order."""
    out = []
    for c in load(str(capture_path)).calls:
        if c["op"] == "nvmlDeviceGetFieldValues" and "value" in c:
            for item in c["value"]["items"]:
                f = item["fields"]
                if f["fieldId"] == field_id and f["scopeId"] == 0 and f["nvmlReturn"] == 0:
                    out.append(f["value"])
    return out


def folded(capture_path: Path, field_id: int, op: str) -> Any:
    """The last answer for a quantity the batch can carry: its field where the capture's batch answered it
    (captures of today's sampler, which asks the batch first), else its own call's (older captures)."""
    answers = field_answers(capture_path, field_id)
    return answers[-1] if answers else last(capture_path, op)


def replayed(path: Path, sweeps: int = 8) -> GpuStatus:
    # every opt-in detail: the captures hold the calls behind each, and each is checked against them
    sampler = Sampler(NvmlBackend(ReplayNvml(load(str(path))), details=frozenset(DETAILS)), interval=1.0)
    sampler.open()
    try:
        for _ in range(sweeps):  # past the capture's own sweeps: every answer is the last one recorded
            snap = sampler.sweep()
            time.sleep(0.11)  # GPM differences samples at least 100 ms apart
    finally:
        sampler.stop()
    assert snap.backend == "replay"
    return snap.gpus[0]


@pytest.fixture(scope="module", params=CAPTURES, ids=[p.stem for p in CAPTURES])
def capture(request: pytest.FixtureRequest) -> tuple[Path, GpuStatus]:
    return request.param, replayed(request.param)


def test_there_are_captures_of_real_boards() -> None:
    sources = {load(str(p)).meta["source"] for p in CAPTURES}
    assert "nvml" in sources


def test_replayed_values_are_the_last_recorded_answers(capture) -> None:
    path, gpu = capture
    r = gpu.reading
    assert r is not None
    assert r.power_watts == pytest.approx(folded(path, 185, "nvmlDeviceGetPowerUsage") / 1000)
    assert r.energy_joules == pytest.approx(folded(path, 191, "nvmlDeviceGetTotalEnergyConsumption") / 1000)
    assert r.temperature_celsius == last(path, "nvmlDeviceGetTemperature", pynvml.NVML_TEMPERATURE_GPU)
    assert r.sm_clock_hz == last(path, "nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM) * 1e6
    assert r.memory_clock_hz == last(path, "nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_MEM) * 1e6
    util = last(path, "nvmlDeviceGetUtilizationRates")["fields"]
    assert r.utilization_ratio == util["gpu"] / 100
    mem = [v for v in _values(path, "nvmlDeviceGetMemoryInfo") if v["struct"] == "c_nvmlMemory_v2_t"][-1]
    assert r.memory_used_bytes == mem["fields"]["used"]
    assert r.memory_reserved_bytes == mem["fields"]["reserved"]
    ret, hbm = last_field(path, 82)
    assert r.memory_temperature_celsius == (hbm if ret == 0 else None)
    ret, power_cap_ns = last_field(path, 74)
    assert r.throttle_seconds.get("sw_power_cap") == (power_cap_ns * 1e-9 if ret == 0 else None)
    assert gpu.info.name == last(path, "nvmlDeviceGetName")


def _values(path: Path, op: str) -> list[Any]:
    return [c["value"] for c in load(str(path)).calls if c["op"] == op and "value" in c]


def test_what_the_board_does_not_support_is_absent(capture) -> None:
    path, gpu = capture
    caps = gpu.capabilities
    calls = load(str(path)).calls
    unsupported = {c["op"] for c in calls if c.get("error") == "NotSupported"}
    if "nvmlDeviceGetFanSpeed" in unsupported:
        assert caps["fan"] == "not_supported" and gpu.reading.fan_speed_ratio is None
    if last_field(path, 91)[0] == NOT_SUPPORTED:  # no NVLink count: no links, no NVLink series
        assert gpu.info.nvlink_count == 0 and gpu.reading.nvlinks == ()
        assert gpu.reading.nvlink_transmit_bytes is None


def test_h200_under_load_reads_as_the_board_reported() -> None:
    """Hand-checked against the capture and nvidia-smi on the same board a few seconds apart (665 W,
    1515-1620 MHz, 61-66 °C GPU / 52 °C HBM, 72-80 % utilisation, clocks-event reason 0x4 sw_power_cap)."""
    gpu = replayed(ROOT / "tests" / "fixtures" / "captures" / "h200-load.json", sweeps=7)
    r = gpu.reading
    assert gpu.info.name == "NVIDIA H200" and gpu.info.memory_clock_max_hz == 3201e6
    assert r.memory_total_bytes == 150754820096  # 143771 MiB, as nvidia-smi says
    assert (r.power_watts, r.power_limit_watts) == (pytest.approx(647.084), 700.0)
    assert (r.temperature_celsius, r.memory_temperature_celsius) == (65, 51)  # HBM cooler than the die
    assert (r.sm_clock_hz, r.memory_clock_hz) == (1635e6, 3201e6)
    assert r.throttle_reasons == 0x4  # sw_power_cap
    assert r.throttle_seconds["sw_power_cap"] == pytest.approx(23.730291616)
    assert (r.pcie_link_generation, r.pcie_link_width, r.pcie_replays) == (5, 16, 1)
    assert r.profiling is not None and r.profiling.sm_active_ratio == pytest.approx(0.7393, abs=1e-4)
    (proc,) = r.processes
    assert (proc.pid, proc.used_memory_bytes, proc.sm_utilization_ratio) == (472, 18230542336, 0.79)
    assert r.mig is None and r.ecc_corrected_errors == 0


def test_todays_sampler_on_a_real_h200() -> None:
    """h200-load-2.json was recorded by today's sampler (bench/device/verify_real_gpu.sh, same board and
    load as h200-load.json): power, its limit and energy come from the batch, the board answers per-process
    utilisation, and it answers the encoder call although it has no encoders."""
    path = ROOT / "tests" / "fixtures" / "captures" / "h200-load-2.json"
    ops = {c["op"] for c in load(str(path)).calls}
    assert not ops & {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit"}
    assert "nvmlDeviceGetTotalEnergyConsumption" not in ops
    assert field_answers(path, 185) and set(field_answers(path, 190)) == {700000}
    assert last(path, "nvmlDeviceGetEncoderUtilization") == [0, 100000]  # always 0: no NVENC on an H200
    gpu = replayed(path)
    r = gpu.reading
    assert r.power_limit_watts == 700.0 and r.power_watts > 600
    assert gpu.capabilities["encoder_utilization"] == "not_supported" and r.encoder_utilization_ratio is None
    assert r.decoder_utilization_ratio == 0.0
    (proc,) = r.processes
    assert (proc.sm_utilization_ratio, proc.memory_utilization_ratio) == (0.8, 0.2)


@pytest.mark.slow
@pytest.mark.parametrize("path", CAPTURES, ids=[p.stem for p in CAPTURES])
def test_replayed_daemon_exposition_passes_promtool(path: Path) -> None:
    promtool = require_tool("promtool")
    d = start_daemon("--replay", str(path))
    try:
        body = d.get("/metrics").text
    finally:
        d.stop()
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr
    assert 'backend="replay"' in body
    recorded = {v / 1000 for v in [*_values(path, "nvmlDeviceGetPowerUsage"), *field_answers(path, 185)]}
    (line,) = [ln for ln in body.splitlines() if ln.startswith("gpumon_gpu_power_watts{")]
    assert 'uuid="GPU-00000001-0000-4000-8000-000000000001"' in line  # the masked stand-in
    assert float(line.rsplit(" ", 1)[1]) in recorded
    assert "gpumon_gpu_fan_speed_ratio{" not in body and "gpumon_gpu_nvlink" not in body
    assert any("REPLAYED" in line for line in d.log)


@pytest.mark.parametrize("path", CAPTURES, ids=[p.stem for p in CAPTURES])
def test_doctor_reports_the_captured_node(path: Path) -> None:
    done = run_gpumon("doctor", "--replay", str(path), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["backend"] == "replay" and report["replayed"] and not report["simulated"]
    assert report["driver"]["driver_version"] == last(path, "nvmlSystemGetDriverVersion")
    (gpu,) = report["gpus"]
    caps = gpu["capabilities"]
    assert caps["fan"] == "not_supported" and caps["nvlink"] == "not_supported"
    assert caps["gpm"] == caps["throttle_time:sw_power_cap"] == caps["memory_temperature"] == "supported"
    assert report["device_nodes"] == {}  # this machine's /dev says nothing about the captured node
    assert any("replayed from a capture" in a for a in report["advice"])
