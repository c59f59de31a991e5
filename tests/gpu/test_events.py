"""The NVML event watcher against the simulated NVML: XIDs counted per code, events per type, registration
that survives re-initialisation and lost GPUs, and an XID visible in the next sweep."""

from __future__ import annotations

import pynvml
import pytest
from support.poll import poll

from gpumon.gpu.collector import build_families
from gpumon.gpu.events import EventsView, EventWatcher
from gpumon.gpu.sim.faults import Fault, FaultSpecError


@pytest.fixture
def watched(sims, samplers):
    made: list[EventWatcher] = []

    def make(spec: str = "2xH100-SXM", faults: tuple[str, ...] = (), **kw):
        sim = sims(spec, static=True)
        for fault in faults:
            sim.faults.add(fault)
        sampler = samplers(sim)
        watcher = EventWatcher(sampler.backend.nv, sampler.devices, wait_ms=50, **kw)
        sampler.events = watcher
        watcher.start()
        made.append(watcher)
        poll(lambda: watcher.view().running, 5, "the event watcher to run", every=0.01)
        return sim, sampler, watcher

    yield make
    for w in made:
        w.stop()


def samples(snap, name: str) -> dict[tuple, float]:
    fams = {f.name: f for f in build_families(snap)}
    fam = fams.get(name.removesuffix("_total"))
    return {} if fam is None else {tuple(sorted(s.labels.items())): s.value for s in fam.samples}


def test_xid_is_counted_per_gpu_and_code_with_its_time(watched) -> None:
    sim, _, watcher = watched(clock=lambda: 1234.5)
    uuid1 = sim.gpus[1].uuid
    assert sim.inject_xid(1, 79) == 1
    sim.inject_xid(1, 79)
    sim.inject_xid(1, 13)
    poll(lambda: sum(watcher.view().xids.values()) == 3, 5, "three XIDs to be counted", every=0.01)
    view = watcher.view()
    assert view.xids == {(uuid1, 79): 2, (uuid1, 13): 1}
    assert view.xid_last[(uuid1, 79)] == 1234.5
    assert view.counts[(uuid1, "xid")] == 3
    assert [e.xid for e in view.recent] == [79, 79, 13]


def test_registered_event_types_start_at_zero(watched) -> None:
    sim, sampler, watcher = watched()
    view = watcher.view()
    uuid0 = sim.gpus[0].uuid
    assert {"xid", "ecc_single_bit", "ecc_double_bit"} <= set(view.registered[uuid0])
    assert view.counts[(uuid0, "xid")] == 0
    snap = sampler.sweep()
    assert snap.gpus[0].capabilities["events"] == "supported"
    events = samples(snap, "gpumon_gpu_events_total")
    assert events[(("event", "xid"), ("gpu", "0"), ("uuid", uuid0))] == 0


def test_an_injected_xid_shows_in_the_next_sweep(watched) -> None:
    sim, sampler, watcher = watched()
    uuid0 = sim.gpus[0].uuid
    before = sampler.sweep()
    assert samples(before, "gpumon_gpu_xid_errors_total") == {}
    sim.inject_xid(0, 48)
    poll(lambda: watcher.view().xids.get((uuid0, 48)) == 1, 5, "XID 48 to be counted", every=0.01)
    after = sampler.sweep()
    assert samples(after, "gpumon_gpu_xid_errors_total") == {
        (("gpu", "0"), ("uuid", uuid0), ("xid", "48")): 1.0
    }
    info = samples(after, "gpumon_xid_info")
    ((labels, value),) = info.items()
    assert dict(labels)["xid"] == "48" and dict(labels)["severity"] == "critical" and value == 1
    ecc = samples(after, "gpumon_gpu_events_total")
    assert ecc[(("event", "xid"), ("gpu", "0"), ("uuid", uuid0))] == 1


def test_other_event_types_are_counted_under_their_own_label(watched) -> None:
    sim, _, watcher = watched()
    uuid0 = sim.gpus[0].uuid
    sim.inject_event(0, pynvml.nvmlEventTypeDoubleBitEccError)
    poll(
        lambda: watcher.view().counts.get((uuid0, "ecc_double_bit")) == 1,
        5,
        "the double-bit ECC event to be counted",
        every=0.01,
    )
    assert watcher.view().xids == {}


def test_mig_instance_ids_are_kept_and_invalid_ids_dropped(watched) -> None:
    sim, _, watcher = watched()
    sim.inject_event(0, pynvml.nvmlEventTypeXidCriticalError, 31, gi=2, ci=0)
    sim.inject_xid(0, 43)
    poll(lambda: len(watcher.view().recent) == 2, 5, "two recent events", every=0.01)
    first, second = watcher.view().recent
    assert (first.gpu_instance_id, first.compute_instance_id) == (2, 0)
    assert (second.gpu_instance_id, second.compute_instance_id) == (None, None)


def test_a_gpu_without_event_support_is_skipped_and_marked(watched) -> None:
    sim, sampler, watcher = watched(faults=("unsupported:1:nvmlDeviceGetSupportedEventTypes",))
    view = watcher.view()
    assert view.support[sim.gpus[1].uuid] == "not_supported"
    assert sim.gpus[1].uuid not in view.registered and sim.gpus[0].uuid in view.registered
    assert view.running
    assert sampler.sweep().gpus[1].capabilities["events"] == "not_supported"
    assert sim.inject_xid(1, 79) == 0  # nobody listens on GPU 1


def test_the_watcher_survives_nvml_reinitialisation(watched) -> None:
    sim, sampler, watcher = watched()
    uuid0 = sim.gpus[0].uuid
    fault = sim.faults.add("uninitialized:*:nvmlEventSetWait_v2")
    poll(lambda: not watcher.view().running, 5, "the event watcher to stop", every=0.01)
    assert "Uninitialized" in watcher.view().reason
    sim.faults.remove(fault)
    poll(
        lambda: watcher.view().running, 5.0, "the event watcher to run again", every=0.01
    )  # first backoff is 1 s
    sim.inject_xid(0, 94)
    poll(lambda: watcher.view().xids.get((uuid0, 94)) == 1, 5, "XID 94 to be counted", every=0.01)
    assert watcher.view().failures >= 1
    assert watcher.view().errors[("nvmlEventSetWait_v2", "Uninitialized")] >= 1
    errors = samples(sampler.sweep(), "gpumon_errors_total")
    assert errors[(("error", "Uninitialized"), ("gpu", ""), ("op", "nvmlEventSetWait_v2"), ("uuid", ""))] >= 1


def test_a_gpu_found_late_is_registered_too(watched) -> None:
    sim, sampler, watcher = watched(faults=("lost:1",))  # GPU 1 unidentifiable at start
    assert sampler.gpu_count() == 1
    uuid1 = sim.gpus[1].uuid
    sim.faults.clear()
    found, failed = sampler.backend.discover({sim.gpus[0].uuid})
    assert [d.info.uuid for d in found] == [uuid1] and failed == 0
    sampler._add(found)  # what rediscovery does
    poll(lambda: uuid1 in watcher.view().registered, 5, "GPU 1 to be registered", every=0.01)
    sim.inject_xid(1, 79)
    poll(lambda: watcher.view().xids.get((uuid1, 79)) == 1, 5, "XID 79 on GPU 1 to be counted", every=0.01)


def test_an_event_from_a_lost_gpu_is_still_counted(watched) -> None:
    sim, _, watcher = watched()
    sim.faults.add("lost:0:nvmlDeviceGetUUID")
    sim.inject_xid(0, 79)
    poll(
        lambda: watcher.view().xids.get(("", 79)) == 1,
        5,
        "XID 79 from the lost GPU to be counted",
        every=0.01,
    )


def test_scheduled_xid_fault_fires_once(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    sim.faults.add("xid:0:79@0")
    sim.nvmlInit()
    es = sim.nvmlEventSetCreate()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    data = sim.nvmlEventSetWait_v2(es, 1000)
    assert (data.eventType, data.eventData, data.device) == (pynvml.nvmlEventTypeXidCriticalError, 79, h)
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait_v2(es, 50)
    sim.nvmlEventSetFree(es)


def test_registering_unsupported_types_is_not_supported_like_nvml(sims) -> None:
    sim = sims("1xRTX-A6000", static=True)  # no ECC: no ECC events
    sim.nvmlInit()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    es = sim.nvmlEventSetCreate()
    assert not sim.nvmlDeviceGetSupportedEventTypes(h) & pynvml.nvmlEventTypeDoubleBitEccError
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeDoubleBitEccError, es)


@pytest.mark.parametrize("bad", ["xid:*:79", "xid:1", "xid:1:nvmlDeviceGetUUID", "xid:1:79=3", "error:1:79"])
def test_bad_xid_fault_specs_are_refused(bad: str) -> None:
    with pytest.raises(FaultSpecError):
        Fault.parse(bad)


def test_an_empty_view_exports_nothing() -> None:
    assert EventsView().counts == {}
