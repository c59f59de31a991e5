"""A capture round-trips: record the simulator through gpumon's NVML backend, write the file, read it back,
replay it through the same backend, and the exposition is the same series with the same values."""

from __future__ import annotations

import json
import time
from typing import Any

import pynvml
import pytest
from support.helpers import ManualClock, set_state

from gpumon.gpu.capture import Capture, RecordingNvml, ReplayNvml, dump, mask
from gpumon.gpu.capture.format import parse
from gpumon.gpu.collector import build_families
from gpumon.gpu.events import EventWatcher
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.snapshot import Snapshot

# what differs between any two runs, replayed or not: when and how long
VOLATILE = ("duration_seconds", "timestamp_seconds", "last_success", "last_sample")


def sample(nv: Any, sweeps: int) -> Snapshot:
    clock = ManualClock(1000.0)
    sampler = Sampler(NvmlBackend(nv, clock=clock), interval=5.0, timeout=5.0)
    sampler.open()
    try:
        for _ in range(sweeps):
            snap = sampler.sweep()
            clock.advance(1.0)  # GPM differences samples at least 100 ms apart
    finally:
        sampler.stop()
    return snap


def series(snap: Snapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in build_families(snap):
        for s in family.samples:
            if any(v in s.name for v in VOLATILE) or s.name.startswith("gpumon_host_"):  # this machine
                continue
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "backend"))
            out[(s.name, labels)] = s.value
    return out


@pytest.mark.parametrize("spec", ["2xH100-SXM", "1xA100/mig=3g.40gb+2g.20gb", "1xL40S"])
def test_simulator_capture_replays_to_the_same_exposition(sims, spec: str) -> None:
    sim = sims(spec, static=True)
    set_state(sim)
    recorder = RecordingNvml(sim)
    recorded = sample(recorder, sweeps=4)
    capture = parse(json.loads(dump(Capture({"source": "sim", "sweeps": 4}, recorder.calls))))
    replayed = sample(ReplayNvml(capture), sweeps=4)
    assert replayed.backend == "replay" and recorded.backend == "sim"
    want, got = series(recorded), series(replayed)
    assert got == want
    assert len(want) > 40 * len(sim.gpus)  # the comparison covered the node, not an empty exposition
    if "mig=" in spec:
        assert sum(1 for name, _ in want if name == "gpumon_mig_memory_used_bytes") == 2


def test_masked_capture_replays_the_same_values_under_stand_in_ids(sims) -> None:
    sim = sims("2xH100-SXM", static=True)
    recorder = RecordingNvml(sim)
    recorded = sample(recorder, sweeps=3)
    masked = mask(Capture({}, recorder.calls))
    text = dump(masked)
    for gpu in sim.gpus:
        assert gpu.uuid not in text and gpu.serial not in text
    replayed = sample(ReplayNvml(parse(json.loads(text))), sweeps=3)
    uuids = [g.info.uuid for g in replayed.gpus]
    assert uuids == ["GPU-00000001-0000-4000-8000-000000000001", "GPU-00000002-0000-4000-8000-000000000002"]
    assert [g.info.serial for g in replayed.gpus] != [g.info.serial for g in recorded.gpus]
    for a, b in zip(recorded.gpus, replayed.gpus, strict=True):
        assert a.reading is not None and b.reading is not None
        assert (a.reading.power_watts, a.reading.energy_joules) == (
            b.reading.power_watts,
            b.reading.energy_joules,
        )


def _watch(nv: Any, until: Any, timeout: float = 5.0) -> EventWatcher:
    sampler = Sampler(NvmlBackend(nv), interval=1.0)
    sampler.open()
    watcher = EventWatcher(nv, sampler.devices, wait_ms=50)
    watcher.start()
    deadline = time.monotonic() + timeout
    while not until(watcher.view()) and time.monotonic() < deadline:
        time.sleep(0.02)
    watcher.stop()
    sampler.stop()
    return watcher


def test_recorded_xids_are_delivered_once_on_replay(sims) -> None:
    sim = sims("1xH100-SXM", static=True)
    recorder = RecordingNvml(sim)

    def inject_when_watching(view: Any) -> bool:
        if view.running and not getattr(inject_when_watching, "done", False):
            sim.inject_event(0, pynvml.nvmlEventTypeXidCriticalError, 79)
            inject_when_watching.done = True  # type: ignore[attr-defined]
        return sum(view.xids.values()) == 1

    _watch(recorder, inject_when_watching)
    capture = parse(json.loads(dump(Capture({}, recorder.calls))))
    delivered = [c for c in capture.calls if c["op"] == "nvmlEventSetWait_v2" and "value" in c]
    assert len(delivered) == 1
    event = delivered[0]["value"]  # the simulator's event object; a real driver's c_nvmlEventData_t
    assert (event.get("fields") or event["object"])["device"] == {"ref": "gpu0"}
    watcher = _watch(ReplayNvml(capture), lambda v: sum(v.xids.values()) >= 1)
    time.sleep(0.2)  # more waits, all timing out: the XID is not delivered twice
    assert dict(watcher.view().xids) == {(sim.gpus[0].uuid, 79): 1}
