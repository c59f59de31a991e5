"""The series budget: by default an 8 x H100 SXM node exposes at most 50 series per GPU plus 60 for the node
(issue 18); debug detail is opt-in by name (``--collect``), and each name adds what docs/metrics.md says."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import ROOT, run_gpumon

from gpumon import metrics as M
from gpumon.config.resolve import resolve
from gpumon.gpu.collector import RareCounters, build_families
from gpumon.gpu.events import EventWatcher
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml
from gpumon.gpu.snapshot import Snapshot
from gpumon.net.rdma import RdmaPort, read_ports
from gpumon.zerofirst import SERVED_FIRST

PER_GPU, PER_NODE, GPUS = 50, 60, 8
PER_PORT = 10  # an RDMA port's series by default, at most (docs/exposition.md, "Network")
PER_INTERFACE = 11  # an Ethernet interface's: 5 and its 6 error counters once they rose


def series_by_gpu(text: str) -> Counter[str]:
    """Series per value of the ``gpu`` label ("" for the node's own)."""
    out: Counter[str] = Counter()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.endswith("_created"):
                out[s.labels.get("gpu", "")] += 1
    return out


def steady(d, timeout: float = 10.0) -> str:
    """The exposition once the event watcher has registered and GPM has a pair of samples (both come a
    moment after the first sweep), so the count is of what a scrape sees in steady state."""
    end = time.monotonic() + timeout
    while True:
        text = d.get("/metrics").text
        if "gpumon_gpu_events_total" in text and "gpumon_gpu_tensor_active_ratio" in text:
            return text
        assert time.monotonic() < end, "no steady exposition"
        time.sleep(0.1)


@pytest.mark.slow
def test_the_default_exposition_of_8_h100_is_within_the_budget(daemon) -> None:
    d = daemon("--simulate", f"{GPUS}xH100-SXM", "--sim-unreported-jobs", "--interval", "200ms")  # busy GPUs
    text = steady(d)
    counts = series_by_gpu(text)
    node = counts.pop("")
    # the simulated node's 8 NDR ports (net/simulated.py), as a real HGX node has: their own allowance
    nics = sum(1 for line in text.splitlines() if line.startswith("gpumon_nic_"))
    # and its management Ethernet interface (the jobs' collectives go over the RDMA ports)
    eth = sum(1 for line in text.splitlines() if line.startswith("gpumon_ethernet_"))
    assert len(counts) == GPUS
    assert max(counts.values()) <= PER_GPU, counts
    assert node - nics - eth <= PER_NODE and nics <= PER_PORT * GPUS and eth <= PER_INTERFACE, (node, nics)
    # the error counters are served from their first rise: on a healthy node, 5 a port, 5 an interface
    assert (nics, eth) == (5 * GPUS, 5)
    assert sum(counts.values()) + node - eth <= PER_GPU * GPUS + PER_NODE
    # what an operator alerts on is in it; the per-link detail is not
    text = d.get("/metrics").text
    for name in ("gpumon_gpu_nvlink_links_up", 'reason="sw_power_cap"', 'event="xid"'):
        assert name in text, name
    assert "gpumon_gpu_nvlink_link_up" not in text


@pytest.mark.slow
def test_collect_all_serves_every_detail(daemon) -> None:
    # a captured host's RDMA ports for the NIC details (tests/fixtures/sysfs)
    nics = str(ROOT / "tests" / "fixtures" / "sysfs" / "procfs")
    d = daemon(
        "--simulate", "2xH100-SXM", "--sim-unreported-jobs", "--interval", "200ms", "--collect", "all",
        "--sys-root", nics,
    )  # fmt: skip
    names = {f.name for f in text_string_to_metric_families(steady(d))}
    # the training flow's details need SDK ranks: tests/metrics/test_training_series.py measures them
    opt_in = {m.name.removesuffix("_total") for m in M.REGISTRY if m.detail and m not in M.TRAINING_FLOW}

    # the process utilisation series need a process that ran kernels; the simulator's idle node has some
    assert opt_in <= names, opt_in - names


@pytest.fixture(scope="module")
def h100_snapshot():
    """One sweep of 8 simulated H100s, every detail read (what ``--collect all`` makes the backend do)."""
    sim = SimNvml(f"{GPUS}xH100-SXM", seed=0, warmup=120.0)
    sampler = Sampler(NvmlBackend(sim, details=frozenset(M.DETAILS)), interval=1.0, timeout=1.0)
    sampler.events = EventWatcher(sim, sampler.devices, wait_ms=20)
    sampler.open()
    sampler.start()
    try:
        end = time.monotonic() + 10
        while (snap := sampler.snapshot) is None or not (
            snap.events is not None and snap.events.registered and snap.gpus[0].reading.profiling is not None
        ):
            assert time.monotonic() < end, "no sweep with events and profiling"
            time.sleep(0.05)
        yield snap
    finally:
        sampler.stop()


def per_gpu0(snap, details: frozenset[str]) -> int:
    fams = build_families(snap, details=details)
    return sum(1 for f in fams for s in f.samples if s.labels.get("gpu") == "0")


# what each name adds per H100 (18 NVLinks, one process), as DETAILS in gpumon/metrics/registry.py says
ADDS = {
    "nvlink-links": 54,
    "throttle-reasons": 9,
    "process-utilization": 3,
    "profiling-detail": 8,
    "event-types": 19,
    "ecc-lifetime": 2,
    "device-state": 4,
    "sampler-timing": 2,
}


# what each training detail adds per rank (test_training_series.py measures them)
RANK_ADDS = {"rank-rates": 19, "rank-step-buckets": 17, "rank-detail": 4}
# what the NIC detail adds per port of the captured ConnectX-4 (procfs's mlx5_0)
PORT_ADDS = {"nic-detail": 13}


def test_every_detail_is_documented_with_what_it_adds() -> None:
    assert set(ADDS) | set(RANK_ADDS) | set(PORT_ADDS) == set(M.DETAILS)
    for name, n in (ADDS | RANK_ADDS | PORT_ADDS).items():
        assert f"({n} " in M.DETAILS[name] or f"{n} per" in M.DETAILS[name], name
    assert all(m.detail in M.DETAILS for m in M.REGISTRY if m.detail)


@pytest.mark.parametrize("name", list(ADDS))
def test_each_detail_adds_what_it_says_per_gpu(h100_snapshot, name: str) -> None:
    base = per_gpu0(h100_snapshot, frozenset())
    assert per_gpu0(h100_snapshot, frozenset({name})) - base == ADDS[name]
    tagged = {m.name for m in M.REGISTRY if m.detail == name}
    default = {f.name for f in build_families(h100_snapshot)}
    assert not tagged & default, f"{name}'s series are served without it"


def test_nic_detail_adds_what_it_says_per_port(h100_snapshot) -> None:
    ports = read_ports(str(ROOT / "tests" / "fixtures" / "sysfs" / "procfs"), detail=True)
    snap = dataclasses.replace(h100_snapshot, nics=tuple(p for p in ports if p.device == "mlx5_0"))

    def served(details: frozenset[str]) -> int:
        fams = build_families(snap, details=details)
        return sum(len(f.samples) for f in fams if f.name.startswith("gpumon_nic"))

    assert served(frozenset({"nic-detail"})) - served(frozenset()) == PORT_ADDS["nic-detail"]


def test_collect_names_are_checked_and_all_expands() -> None:
    r = run_gpumon("serve", "--simulate", "1xL4", "--collect", "nvlink-link")
    assert r.returncode == 2 and "unknown 'nvlink-link'" in r.stderr and "nvlink-links" in r.stderr
    assert "Traceback" not in r.stderr
    s = resolve({"collect": ["nvlink-links,ecc-lifetime", "ecc-lifetime"]}, env={})
    assert s.collect == ["nvlink-links", "ecc-lifetime"]
    assert resolve({}, env={"GPUMON_COLLECT": "all"}).collect == list(M.DETAILS)


def test_the_default_throttle_series_follow_what_the_gpu_supports_not_one_read(h100_snapshot) -> None:
    """hw_slowdown has no cumulative counter anywhere; the other costly reasons have one on an H100. A read
    whose batch failed (no throttle time this once) must not make their 0/1 series appear for a sweep."""
    st = h100_snapshot.gpus[0]
    assert st.reading is not None and st.reading.throttle_seconds
    failed = dataclasses.replace(st, reading=dataclasses.replace(st.reading, throttle_seconds={}))
    snap = dataclasses.replace(h100_snapshot, gpus=(failed,))
    fams = {f.name: f for f in build_families(snap)}
    assert {s.labels["reason"] for s in fams["gpumon_gpu_throttle_active"].samples} == {"hw_slowdown"}


# -- the hardware's counters of rare trouble (throttle time by reason, ECC errors, remapped rows, NIC errors):
# absent while 0, served at once where the hardware counted some before the daemon first showed the GPU or
# port, and otherwise at 0 first so that Prometheus's increase() sees the first rise (gpumon/zerofirst.py)

HOLD = 30.0


def _served(
    snap: Snapshot, first: RareCounters | None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for fam in build_families(snap, first=first)
        for x in fam.samples
    }


def _ecc(snap: Snapshot, corrected: int) -> Snapshot:
    st = snap.gpus[0]
    reading = dataclasses.replace(st.reading, ecc_corrected_errors=corrected)
    return dataclasses.replace(snap, gpus=(dataclasses.replace(st, reading=reading), *snap.gpus[1:]))


def _value(served: dict, name: str, **labels: str) -> float | None:
    for (n, lb), v in served.items():
        if n == name and all(dict(lb).get(k) == x for k, x in labels.items()):
            return v
    return None


def test_a_rare_counter_is_absent_at_0_and_dips_to_0_once_before_its_first_rise(h100_snapshot) -> None:
    snap = _ecc(h100_snapshot, 0)
    first = RareCounters(snap.timestamp - 100.0, HOLD)
    assert _value(_served(snap, first), "gpumon_gpu_ecc_errors_total", type="corrected") is None
    # the first corrected error, after the daemon showed the GPU: 0 for the hold and SERVED_FIRST builds
    t = snap.timestamp
    for k in range(SERVED_FIRST + 1):
        later = dataclasses.replace(_ecc(snap, 1), timestamp=t + 1 + k)
        assert _value(_served(later, first), "gpumon_gpu_ecc_errors_total", type="corrected") == 0.0
    after = dataclasses.replace(_ecc(snap, 1), timestamp=t + HOLD + 5)
    assert _value(_served(after, first), "gpumon_gpu_ecc_errors_total", type="corrected") == 1.0


def test_counts_the_hardware_had_before_the_daemon_are_served_at_once(h100_snapshot) -> None:
    """A GPU that throttled for thermals last week, a NIC whose cable was reseated: the daemon's first build
    serves their counts, never a dip to 0 that Prometheus would read as a rise at every restart."""
    port = RdmaPort("mlx5_0", 1, "InfiniBand", "ACTIVE", "LinkUp", 5e10, 0, 0, None, None,
                    errors={"symbol_error": 7, "link_downed": 0})  # fmt: skip
    snap = dataclasses.replace(_ecc(h100_snapshot, 4), nics=(port,))
    first = RareCounters(snap.timestamp - 100.0, HOLD)
    served = _served(snap, first)
    assert _value(served, "gpumon_gpu_ecc_errors_total", type="corrected") == 4.0
    assert _value(served, "gpumon_nic_errors_total", counter="symbol_error") == 7.0
    assert _value(served, "gpumon_nic_errors_total", counter="link_downed") is None
    # a port seen before whose counter first rises: 0 first
    grown = dataclasses.replace(port, errors={"symbol_error": 7, "link_downed": 1})
    later = dataclasses.replace(snap, nics=(grown,), timestamp=snap.timestamp + 1)
    assert _value(_served(later, first), "gpumon_nic_errors_total", counter="link_downed") == 0.0
    # without the state (a one-off build: snapshot, tests) every counter is served, 0 or not
    assert _value(_served(snap, None), "gpumon_nic_errors_total", counter="link_downed") == 0.0


def test_a_first_rise_while_its_gpu_or_port_was_missing_still_shows_0_first(h100_snapshot) -> None:
    """Found by review: a GPU down for one render, or a port missing from one reading (an adapter reset),
    came back with its counter's first rise served at once, invisible to increase()."""
    port = RdmaPort("mlx5_1", 1, "InfiniBand", "ACTIVE", "LinkUp", 5e10, 0, 0, None, None,
                    errors={"link_downed": 0})  # fmt: skip
    snap = dataclasses.replace(_ecc(h100_snapshot, 0), nics=(port,))
    first = RareCounters(snap.timestamp - 100.0, HOLD)
    _served(snap, first)
    st = snap.gpus[0]
    gone = dataclasses.replace(
        snap,
        timestamp=snap.timestamp + 1,
        nics=(),
        gpus=(dataclasses.replace(st, reading=None), *snap.gpus[1:]),
    )
    _served(gone, first)  # GPU 0 down, mlx5_1 missing from the reading
    risen = dataclasses.replace(port, errors={"link_downed": 1})
    back = dataclasses.replace(_ecc(snap, 2), nics=(risen,), timestamp=snap.timestamp + 2)
    served = _served(back, first)
    assert _value(served, "gpumon_gpu_ecc_errors_total", type="corrected") == 0.0
    assert _value(served, "gpumon_nic_errors_total", counter="link_downed") == 0.0


def test_the_counter_hold_applies_without_ingest_too() -> None:
    """Found by review: --no-ingest served the GPU flow's rare counters at 0 for 60 s whatever
    --counter-hold said (a hold longer than 60 s for slow scrapers was silently cut)."""
    from gpumon.web.server import build_registry

    registry = build_registry(lambda: None, counter_hold=7.0)
    (collector,) = [c for c in registry._collector_to_names if type(c).__name__ == "SnapshotCollector"]
    assert collector.first.first.hold == 7.0
