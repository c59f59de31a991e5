"""The NVML backend against the pynvml-shaped simulator with fixed values: every quantity, unit conversion,
NOT_SUPPORTED, fallbacks, transient errors and lost GPUs."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import pynvml
import pytest
from support.helpers import set_state

from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sim import SimNvml
from gpumon.gpu.sim.catalog import MiB
from gpumon.gpu.types import BackendUnavailable, DeviceDown
from gpumon.metrics.registry import DETAILS

FAR = 1e12  # a deadline that never passes


def opened(sim: SimNvml, details: frozenset[str] = frozenset(DETAILS)) -> tuple[NvmlBackend, list]:
    backend = NvmlBackend(sim, details=details)
    return backend, backend.open()


def test_identity_and_static_facts(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    backend, (dev,) = opened(sim)
    info = dev.info
    assert info.index == 0 and info.uuid == sim.gpus[0].uuid
    assert info.name == "NVIDIA H100 80GB HBM3"
    assert info.pci_bus_id == "00000000:18:00.0"
    assert info.serial == sim.gpus[0].serial and info.board_part_number == "692-2G520-0200-000"
    assert info.persistence_mode is True
    assert info.sm_clock_max_hz == 1980e6 and info.memory_clock_max_hz == 2619e6
    assert (info.pcie_link_max_generation, info.pcie_link_max_width, info.nvlink_count) == (5, 16, 18)
    driver = backend.driver_info()
    assert (driver.driver_version, driver.cuda_driver_version) == ("570.133.20", "12.8")
    assert backend.name == "sim" and backend.device_count == 1


def test_every_quantity_in_base_units(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    set_state(sim)
    backend, (dev,) = opened(sim)
    result = backend.read(dev, FAR)
    r = result.reading
    assert result.errors == ()
    assert (r.utilization_ratio, r.memory_controller_utilization_ratio) == (0.97, 0.41)
    assert r.memory_total_bytes == 81559 * MiB
    assert r.memory_used_bytes == 60_000 * MiB
    assert r.memory_reserved_bytes == 534 * MiB
    assert r.memory_free_bytes == (81559 - 60_000 - 534) * MiB
    assert r.power_watts == pytest.approx(650.5)
    assert r.power_limit_watts == 700.0
    assert r.energy_joules == pytest.approx(123_456.789)
    assert (r.temperature_celsius, r.memory_temperature_celsius) == (71.0, 78.0)
    assert (r.sm_clock_hz, r.memory_clock_hz) == (1755e6, 2619e6)
    assert r.throttle_reasons == 0x24
    assert r.throttle_seconds == {
        "sw_power_cap": 2.5,
        "sync_boost": 0.0,
        "sw_thermal": 1.0,
        "hw_thermal": 0.0,
        "hw_power_brake": 0.0,
    }
    assert (r.pcie_transmit_bytes, r.pcie_receive_bytes) == (1_000_000, 9_000_000)
    assert r.pcie_transmit_bytes_per_second is None  # counters exist, so no 20 ms sampling
    assert (r.pcie_link_generation, r.pcie_link_width, r.pcie_replays) == (5, 16, 3)
    assert r.nvlink_transmit_bytes == sum(1024 * (i + 1) for i in range(18))
    assert r.nvlink_receive_bytes == sum(2048 * (i + 1) for i in range(18))
    assert len(r.nvlinks) == 18
    assert (r.nvlinks[2].transmit_bytes, r.nvlinks[2].receive_bytes, r.nvlinks[2].up) == (3072, 6144, True)
    assert r.nvlinks[17].up is False
    assert (r.ecc_corrected_errors, r.ecc_uncorrected_errors) == (4, 1)
    assert (r.ecc_corrected_errors_lifetime, r.ecc_uncorrected_errors_lifetime) == (40, 2)
    assert (r.remapped_rows_correctable, r.remapped_rows_uncorrectable) == (5, 1)
    assert (r.row_remap_pending, r.row_remap_failure) == (True, False)
    assert r.performance_state == 0
    assert r.fan_speed_ratio is None  # SXM boards have no fan
    assert dev.capabilities()["fan"] == "not_supported"


def test_not_supported_is_absent_logged_once_and_not_asked_again(sims, caplog) -> None:
    sim = sims("1xRTX-A6000", static=True)
    calls = []
    original = sim.nvmlDeviceGetTotalEccErrors
    sim.nvmlDeviceGetTotalEccErrors = lambda *a: (calls.append(a), original(*a))[1]  # type: ignore[method-assign]
    backend, (dev,) = opened(sim)
    # at debug: the sampler sums absences up at info, one line per group of GPUs (Sampler._announce_absent)
    with caplog.at_level(logging.DEBUG, logger="gpumon.nvml"):
        for _ in range(3):
            r = backend.read(dev, FAR).reading
    assert r.ecc_corrected_errors is None and r.remapped_rows_correctable is None
    assert r.memory_temperature_celsius is None and r.nvlink_transmit_bytes is None
    assert r.fan_speed_ratio is not None
    caps = dev.capabilities()
    assert caps["ecc"] == caps["ecc_lifetime"] == caps["remapped_rows"] == "not_supported"
    assert caps["memory_temperature"] == caps["nvlink"] == caps["pcie_bytes"] == "not_supported"
    assert caps["fan"] == "supported"
    assert len(calls) == 2  # the first read learns it (volatile + aggregate); later reads do not ask
    ecc_logs = [m for m in caplog.messages if "ecc is not supported" in m]
    assert len(ecc_logs) == 1


def test_no_permission_is_absent_and_marked(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    sim.faults.add("error:0:nvmlDeviceGetRemappedRows=NoPermission")
    backend, (dev,) = opened(sim)
    result = backend.read(dev, FAR)
    assert result.reading.remapped_rows_correctable is None
    assert result.errors == ()
    assert dev.capabilities()["remapped_rows"] == "no_permission"


def test_transient_errors_are_counted_and_the_next_read_recovers(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    fault = sim.faults.add("error:0:nvmlDeviceGetTemperature=Unknown")
    backend, (dev,) = opened(sim)
    result = backend.read(dev, FAR)
    assert result.reading.temperature_celsius is None
    assert [(e.op, e.kind) for e in result.errors] == [("nvmlDeviceGetTemperature", "Unknown")]
    assert dev.capabilities()["temperature"] == "error"
    sim.faults.remove(fault)
    result = backend.read(dev, FAR)
    assert result.reading.temperature_celsius is not None and result.errors == ()
    assert dev.capabilities()["temperature"] == "supported"


def test_a_field_that_fails_is_counted_without_losing_the_others(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    backend, (dev,) = opened(sim)
    original = sim._field

    def flaky(gpu, fid, scope):
        ret, vtype, value = original(gpu, fid, scope)
        return (pynvml.NVML_ERROR_UNKNOWN, vtype, 0) if fid == 82 else (ret, vtype, value)

    sim._field = flaky  # type: ignore[method-assign]
    result = backend.read(dev, FAR)
    assert result.reading.memory_temperature_celsius is None
    assert result.reading.pcie_transmit_bytes is not None
    assert [(e.op, e.kind) for e in result.errors] == [("nvmlDeviceGetFieldValues[82]", "Unknown")]


def test_memory_info_v1_fallback_on_drivers_without_v2(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    original = sim.nvmlDeviceGetMemoryInfo

    def old_driver(handle, version=None):
        if version:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return original(handle)

    sim.nvmlDeviceGetMemoryInfo = old_driver  # type: ignore[method-assign]
    backend, (dev,) = opened(sim)
    r = backend.read(dev, FAR).reading
    assert r.memory_total_bytes == 81559 * MiB and r.memory_used_bytes is not None
    assert r.memory_reserved_bytes is None
    caps = dev.capabilities()
    assert caps["memory"] == "supported" and caps["memory_reserved"] == "not_supported"


def test_throttle_reasons_fall_back_to_the_pre_535_name(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    sim.gpus[0].unsupported.add("nvmlDeviceGetCurrentClocksEventReasons")
    sim.gpus[0].state.reasons = 0x4
    backend, (dev,) = opened(sim)
    assert backend.read(dev, FAR).reading.throttle_reasons == 0x4
    assert dev.capabilities()["throttle_reasons"] == "supported"


def test_pcie_throughput_fallback_samples_tx_and_rx_side_by_side(sims) -> None:
    sim = sims("1xA100", static=True)  # A100: no cumulative PCIe byte counters
    set_state(sim)
    windows: dict[int, tuple[float, float]] = {}
    original = sim.nvmlDeviceGetPcieThroughput

    def timed(device, counter):
        start = time.monotonic()
        time.sleep(0.2)  # NVML samples a 20 ms window; longer here so overlap is unmistakable
        windows[counter] = (start, time.monotonic())
        return original(device, counter)

    sim.nvmlDeviceGetPcieThroughput = timed  # type: ignore[method-assign]
    backend, (dev,) = opened(sim)
    r = backend.read(dev, time.monotonic() + 5).reading
    assert r.pcie_transmit_bytes is None
    assert (r.pcie_transmit_bytes_per_second, r.pcie_receive_bytes_per_second) == (2_000_000, 7_000_000)
    (tx_start, tx_end), (rx_start, rx_end) = windows[0], windows[1]
    assert tx_start < rx_end and rx_start < tx_end, "tx and rx were sampled one after the other"
    assert dev.capabilities()["pcie_throughput"] == "supported"


def test_pcie_fallback_past_the_deadline_is_a_timeout_not_a_stall(sims) -> None:
    sim = sims("1xA100", static=True)
    backend, (dev,) = opened(sim)
    hang = sim.faults.add("hang:0:nvmlDeviceGetPcieThroughput")
    result = backend.read(dev, time.monotonic() + 0.2)
    assert result.reading.power_watts is not None
    assert ("nvmlDeviceGetPcieThroughput", "Timeout") in [(e.op, e.kind) for e in result.errors]
    stuck = dev.pcie_pending
    result = backend.read(dev, time.monotonic() + 0.2)  # still stuck: no second pair is started
    assert dev.pcie_pending is stuck
    assert ("nvmlDeviceGetPcieThroughput", "Timeout") in [(e.op, e.kind) for e in result.errors]
    sim.faults.remove(hang)


def test_a_pcie_call_hung_in_the_driver_does_not_block_exit() -> None:
    script = """
import time
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sim import SimNvml
sim = SimNvml("1xA100", static=True)
backend = NvmlBackend(sim)
(dev,) = backend.open()
sim.faults.add("hang:0:nvmlDeviceGetPcieThroughput")
backend.read(dev, time.monotonic() + 0.2)
backend.close()
"""
    done = subprocess.run([sys.executable, "-c", script], timeout=30, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_nvlink_total_is_summed_from_links_when_the_all_links_scope_is_missing(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    set_state(sim)
    original = sim._field

    def no_all_links(gpu, fid, scope):
        if scope == 0xFFFFFFFF:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, 3, 0
        return original(gpu, fid, scope)

    sim._field = no_all_links  # type: ignore[method-assign]
    backend, (dev,) = opened(sim)
    r = backend.read(dev, FAR).reading
    assert r.nvlink_transmit_bytes == sum(1024 * (i + 1) for i in range(18))
    assert dev.capabilities()["nvlink"] == "not_supported"


def test_nvlink_link_state_comes_with_the_batch_every_read(sims) -> None:
    """Field 165 per link carries each link's state in the one batched call: fresh every sweep, no call of
    its own."""
    sim = sims("1xH100-SXM", static=True)
    backend = NvmlBackend(sim, nvlink_state_every=3)
    (dev,) = backend.open()
    assert backend.read(dev, FAR).reading.nvlinks[5].up is True
    sim.gpus[0].state.link_up[5] = False
    sim.gpus[0].unsupported.add("nvmlDeviceGetNvLinkState")  # would make the call fail, were it made
    assert backend.read(dev, FAR).reading.nvlinks[5].up is False
    assert dev.capabilities()["nvlink_state"] == "supported"


def test_a_failed_state_read_is_counted_and_is_not_a_link_down(sims) -> None:
    """A transient error on a link's state (in the batch or by its own call) keeps the last known state, so
    gpumon_gpu_nvlink_links_up does not dip for one bad read; an error that persists makes the state unknown
    (no series) rather than the last known state forever."""
    for batch, tries in ((True, 10), (False, 2)):  # the batch every read (10 = every), the calls every read
        sim = sims("1xH100-SXM", static=True)
        if not batch:
            sim.gpus[0].unsupported.add(pynvml.NVML_FI_DEV_NVLINK_GET_STATE)
        backend = NvmlBackend(sim, nvlink_state_every=10 if batch else 1)
        (dev,) = backend.open()
        assert all(link.up for link in backend.read(dev, FAR).reading.nvlinks)
        sim.faults.add("error:0:nvmlDeviceGetNvLinkState=Unknown")
        sim.gpus[0].state.link_up[3] = False  # goes down while its state cannot be read
        for _ in range(tries - 1):
            result = backend.read(dev, FAR)
            assert all(link.up for link in result.reading.nvlinks), batch
            assert any(e.kind == "Unknown" for e in result.errors), batch
        assert all(link.up is None for link in backend.read(dev, FAR).reading.nvlinks), batch
        sim.faults.clear()
        assert [link.up for link in backend.read(dev, FAR).reading.nvlinks].count(False) == 1, batch


def test_an_inactive_link_in_the_batch_is_not_up_and_keeps_the_batch(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    real = sim._folded_field

    def one_inactive(gpu, fid, scope=0):
        if fid == pynvml.NVML_FI_DEV_NVLINK_GET_STATE and scope == 17:
            return pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0
        return real(gpu, fid, scope)

    sim._folded_field = one_inactive  # type: ignore[method-assign]
    backend = NvmlBackend(sim)
    (dev,) = backend.open()
    backend.read(dev, FAR)
    version = dev.support_version
    for _ in range(3):
        links = backend.read(dev, FAR).reading.nvlinks
        assert links[17].up is None and all(link.up for link in links[:17])
    assert dev.support_version == version, "the batch's capability flips every read"


def test_without_the_state_field_link_state_is_called_for_every_n_reads(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    sim.gpus[0].unsupported.add(pynvml.NVML_FI_DEV_NVLINK_GET_STATE)  # an older driver
    backend = NvmlBackend(sim, nvlink_state_every=3)
    (dev,) = backend.open()
    assert backend.read(dev, FAR).reading.nvlinks[5].up is True
    sim.gpus[0].state.link_up[5] = False
    assert backend.read(dev, FAR).reading.nvlinks[5].up is True  # cached
    backend.read(dev, FAR)
    assert backend.read(dev, FAR).reading.nvlinks[5].up is False


def test_a_lost_gpu_raises_device_down_and_reopens_after_it_returns(sims) -> None:
    sim = sims("2xH100-SXM", static=True)
    backend, (d0, d1) = opened(sim)
    lost = sim.faults.add("lost:1")
    with pytest.raises(DeviceDown) as err:
        backend.read(d1, FAR)
    assert err.value.kind == "GpuIsLost" and err.value.op == "nvmlDeviceGetFieldValues"  # a read's first call
    assert backend.read(d0, FAR).reading.power_watts is not None
    with pytest.raises(DeviceDown):
        backend.reopen(d1)
    sim.faults.remove(lost)
    backend.reopen(d1)
    assert backend.read(d1, FAR).reading.power_watts is not None


def test_reopen_reinitialises_nvml_after_a_driver_reload(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    backend, (dev,) = opened(sim)
    sim._init_count = 0  # what a driver reload looks like: NVML is no longer initialised
    with pytest.raises(DeviceDown) as err:
        backend.read(dev, FAR)
    assert err.value.kind == "Uninitialized"
    backend.reopen(dev)
    assert backend.read(dev, FAR).reading.power_watts is not None


def test_a_gpu_that_answers_nothing_is_down_not_up_with_no_values(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    backend, (dev,) = opened(sim)
    sim.faults.add("error:0:*=Unknown")
    with pytest.raises(DeviceDown) as err:
        backend.read(dev, FAR)
    assert err.value.kind == "Unknown"


def test_a_gpu_lost_at_start_is_not_identified_and_found_later(sims) -> None:
    sim = sims("3xH100-SXM", static=True)
    lost = sim.faults.add("lost:1")
    backend, devices = opened(sim)
    assert [d.info.index for d in devices] == [0, 2] and backend.device_count == 3
    sim.faults.remove(lost)
    found, failed = backend.discover({d.info.uuid for d in devices})
    assert [d.info.index for d in found] == [1] and failed == 0


def test_no_driver_is_backend_unavailable(sims) -> None:
    sim = sims("1xH100-SXM")
    sim.driver_loaded = False
    with pytest.raises(BackendUnavailable, match="Driver Not Loaded"):
        NvmlBackend(sim).open()


def test_the_real_pynvml_without_a_driver_is_backend_unavailable() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover (a GPU machine)
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here")
    with pytest.raises(BackendUnavailable, match="NVML could not start"):
        NvmlBackend().open()


def test_reads_from_many_threads_are_safe(sims) -> None:
    sim = sims("8xH100-SXM", seed=3)
    backend, devices = opened(sim)
    results: list = []
    threads = [threading.Thread(target=lambda d=d: results.append(backend.read(d, FAR))) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r.errors == () for r in results)


def test_a_transient_error_on_the_all_links_field_leaves_the_total_absent_not_lower(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    set_state(sim)
    backend, (dev,) = opened(sim)
    original = sim._field
    fail = [False]

    def flaky(gpu, fid, scope):
        if fail[0] and scope == 0xFFFFFFFF:
            return pynvml.NVML_ERROR_UNKNOWN, 3, 0
        return original(gpu, fid, scope)

    sim._field = flaky  # type: ignore[method-assign]
    totals = []
    for failing in (False, True, False):
        fail[0] = failing
        totals.append(backend.read(dev, FAR).reading.nvlink_transmit_bytes)
    assert totals[0] == totals[2] and totals[1] is None  # absent for one sample: never a backwards jump
    assert dev.capabilities()["nvlink"] == "supported"


def test_one_inactive_link_without_state_leaves_the_other_links_reported(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    original = sim.nvmlDeviceGetNvLinkState

    def partial(device, link):
        if link == 7:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return original(device, link)

    sim.nvmlDeviceGetNvLinkState = partial  # type: ignore[method-assign]
    sim.gpus[0].unsupported.add(pynvml.NVML_FI_DEV_NVLINK_GET_STATE)  # the call path, not the batch
    backend, (dev,) = opened(sim)
    links = backend.read(dev, FAR).reading.nvlinks
    assert links[7].up is None and links[6].up is True and links[8].up is True
    assert dev.capabilities()["nvlink_state"] == "supported"


# -- quantities folded into the one field-value batch (issue 18) -----------------------------------------

FOLDED_OPS = {
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetRemappedRows",
}


def _ops_of_a_read(sim: SimNvml) -> tuple[list[str], object]:
    from gpumon.gpu.capture import RecordingNvml

    recorder = RecordingNvml(sim)
    backend, (dev,) = opened(recorder)  # type: ignore[arg-type]
    backend.read(dev, FAR)
    first = len(recorder.calls)
    reading = backend.read(dev, FAR).reading
    return [c["op"] for c in recorder.calls[first:]], reading


def test_energy_ecc_replays_and_remapped_rows_come_from_the_batch(sims) -> None:
    """Ten calls of a sweep fold into nvmlDeviceGetFieldValues, which a real H200 answers with the same
    values (tests/gpu/capture/test_field_probe.py): the read makes none of them and its values are theirs."""
    sim = sims("1xH100-SXM", static=True)
    set_state(sim)
    s = sim.gpus[0].state
    s.ecc_volatile, s.ecc_aggregate, s.replays, s.remap = [3, 1], [7, 2], 5, (4, 1, 1, 0)
    ops, r = _ops_of_a_read(sim)
    assert not FOLDED_OPS & set(ops)
    assert ops.count("nvmlDeviceGetFieldValues") == 1
    assert r.energy_joules == pytest.approx(123_456.789)
    assert (r.ecc_corrected_errors, r.ecc_uncorrected_errors) == (3, 1)
    assert (r.ecc_corrected_errors_lifetime, r.ecc_uncorrected_errors_lifetime) == (7, 2)
    assert r.pcie_replays == 5
    assert (r.remapped_rows_correctable, r.remapped_rows_uncorrectable) == (4, 1)
    assert (r.row_remap_pending, r.row_remap_failure) == (True, False)
    assert (r.power_watts, r.power_limit_watts) == (650.5, 700.0)
    assert [link.up for link in r.nvlinks] == [True] * 17 + [False]


def test_a_driver_without_those_fields_is_read_with_their_own_calls(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    set_state(sim)
    sim._folded_field = lambda *_: (pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0)  # type: ignore[method-assign]
    ops, r = _ops_of_a_read(sim)
    # link state by its own call costs one call per link, so it is asked every 10th read (here the first)
    assert set(ops) >= FOLDED_OPS - {"nvmlDeviceGetNvLinkState"}
    assert r.energy_joules == pytest.approx(123_456.789) and r.pcie_replays is not None
    assert (r.power_watts, r.power_limit_watts) == (650.5, 700.0)
    assert [link.up for link in r.nvlinks] == [True] * 17 + [False]
    assert r.ecc_corrected_errors is not None and r.remapped_rows_correctable is not None


def test_a_failed_batch_falls_back_to_the_calls_for_that_read(sims) -> None:
    """One failed nvmlDeviceGetFieldValues must not take power, energy, ECC and the rest with it: for that
    read the folded quantities are asked with their own calls, and the batch is tried again next time."""
    sim = sims("1xH100-SXM", static=True)
    set_state(sim)
    backend, (dev,) = opened(sim)
    backend.read(dev, FAR)
    fault = sim.faults.add("error:0:nvmlDeviceGetFieldValues=Unknown")
    result = backend.read(dev, FAR)
    r = result.reading
    assert (r.power_watts, r.power_limit_watts) == (650.5, 700.0)
    assert r.energy_joules == pytest.approx(123_456.789) and r.ecc_corrected_errors == 4
    assert ("nvmlDeviceGetFieldValues", "Unknown") in [(e.op, e.kind) for e in result.errors]
    assert all(link.up is not None for link in r.nvlinks[:17])  # link states: the last known
    sim.faults.remove(fault)
    ops, _ = _ops_of_a_read(sim)
    assert ops.count("nvmlDeviceGetFieldValues") == 1 and not FOLDED_OPS & set(ops)


def test_folding_hides_nothing_a_board_lacks(sims) -> None:
    """The RTX A6000 has no ECC and no row remapping: neither the fields nor the calls answer, and doctor
    shows the quantities as not supported, with no trace of the batch's own bookkeeping."""
    sim = sims("1xRTX-A6000", static=True)
    backend, (dev,) = opened(sim)
    r = backend.read(dev, FAR).reading
    r = backend.read(dev, FAR).reading
    assert r.ecc_corrected_errors is None and r.remapped_rows_correctable is None
    caps = dev.capabilities()
    assert caps["ecc"] == caps["remapped_rows"] == "not_supported" and caps["energy"] == "supported"
    assert not any(q.startswith("fold:") for q in caps)
