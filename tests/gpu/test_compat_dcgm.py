"""--compat dcgm: dcgm-exporter's names, units and labels from a real snapshot of the static simulator."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from support.helpers import ROOT, require_tool, set_state

from gpumon import metrics as M
from gpumon.gpu import compat_dcgm as compat
from gpumon.gpu.capture import ReplayNvml, load
from gpumon.gpu.compat_dcgm import LABELS, MAPPING, DcgmCompatCollector, node_hostname, render_markdown
from gpumon.gpu.events import EventsView
from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.snapshot import Snapshot
from gpumon.gpu.types import GpuReading, ProfilingReading
from gpumon.web.exposition import Renderer
from gpumon.web.server import build_registry

MiB = 2**20
HOST = "gpu-node-7"
ENC, DEC = "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL"
OWN_ENC, OWN_DEC = "gpumon_gpu_encoder_utilization_ratio", "gpumon_gpu_decoder_utilization_ratio"
# recorded by today's sampler on a real H200 (driver 580), which answers the encoder call with 0
H200_CAPTURE = ROOT / "tests" / "fixtures" / "captures" / "h200-load-2.json"
# promtool lint messages the compat names cause (docs/dcgm-compat.md lists them); nothing else is allowed
COMPAT_LINTS = (
    "label names should be written in 'snake_case' not 'camelCase'",
    'counter metrics should have "_total" suffix',
    "metric name should not include type 'counter'",
)


@pytest.fixture
def snap(sims, samplers) -> Snapshot:
    """GPU 0 with set_state's values and profiling counters; GPU 1 idle; no event watcher."""
    sim = sims("2xH100-SXM", static=True)
    set_state(sim)
    s = samplers(sim).sweep()
    first = s.gpus[0]
    assert first.reading is not None
    prof = ProfilingReading(
        "gpm", graphics_engine_active_ratio=0.9, tensor_active_ratio=0.42, fp16_active_ratio=0.3
    )
    reading = dataclasses.replace(first.reading, profiling=prof)
    return dataclasses.replace(s, gpus=(dataclasses.replace(first, reading=reading), *s.gpus[1:]))


def text_of(*collectors: object) -> str:
    registry = CollectorRegistry()
    for c in collectors:
        registry.register(c)  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def parsed(snap: Snapshot, hostname: str = HOST) -> dict[str, dict[str, tuple[dict[str, str], float]]]:
    """family → gpu → (labels, value), through the text exposition and prometheus_client's parser."""
    out: dict[str, dict[str, tuple[dict[str, str], float]]] = {}
    for fam in parse_text(text_of(DcgmCompatCollector(lambda: snap, hostname=hostname))):
        out[fam.name] = {s.labels["gpu"]: (s.labels, s.value) for s in fam.samples}
    return out


def value(fams: dict[str, dict[str, tuple[dict[str, str], float]]], name: str, gpu: str = "0") -> float:
    return fams[name][gpu][1]


def test_values_are_in_dcgm_units(snap: Snapshot) -> None:
    r = snap.gpus[0].reading
    assert r is not None and r.memory_used_bytes is not None and r.memory_free_bytes is not None
    fams = parsed(snap)
    assert value(fams, "DCGM_FI_DEV_FB_USED") == r.memory_used_bytes / MiB == 60_000
    assert value(fams, "DCGM_FI_DEV_FB_FREE") == r.memory_free_bytes // MiB
    assert value(fams, "DCGM_FI_DEV_POWER_USAGE") == 650.5  # W, as gpumon
    assert value(fams, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == 123_456_789  # mJ from 123456.789 J
    assert value(fams, "DCGM_FI_DEV_GPU_UTIL") == 97  # percent from 0.97
    assert value(fams, "DCGM_FI_DEV_MEM_COPY_UTIL") == 41
    assert value(fams, "DCGM_FI_DEV_SM_CLOCK") == 1755  # MHz from Hz
    assert value(fams, "DCGM_FI_DEV_MEM_CLOCK") == 2619
    assert value(fams, "DCGM_FI_DEV_GPU_TEMP") == 71
    assert value(fams, "DCGM_FI_DEV_MEMORY_TEMP") == 78
    assert value(fams, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER") == 3
    assert (
        value(fams, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL") == 4
        and value(fams, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == 1
    )
    assert (
        value(fams, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL") == 40
        and value(fams, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL") == 2
    )
    assert value(fams, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS") == 5
    assert value(fams, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS") == 1
    assert (
        value(fams, "DCGM_FI_DEV_ROW_REMAP_FAILURE") == 0
        and value(fams, "DCGM_FI_DEV_ROW_REMAP_PENDING") == 1
    )
    assert value(fams, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") == 0x24  # sw_power_cap | sw_thermal
    assert value(fams, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT") == 700
    # DCGM's profiling activities are ratios 0-1, not percent
    assert value(fams, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE") == 0.42
    assert value(fams, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") == 0.9
    assert value(fams, "DCGM_FI_PROF_PIPE_FP16_ACTIVE") == 0.3


def test_framebuffer_is_whole_mib_rounded_down_and_video_engines_in_percent(snap: Snapshot) -> None:
    """DCGM divides bytes into MiB with integer division; a byte short of a MiB is the MiB below."""
    first = snap.gpus[0]
    assert first.reading is not None
    reading = dataclasses.replace(
        first.reading,
        memory_used_bytes=60_000 * MiB - 1,
        memory_free_bytes=20_000.5 * MiB,
        encoder_utilization_ratio=0.07,
        decoder_utilization_ratio=0.33,
    )
    fams = parsed(
        dataclasses.replace(snap, gpus=(dataclasses.replace(first, reading=reading), *snap.gpus[1:]))
    )
    assert (value(fams, "DCGM_FI_DEV_FB_USED"), value(fams, "DCGM_FI_DEV_FB_FREE")) == (59_999, 20_000)
    assert (value(fams, "DCGM_FI_DEV_ENC_UTIL"), value(fams, "DCGM_FI_DEV_DEC_UTIL")) == (7, 33)


def served(snap: Snapshot) -> dict[str, dict[str, float]]:
    """family → gpu → value of what ``gpumon serve --compat dcgm`` serves, gpumon's series and DCGM's."""
    registry = build_registry(lambda: snap, compat="dcgm", node=HOST)
    body = Renderer().render(registry.collect(), openmetrics_format=False).decode()
    return {
        fam.name: {s.labels["gpu"]: s.value for s in fam.samples}
        for fam in parse_text(body)
        if any("gpu" in s.labels for s in fam.samples)
    }


def test_boards_without_nvenc_have_dcgms_encoder_zero_and_no_gpumon_encoder_series(sims, samplers) -> None:
    """NVML answers the encoder call with 0 on boards without NVENC (the real H200 does: H200_CAPTURE), so
    DCGM and dcgm-exporter report 0 there. gpumon does not ask (its own series would say nothing), and
    compat stands in NVML's 0; where NVML does not answer the video engines, neither series is made up."""
    h100, h200, l4 = "0", "1", "2"
    sim = sims("1xH100-SXM,1xH200,1xL4", static=True)
    sampler = samplers(sim)
    out = served(sampler.sweep())
    assert out[ENC] == out[DEC] == {h100: 0, h200: 0, l4: 0}
    assert set(out[OWN_ENC]) == {l4} and set(out[OWN_DEC]) == {h100, h200, l4}  # gpumon's own, unchanged

    # NOT_SUPPORTED from the driver: the H100's decoder (so no encoder 0 either), the L4's encoder
    sim.faults.add("unsupported:0:nvmlDeviceGetDecoderUtilization")
    sim.faults.add("unsupported:2:nvmlDeviceGetEncoderUtilization")
    out = served(sampler.sweep())
    assert set(out[ENC]) == {h200} and set(out[DEC]) == {h200, l4}
    assert OWN_ENC not in out


def test_a_replayed_real_h200_has_dcgms_encoder_and_decoder_series() -> None:
    calls = load(str(H200_CAPTURE)).calls
    answers = [c["value"] for c in calls if c["op"] == "nvmlDeviceGetEncoderUtilization"]
    assert answers and all(a[0] == 0 for a in answers)  # what DCGM reads on this board
    sampler = Sampler(NvmlBackend(ReplayNvml(load(str(H200_CAPTURE)))), interval=1.0)
    sampler.open()
    try:
        out = served(sampler.sweep())
    finally:
        sampler.stop()
    assert out[ENC] == out[DEC] == {"0": 0}
    assert OWN_ENC not in out and out[OWN_DEC] == {"0": 0}  # gpumon's own: no encoder series on an H200


def test_the_simulator_answers_the_encoder_call_on_boards_without_nvenc_as_a_real_h200(sims) -> None:
    """gpumon once assumed NOT_SUPPORTED there, and so did the simulator; the real H200 answers 0."""
    sim = sims("1xH100-SXM,1xH200,1xA100-SXM", static=True)
    sim.nvmlInit()
    for index in range(3):
        handle = sim.nvmlDeviceGetHandleByIndex(index)
        utilization, window_us = sim.nvmlDeviceGetEncoderUtilization(handle)
        assert utilization == 0 and window_us > 0, sim.nvmlDeviceGetName(handle)


def test_the_host_label_can_take_dcgm_exporters_new_spelling(snap: Snapshot) -> None:
    collector = DcgmCompatCollector(lambda: snap, hostname=HOST, host_label="hostname")
    labels = parse_text(text_of(collector))
    for fam in labels:
        for s in fam.samples:
            assert s.labels["hostname"] == HOST and "Hostname" not in s.labels


def test_absent_quantities_have_no_sample_never_a_zero(snap: Snapshot) -> None:
    fams = parsed(snap)
    assert "1" not in fams["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]  # GPU 1 has no profiling reading
    assert "DCGM_FI_PROF_SM_ACTIVE" not in fams  # set on no GPU: no family at all
    assert "DCGM_FI_DEV_FAN_SPEED" not in fams  # SXM boards are passively cooled
    assert "DCGM_FI_DEV_XID_ERRORS" not in fams  # no event watcher
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in fams  # a rate needs a second snapshot


def test_labels_are_dcgm_exporters(snap: Snapshot, monkeypatch: pytest.MonkeyPatch) -> None:
    info = snap.gpus[0].info
    labels, _ = parsed(snap)["DCGM_FI_DEV_GPU_TEMP"]["0"]
    assert labels == {
        "gpu": "0",
        "UUID": info.uuid,
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": HOST,
        "DCGM_FI_DRIVER_VERSION": snap.driver.driver_version,
    }
    assert set(labels) == set(LABELS)
    labels, _ = parsed(snap, hostname="")["DCGM_FI_DEV_GPU_TEMP"]["1"]  # dcgm-exporter's --no-hostname
    assert "Hostname" not in labels and labels["device"] == "nvidia1"
    # dcgm-exporter takes NODE_NAME (its Helm chart sets it to the node's name) over the host name
    assert node_hostname({"NODE_NAME": "k8s-node-3"}) == "k8s-node-3"
    assert node_hostname({}) == node_hostname({"NODE_NAME": ""}) != ""
    monkeypatch.setenv("NODE_NAME", "k8s-node-4")
    assert DcgmCompatCollector(lambda: snap).hostname == "k8s-node-4"


def events(snap: Snapshot, *, running: bool = True, **xids: tuple[int, float]) -> EventsView:
    """Events as the watcher publishes them: every GPU registered for XIDs; xids gpuN=(code, time)."""
    uuid = {f"gpu{st.info.index}": st.info.uuid for st in snap.gpus}
    return EventsView(
        running=running,
        registered={st.info.uuid: ("xid", "ecc_double_bit") for st in snap.gpus},
        xids={(uuid[g], code): 1 for g, (code, _) in xids.items()},
        xid_last={(uuid[g], code): t for g, (code, t) in xids.items()},
    )


def test_xid_gauge_is_the_latest_code(snap: Snapshot) -> None:
    ev = events(snap, gpu0=(13, 100.0))
    u0 = snap.gpus[0].info.uuid
    ev = dataclasses.replace(
        ev,
        xids={**ev.xids, (u0, 79): 2, (u0, 31): 5},
        xid_last={**ev.xid_last, (u0, 79): 300.0, (u0, 31): 200.0},
    )
    xid = parsed(dataclasses.replace(snap, events=ev))["DCGM_FI_DEV_XID_ERRORS"]
    labels, code = xid["0"]
    assert code == 79  # the newest, not the most frequent or the highest
    assert labels["err_code"] == "79" and "fallen off the bus" in labels["err_msg"]
    labels, code = xid["1"]  # registered, nothing seen: dcgm-exporter's 0
    assert code == 0 and labels["err_code"] == "0" and labels["err_msg"] == "No Error"

    stopped = parsed(dataclasses.replace(snap, events=events(snap, running=False, gpu0=(48, 5.0))))
    assert stopped["DCGM_FI_DEV_XID_ERRORS"]["0"][1] == 48  # an XID seen stays true
    assert "1" not in stopped["DCGM_FI_DEV_XID_ERRORS"]  # a watcher not listening cannot say "none"


def test_a_down_gpu_has_no_values(snap: Snapshot) -> None:
    down = dataclasses.replace(snap.gpus[1], up=False, reading=None, down_reason="GpuIsLost")
    lost = dataclasses.replace(snap, gpus=(snap.gpus[0], down))
    assert all("1" not in by_gpu for by_gpu in parsed(lost).values())
    assert all("0" in by_gpu for by_gpu in parsed(lost).values())
    # an XID 79 is what takes a GPU off the bus: its gauge stays, and only it
    with_xid = parsed(dataclasses.replace(lost, events=events(lost, gpu1=(79, 50.0))))
    assert [name for name, by_gpu in with_xid.items() if "1" in by_gpu] == ["DCGM_FI_DEV_XID_ERRORS"]
    assert with_xid["DCGM_FI_DEV_XID_ERRORS"]["1"][1] == 79


def with_nvlink(snap: Snapshot, t: float, tx: float, rx: float) -> Snapshot:
    first = snap.gpus[0]
    assert first.reading is not None
    r: GpuReading = dataclasses.replace(
        first.reading, timestamp=t, nvlink_transmit_bytes=tx, nvlink_receive_bytes=rx
    )
    return dataclasses.replace(snap, gpus=(dataclasses.replace(first, reading=r), *snap.gpus[1:]))


def test_nvlink_bandwidth_is_a_mib_per_second_rate_between_snapshots(snap: Snapshot) -> None:
    current: list[Snapshot] = [with_nvlink(snap, 1000.0, 10 * MiB, 20 * MiB)]
    collector = DcgmCompatCollector(lambda: current[0], hostname=HOST)

    def bandwidth() -> dict[str, float]:
        fams = {f.name: f for f in collector.collect()}
        fam = fams.get("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")
        return {} if fam is None else {s.labels["gpu"]: s.value for s in fam.samples}

    assert bandwidth() == {}  # the first scrape has nothing to difference
    current[0] = with_nvlink(snap, 1002.0, 110 * MiB, 220 * MiB)
    assert bandwidth()["0"] == 150.0  # (100 + 200) MiB over 2 s, tx + rx
    # the sampler publishes GPUs one by one: a new snapshot holding the same reading keeps the same rate
    current[0] = dataclasses.replace(current[0], gpus=tuple(current[0].gpus))
    assert bandwidth()["0"] == 150.0
    current[0] = with_nvlink(snap, 1003.0, 1 * MiB, 1 * MiB)
    assert "0" not in bandwidth()  # counters reset (driver reload): no value rather than a negative one


def test_families_are_built_once_per_snapshot(snap: Snapshot) -> None:
    current = [snap]
    collector = DcgmCompatCollector(lambda: current[0], hostname=HOST)
    first = list(collector.collect())
    assert [id(f) for f in collector.collect()] == [id(f) for f in first]
    current[0] = dataclasses.replace(snap, sweep=snap.sweep + 1)
    assert [id(f) for f in collector.collect()] != [id(f) for f in first]
    assert list(DcgmCompatCollector(lambda: None).collect()) == []


def test_families_are_dcgm_names_described_up_front(snap: Snapshot) -> None:
    collector = DcgmCompatCollector(lambda: snap, hostname=HOST)
    described = [f.name for f in collector.describe()]
    assert described == [m.name for m in MAPPING] and len(set(described)) == len(described)
    assert all(name.startswith("DCGM_FI_") for name in described)
    assert {f.name for f in collector.collect()} <= set(described)
    registry = build_registry(lambda: snap)
    registry.register(collector)  # next to gpumon's own families: no name clashes
    only = list(registry.restricted_registry(["DCGM_FI_DEV_FB_USED"]).collect())  # /metrics?name[]=...
    assert [f.name for f in only] == ["DCGM_FI_DEV_FB_USED"] and len(only[0].samples) == 2


def test_exposition_parses_as_text_and_openmetrics(snap: Snapshot) -> None:
    snap = dataclasses.replace(snap, events=events(snap, gpu0=(79, 1.0)))
    registry = build_registry(lambda: snap)
    registry.register(DcgmCompatCollector(lambda: snap, hostname=HOST))
    body = Renderer().render(registry.collect(), openmetrics_format=False).decode()  # what /metrics serves
    text = {f.name: f for f in parse_text(body)}
    assert text["DCGM_FI_DEV_FB_USED"].type == "gauge"
    # DCGM's counters lack _total: counters in the text format, as dcgm-exporter serves them ...
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in body
    # (prometheus_client's parser appends _total to a counter's samples; on the wire they have DCGM's name)
    samples = [ln.split("{")[0] for ln in body.splitlines() if ln.startswith("DCGM_FI_DEV_TOTAL_ENERGY")]
    assert samples == ["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] * 2
    # ... untyped in OpenMetrics, which requires counter samples to end in _total
    om = Renderer().render(registry.collect(), openmetrics_format=True).decode()
    om_families = {f.name: f for f in parse_openmetrics(om)}
    assert set(om_families) == set(text)
    assert om_families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "unknown"


def test_promtool_only_objects_to_dcgm_exporters_own_naming(snap: Snapshot) -> None:
    promtool = require_tool("promtool")
    snap = dataclasses.replace(snap, events=events(snap, gpu0=(79, 1.0)))
    registry = build_registry(lambda: snap)
    registry.register(DcgmCompatCollector(lambda: snap, hostname=HOST))
    body = Renderer().render(registry.collect(), openmetrics_format=False).decode()
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
    complaints = [line for line in (check.stdout + check.stderr).splitlines() if line.strip()]
    assert check.returncode in (0, 3), complaints  # 1 would be a parse error; 3 is lint only
    for line in complaints:
        name, _, message = line.strip().partition(" ")
        assert name.startswith("DCGM_FI_") and message in COMPAT_LINTS, line
    assert all(f"`{lint}`" in render_markdown() for lint in COMPAT_LINTS)


def test_mapping_refers_to_real_gpumon_series_and_fields() -> None:
    readings = {"": GpuReading, "profiling": ProfilingReading}
    for m in MAPPING:
        assert m.type in ("gauge", "counter") and m.help and m.unit
        for series in m.gpumon.split(" + "):
            assert re.sub(r"\{.*\}$", "", series) in M.BY_NAME, (m.name, series)
        if m.field:
            owner, _, attr = m.field.rpartition(".")
            assert attr in {f.name for f in dataclasses.fields(readings[owner])}, m.name
    assert {m.name for m in MAPPING if not m.field} == {compat.XID, compat.NVLINK_BANDWIDTH}


def test_docs_are_rendered_from_the_table() -> None:
    assert (ROOT / "docs" / "dcgm-compat.md").read_text() == render_markdown()
    doc = render_markdown()
    assert all(f"| `{m.name}` |" in doc for m in MAPPING)
    for needed in ("--compat dcgm", 'compat = "dcgm"', "GPUMON_COMPAT=dcgm", "gpumon_gpu_xid_errors_total"):
        assert needed in doc
    out = subprocess.run(
        [sys.executable, "-m", "gpumon.gpu.compat_dcgm"], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout == doc
