"""dcgm-exporter's metric names, units and labels, from gpumon's snapshot (``--compat dcgm``).

Teams replacing dcgm-exporter keep dashboards and alerts that query ``DCGM_FI_*`` series (grafana.com
dashboard 12239 among them). This collector emits those series next to gpumon's own, converted from gpumon's
base units back to DCGM's (MiB, MHz, mJ, percent) and labelled as dcgm-exporter labels them. MAPPING is the
one place the compat names live: collect() and docs/dcgm-compat.md (``python -m gpumon.gpu.compat_dcgm``)
both read it. Like SnapshotCollector, families are built once per snapshot and reused by every scrape.

Sources (NVIDIA/dcgm-exporter, read 2026-11): etc/default-counters.csv and etc/dcp-metrics-included.csv
(names, types, HELP), METRICS.md, internal/pkg/collector/gpu_collector.go (labels, XID err_code/err_msg),
internal/pkg/rendermetrics (label set), internal/pkg/hostname (NODE_NAME),
grafana/dcgm-exporter-dashboard.json.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric

from gpumon.gpu import xid as xids
from gpumon.gpu.collector import PerSnapshotCollector
from gpumon.gpu.events import EventsView
from gpumon.gpu.snapshot import GpuStatus, Snapshot
from gpumon.gpu.types import GpuReading, has_video_encoders

MiB = 2**20
XID = "DCGM_FI_DEV_XID_ERRORS"
ENC_UTIL = "DCGM_FI_DEV_ENC_UTIL"
NVLINK_BANDWIDTH = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"
# dcgm-exporter's GPU labels with its default counters file; Hostname is left out when the host name is ""
# (dcgm-exporter's --no-hostname), and the XID series add err_code and err_msg
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")
# dcgm-exporter's main branch spells it "hostname" (commit d5e5f51, in no release yet):
# --compat-hostname-label renames it on every series


@dataclass(frozen=True)
class CompatMetric:
    name: str
    type: str  # as dcgm-exporter declares it: "gauge" or "counter"
    help: str  # dcgm-exporter's HELP text where its CSVs carry the field
    unit: str
    gpumon: str  # the gpumon series the value comes from
    conversion: str
    field: str = ""  # GpuReading attribute path; "" where collect() computes the value itself
    scale: float = 1.0
    default: bool = False  # enabled in dcgm-exporter's default-counters.csv
    whole: bool = False  # DCGM reports whole units (MiB of framebuffer): rounded down, as its division does

    def family(self) -> Metric:
        return (
            Metric(self.name, self.help, "gauge")
            if self.type == "gauge"
            else DcgmCounter(self.name, self.help)
        )


class DcgmCounter(Metric):
    """A counter under DCGM's exact name, which lacks ``_total``. The text format types it ``counter``, as
    dcgm-exporter does; OpenMetrics, which Prometheus asks for first, requires counter samples to end in
    ``_total`` and fails the whole scrape otherwise, so there it goes out ``unknown`` (untyped) under the
    same name. gpumon.web.exposition reads ``text_type``."""

    text_type = "counter"

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, "unknown")


# fmt: off
def _m(name: str, type_: str, default: bool, help_: str, unit: str, gpumon: str, field: str = "",
       scale: float = 1.0, conversion: str = "none", whole: bool = False) -> CompatMetric:
    return CompatMetric(
        f"DCGM_FI_{name}", type_, help_, unit, gpumon, conversion, field, scale, default, whole
    )


G, C = "gauge", "counter"
MIB, MHZ, PCT = "/ 2^20, rounded down (bytes to whole MiB)", "/ 10^6 (Hz to MHz)", "* 100 (ratio to percent)"
_PIPE = "Ratio of cycles the {} pipes are active."
_PCIE = (
    "The rate of data {} over the PCIe bus - including both protocol headers and data payloads - "
    "in bytes per second."
)
_NVL = "The rate of data {} over NVLink in bytes per second."
MAPPING: tuple[CompatMetric, ...] = (
    _m("DEV_SM_CLOCK", G, True, "SM clock frequency (in MHz).",
       "MHz", "gpumon_gpu_sm_clock_hertz", "sm_clock_hz", 1e-6, MHZ),
    _m("DEV_MEM_CLOCK", G, True, "Memory clock frequency (in MHz).",
       "MHz", "gpumon_gpu_memory_clock_hertz", "memory_clock_hz", 1e-6, MHZ),
    _m("DEV_MEMORY_TEMP", G, True, "Memory temperature (in C).",
       "°C", "gpumon_gpu_memory_temperature_celsius", "memory_temperature_celsius"),
    _m("DEV_GPU_TEMP", G, True, "GPU temperature (in C).",
       "°C", "gpumon_gpu_temperature_celsius", "temperature_celsius"),
    _m("DEV_POWER_USAGE", G, True, "Power draw (in W).",
       "W", "gpumon_gpu_power_watts", "power_watts"),
    _m("DEV_TOTAL_ENERGY_CONSUMPTION", C, True, "Total energy consumption since boot (in mJ).",
       "mJ", "gpumon_gpu_energy_joules_total", "energy_joules", 1e3, "* 1000 (J to mJ)"),
    _m("DEV_PCIE_REPLAY_COUNTER", C, True, "Total number of PCIe retries.",
       "replays", "gpumon_gpu_pcie_replays_total", "pcie_replays"),
    _m("DEV_GPU_UTIL", G, True, "GPU utilization (in %).",
       "%", "gpumon_gpu_utilization_ratio", "utilization_ratio", 100, PCT),
    _m("DEV_MEM_COPY_UTIL", G, True, "Memory utilization (in %).", "%",
       "gpumon_gpu_memory_controller_utilization_ratio", "memory_controller_utilization_ratio", 100, PCT),
    _m("DEV_ENC_UTIL", G, True, "Encoder utilization (in %).", "%",
       "gpumon_gpu_encoder_utilization_ratio", "encoder_utilization_ratio", 100,
       f"{PCT}; 0 on boards without NVENC, as NVML answers there (below)"),
    _m("DEV_DEC_UTIL", G, True, "Decoder utilization (in %).", "%",
       "gpumon_gpu_decoder_utilization_ratio", "decoder_utilization_ratio", 100, PCT),
    _m("DEV_XID_ERRORS", G, True, "Value of the last XID error encountered.", "XID code",
       "gpumon_gpu_xid_last_timestamp_seconds", conversion="code of the newest XID; 0 while none"),
    _m("DEV_FB_FREE", G, True, "Framebuffer memory free (in MiB).",
       "MiB", "gpumon_gpu_memory_free_bytes", "memory_free_bytes", 1 / MiB, MIB, whole=True),
    _m("DEV_FB_USED", G, True, "Framebuffer memory used (in MiB).",
       "MiB", "gpumon_gpu_memory_used_bytes", "memory_used_bytes", 1 / MiB, MIB, whole=True),
    _m("DEV_FB_RESERVED", G, True, "Framebuffer memory reserved (in MiB).",
       "MiB", "gpumon_gpu_memory_reserved_bytes", "memory_reserved_bytes", 1 / MiB, MIB, whole=True),
    _m("DEV_FB_TOTAL", G, False, "Framebuffer memory total (in MiB).",
       "MiB", "gpumon_gpu_memory_total_bytes", "memory_total_bytes", 1 / MiB, MIB, whole=True),
    _m("DEV_NVLINK_BANDWIDTH_TOTAL", G, True, "Total number of NVLink bandwidth counters for all lanes.",
       "MiB/s", "gpumon_gpu_nvlink_transmit_bytes_total + gpumon_gpu_nvlink_receive_bytes_total",
       conversion="(tx + rx) bytes since the previous snapshot scraped / seconds / 2^20"),
    _m("DEV_UNCORRECTABLE_REMAPPED_ROWS", C, True, "Number of remapped rows for uncorrectable errors",
       "rows", 'gpumon_gpu_remapped_rows_total{type="uncorrected"}', "remapped_rows_uncorrectable"),
    _m("DEV_CORRECTABLE_REMAPPED_ROWS", C, True, "Number of remapped rows for correctable errors",
       "rows", 'gpumon_gpu_remapped_rows_total{type="corrected"}', "remapped_rows_correctable"),
    _m("DEV_ROW_REMAP_FAILURE", G, True, "Whether remapping of rows has failed",
       "0/1", "gpumon_gpu_row_remap_failure", "row_remap_failure", conversion="true to 1"),
    _m("DEV_ROW_REMAP_PENDING", G, False, "Whether remapping of rows is pending.",
       "0/1", "gpumon_gpu_row_remap_pending", "row_remap_pending", conversion="true to 1"),
    _m("DEV_ECC_SBE_VOL_TOTAL", C, False, "Total number of single-bit volatile ECC errors.",
       "errors", 'gpumon_gpu_ecc_errors_total{type="corrected"}', "ecc_corrected_errors"),
    _m("DEV_ECC_DBE_VOL_TOTAL", C, False, "Total number of double-bit volatile ECC errors.",
       "errors", 'gpumon_gpu_ecc_errors_total{type="uncorrected"}', "ecc_uncorrected_errors"),
    _m("DEV_ECC_SBE_AGG_TOTAL", C, False, "Total number of single-bit persistent ECC errors.",
       "errors", 'gpumon_gpu_ecc_lifetime_errors_total{type="corrected"}', "ecc_corrected_errors_lifetime"),
    _m("DEV_ECC_DBE_AGG_TOTAL", C, False, "Total number of double-bit persistent ECC errors.", "errors",
       'gpumon_gpu_ecc_lifetime_errors_total{type="uncorrected"}', "ecc_uncorrected_errors_lifetime"),
    _m("DEV_CLOCK_THROTTLE_REASONS", G, False, "Current clock throttle reasons (NVML clocks event bitmask).",
       "bitmask", "gpumon_gpu_throttle_reasons", "throttle_reasons"),
    _m("DEV_ENFORCED_POWER_LIMIT", G, False, "Effective power limit that the driver enforces (in W).",
       "W", "gpumon_gpu_power_limit_watts", "power_limit_watts"),
    _m("DEV_PSTATE", G, False, "Performance state (P-State) 0-15; 0 is the highest.",
       "P-state", "gpumon_gpu_performance_state", "performance_state"),
    _m("DEV_FAN_SPEED", G, False, "Fan speed (in %).",
       "%", "gpumon_gpu_fan_speed_ratio", "fan_speed_ratio", 100, PCT),
    _m("DEV_PCIE_LINK_GEN", G, False, "PCIe current link generation.",
       "generation", "gpumon_gpu_pcie_link_generation", "pcie_link_generation"),
    _m("DEV_PCIE_LINK_WIDTH", G, False, "PCIe current link width (lanes).",
       "lanes", "gpumon_gpu_pcie_link_width", "pcie_link_width"),
    _m("PROF_GR_ENGINE_ACTIVE", G, True, "Ratio of time the graphics engine is active.",
       "ratio 0-1", "gpumon_gpu_graphics_engine_active_ratio", "profiling.graphics_engine_active_ratio"),
    _m("PROF_SM_ACTIVE", G, False, "The ratio of cycles an SM has at least 1 warp assigned.",
       "ratio 0-1", "gpumon_gpu_sm_active_ratio", "profiling.sm_active_ratio"),
    _m("PROF_SM_OCCUPANCY", G, False, "The ratio of number of warps resident on an SM.",
       "ratio 0-1", "gpumon_gpu_sm_occupancy_ratio", "profiling.sm_occupancy_ratio"),
    _m("PROF_PIPE_TENSOR_ACTIVE", G, True, "Ratio of cycles the tensor (HMMA) pipe is active.",
       "ratio 0-1", "gpumon_gpu_tensor_active_ratio", "profiling.tensor_active_ratio"),
    _m("PROF_DRAM_ACTIVE", G, True,
       "Ratio of cycles the device memory interface is active sending or receiving data.",
       "ratio 0-1", "gpumon_gpu_dram_active_ratio", "profiling.dram_active_ratio"),
    _m("PROF_PIPE_FP64_ACTIVE", G, False, _PIPE.format("fp64"),
       "ratio 0-1", "gpumon_gpu_fp64_active_ratio", "profiling.fp64_active_ratio"),
    _m("PROF_PIPE_FP32_ACTIVE", G, False, _PIPE.format("fp32"),
       "ratio 0-1", "gpumon_gpu_fp32_active_ratio", "profiling.fp32_active_ratio"),
    _m("PROF_PIPE_FP16_ACTIVE", G, False, _PIPE.format("fp16"),
       "ratio 0-1", "gpumon_gpu_fp16_active_ratio", "profiling.fp16_active_ratio"),
    _m("PROF_PCIE_TX_BYTES", G, True, _PCIE.format("transmitted"), "B/s",
       "gpumon_gpu_profiling_pcie_transmit_bytes_per_second", "profiling.pcie_transmit_bytes_per_second"),
    _m("PROF_PCIE_RX_BYTES", G, True, _PCIE.format("received"), "B/s",
       "gpumon_gpu_profiling_pcie_receive_bytes_per_second", "profiling.pcie_receive_bytes_per_second"),
    _m("PROF_NVLINK_TX_BYTES", G, False, _NVL.format("transmitted"), "B/s",
       "gpumon_gpu_profiling_nvlink_transmit_bytes_per_second", "profiling.nvlink_transmit_bytes_per_second"),
    _m("PROF_NVLINK_RX_BYTES", G, False, _NVL.format("received"), "B/s",
       "gpumon_gpu_profiling_nvlink_receive_bytes_per_second", "profiling.nvlink_receive_bytes_per_second"),
)
_PLAIN = tuple(m for m in MAPPING if m.field)

# dcgm-exporter defaults (and common additions) gpumon cannot fill, and why
NOT_PROVIDED: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS (default)", "gpumon does not read vGPU licensing"),
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT, DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
     "no longer dcgm-exporter defaults; use rate() of gpumon_gpu_pcie_*_bytes_total or DCGM_FI_PROF_PCIE_*"),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT",
     "gpumon reads the enforced limit, emitted as DCGM_FI_DEV_ENFORCED_POWER_LIMIT (usually equal)"),
    ("DCGM_FI_DEV_*_VIOLATION", "DCGM reads other NVML violation policies, in µs or ns depending on "
     "the version; use gpumon_gpu_throttle_seconds_total{reason=...}"),
    ("DCGM_FI_DEV_RETIRED_SBE, _DBE, _PENDING",
     'page-retirement counts are not read; gpumon_gpu_events_total{event="page_retirement"} counts events'),
    ("DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL", "NVLink CRC, replay and recovery counters are not read"),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
     "DCGM's newer name for the throttle bitmask, emitted once as DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    ("DCGM_EXP_XID_ERRORS_COUNT, DCGM_EXP_XID_ERRORS_TOTAL",
     "exporter-computed XID counts; gpumon_gpu_xid_errors_total is the counter to use"),
    ("DCGM_EXP_CLOCK_EVENTS_*, DCGM_EXP_GPU_HEALTH_STATUS, DCGM_EXP_P2P_STATUS",
     "exporter-computed; see gpumon_gpu_throttle_active and gpumon_gpu_up"),
    ("MIG instance series (labels GPU_I_PROFILE, GPU_I_ID)", "gpumon reads whole GPUs"),
    ("NvSwitch, NVLink-entity and CPU series", "gpumon reads GPUs only"),
)
# fmt: on


def node_hostname(env: Mapping[str, str] | None = None) -> str:
    """dcgm-exporter's Hostname label: NODE_NAME (set from the downward API in Kubernetes), else the host."""
    env = os.environ if env is None else env
    return env.get("NODE_NAME") or socket.gethostname()


def _read(r: GpuReading, path: str) -> Any:
    value: Any = r
    for part in path.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _convert(value: Any, m: CompatMetric) -> float:
    if m.whole:  # DCGM divides bytes into MiB with integer division
        return float(math.floor(float(value) * m.scale))
    # round away the binary noise of scaling (29 % rather than 28.999999999999996); DCGM reports integers here
    return float(value) if m.scale == 1.0 else round(float(value) * m.scale, 6)


def _nvlink_bytes(r: GpuReading | None) -> float | None:
    if r is None or r.nvlink_transmit_bytes is None or r.nvlink_receive_bytes is None:
        return None
    return r.nvlink_transmit_bytes + r.nvlink_receive_bytes


def _nvlink_rate(prev: GpuReading | None, cur: GpuReading) -> float | None:
    # DCGM's field 449 is not a counter: it differences NVML's cumulative KiB counters (tx + rx) over its own
    # poll and publishes MiB/s, so the same value needs the previous snapshot's reading
    now, then = _nvlink_bytes(cur), _nvlink_bytes(prev)
    if now is None or then is None or prev is None:
        return None
    seconds = cur.timestamp - prev.timestamp
    if seconds <= 0 or now < then:  # same reading, or the counters reset: no value rather than a wrong one
        return None
    return round((now - then) / seconds / MiB, 6)


def _last_xid(ev: EventsView, uuid: str) -> int | None:
    """dcgm-exporter's value: the newest XID code, 0 while the watcher listens and none has come."""
    seen = [(t, code) for (u, code), t in ev.xid_last.items() if u == uuid]
    if seen:
        return max(seen)[1]
    return 0 if ev.running and "xid" in ev.registered.get(uuid, ()) else None


def _nvml_encoder_zero(st: GpuStatus, r: GpuReading) -> bool:
    """Whether DCGM would read 0 where gpumon has no encoder value because it never asked.

    The backend skips nvmlDeviceGetEncoderUtilization on boards without NVENC (its answer there is always 0,
    so gpumon's own series would say nothing), but DCGM makes the call and dcgm-exporter serves the 0 (a real
    H200 answers it: tests/fixtures/captures/h200-load-2.json). The decoder call goes the same way through the
    driver; without its answer there is no evidence the board answers either, so nothing stands in."""
    return (
        r.encoder_utilization_ratio is None
        and r.decoder_utilization_ratio is not None
        and not has_video_encoders(st.info.name)
    )


def _labels(st: GpuStatus, hostname: str, driver: str, host_label: str = "Hostname") -> dict[str, str]:
    i = st.info
    values = (str(i.index), i.uuid, i.pci_bus_id, f"nvidia{i.index}", i.name, hostname, driver)
    # an empty host name is dcgm-exporter's --no-hostname: the label is left out rather than left empty
    labels = {k: v for k, v in zip(LABELS, values, strict=True) if v or k != "Hostname"}
    if host_label != "Hostname" and "Hostname" in labels:
        labels[host_label] = labels.pop("Hostname")
    return labels


def build_families(
    snap: Snapshot,
    hostname: str,
    before: Mapping[str, GpuReading] | None = None,
    host_label: str = "Hostname",
) -> list[Metric]:
    """``before``: each GPU's reading before its current one (by UUID), for the NVLink rate."""
    f = {m.name: m.family() for m in MAPPING}
    before = before or {}
    for st in snap.gpus:
        labels = _labels(st, hostname, snap.driver.driver_version, host_label)
        r = st.reading
        if r is not None:  # a down GPU gets no stale or zero values, as in gpumon's own series
            for m in _PLAIN:
                value = _read(r, m.field)
                if value is not None:
                    f[m.name].add_sample(m.name, labels, _convert(value, m))
            if _nvml_encoder_zero(st, r):
                f[ENC_UTIL].add_sample(ENC_UTIL, labels, 0.0)
            rate = _nvlink_rate(before.get(st.info.uuid), r)
            if rate is not None:
                f[NVLINK_BANDWIDTH].add_sample(NVLINK_BANDWIDTH, labels, rate)
        # from the event watcher, not the reading: an XID 79 is exactly when the GPU stops answering
        code = None if snap.events is None else _last_xid(snap.events, st.info.uuid)
        if code is not None:
            text = "No Error" if code == 0 else xids.lookup(code).description
            f[XID].add_sample(XID, {**labels, "err_code": str(code), "err_msg": text}, code)
    return [fam for fam in f.values() if fam.samples]


class DcgmCompatCollector(PerSnapshotCollector):
    """dcgm-exporter's series over whatever snapshot ``source`` returns.

    The NVLink rate differences each GPU's current reading against the one before it. Snapshots come more
    often than readings (the sampler publishes each GPU as it is read, into the latest snapshot), so the pair
    is kept per GPU and moves on only when that GPU's reading does."""

    def __init__(
        self,
        source: Callable[[], Snapshot | None],
        hostname: str | None = None,
        host_label: str = "Hostname",
    ) -> None:
        super().__init__(source)
        self.hostname = node_hostname() if hostname is None else hostname
        self.host_label = host_label
        self._current: dict[str, GpuReading] = {}
        self._before: dict[str, GpuReading] = {}

    def describe(self) -> list[Metric]:
        """Every family this collector can yield, for name[] filtering and the registry's duplicate check."""
        return [m.family() for m in MAPPING]

    def build(self, snap: Snapshot, previous: Snapshot | None) -> list[Metric]:
        for st in snap.gpus:
            uuid, r = st.info.uuid, st.reading
            if r is not None and r is not self._current.get(uuid):
                if uuid in self._current:
                    self._before[uuid] = self._current[uuid]
                self._current[uuid] = r
        return build_families(snap, self.hostname, self._before, self.host_label)


_INTRO = """# dcgm-exporter compatibility (`--compat dcgm`)

Generated from `gpumon/gpu/compat_dcgm.py` by `python -m gpumon.gpu.compat_dcgm > docs/dcgm-compat.md`;
a test fails when this file is out of date. Do not edit by hand.

With `--compat dcgm` (or `compat = "dcgm"` in the config file, or `GPUMON_COMPAT=dcgm`) gpumon also emits
dcgm-exporter's series, with its metric names, units and labels, so that dashboards and alerts built on
dcgm-exporter keep working. grafana.com dashboard 12239 ("NVIDIA DCGM Exporter Dashboard", shipped in
dcgm-exporter's repository as `grafana/dcgm-exporter-dashboard.json`) has eight queries, each selecting by
`instance` and `gpu`: `DCGM_FI_DEV_GPU_TEMP` (and its `avg`), `DCGM_FI_DEV_POWER_USAGE` (and its `sum`),
`DCGM_FI_DEV_SM_CLOCK * 1000000`, `DCGM_FI_DEV_GPU_UTIL`, `DCGM_FI_DEV_FB_USED` and
`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`; its `instance` and `gpu` variables are `label_values` of
`DCGM_FI_DEV_GPU_TEMP`. `tests/e2e/test_dcgm_compat.py` runs every one against a real Prometheus scraping
gpumon, and checks every series of dcgm-exporter's default counters file by name, type and labels. The
`gpumon_*` series stay as they are; the compat ones are converted from the same snapshot, without NVML
calls of their own. New dashboards and alerts should use `gpumon_*` (base units, `_total` counters).

## Labels

dcgm-exporter's defaults: `gpu` (NVML index), `UUID`, `pci_bus_id` (`00000000:18:00.0`), `device` (`nvidia`
and the index), `modelName` (NVML name), `Hostname` and `DCGM_FI_DRIVER_VERSION` (the label field of its
default counters file); `DCGM_FI_DEV_XID_ERRORS` adds `err_code` and `err_msg`. `Hostname` is the node
name (`--node-name`, else `NODE_NAME`, as in dcgm-exporter, whose Helm chart sets it to the node name, else
the host name). dcgm-exporter's main branch renames the label `hostname` (commit d5e5f51, in no release
yet); `--compat-hostname-label hostname` (`GPUMON_COMPAT_HOSTNAME_LABEL`) spells it so. Differences:

- `err_msg` comes from gpumon's XID catalogue ([xid.md](xid.md)), worded unlike dcgm-exporter's table.
- No `pod`, `namespace` and `container` labels (dcgm-exporter's Helm chart turns on `--kubernetes`) and no
  MIG instance series (`GPU_I_PROFILE`, `GPU_I_ID`); dashboard 12239's legends drop the empty parts.
- A GPU that does not answer (`gpumon_gpu_up == 0`) keeps only its XID series: no stale values.
- gpumon's own series say `uuid`, and keep model, bus id and driver in `gpumon_gpu_info` and
  `gpumon_driver_info` rather than on every series.

## XID errors

`DCGM_FI_DEV_XID_ERRORS` is dcgm-exporter's "last value" gauge: the code of the GPU's newest XID since
gpumon started, 0 while the event watcher listens and none has come, no series with the watcher off. It
cannot count (two XID 79s look like one) and never returns to 0, so it is emitted for compatibility only.
Alert on the counter, `increase(gpumon_gpu_xid_errors_total[5m]) > 0` (a series per code, label `xid`),
and join `gpumon_xid_info` on `xid` for severity and action.

## Types and units

- dcgm-exporter declares some fields counters without naming them `_total`. In the Prometheus text format,
  which dcgm-exporter serves, gpumon types them `counter` too. OpenMetrics, which Prometheus negotiates
  first, requires counter samples to end in `_total`, and one malformed family fails the whole scrape, so
  there they go out `unknown` (untyped) under their exact names. Queries are the same either way; only the
  type in Prometheus's metadata differs. To see them typed `counter`, as with dcgm-exporter, give the
  gpumon job `scrape_protocols: [PrometheusText0.0.4]` (gpumon's own series lose nothing in that format).
- Framebuffer sizes (`DCGM_FI_DEV_FB_*`) are whole MiB, rounded down, as DCGM's integer division gives them.
- `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` is a rate: DCGM differences NVML's NVLink data counters (tx + rx)
  over its poll and publishes MiB/s, and dcgm-exporter's current counters file types it `gauge` (earlier
  ones said `counter`). gpumon differences the counters between the snapshots two scrapes see: no value on
  the first scrape or after a counter reset. DCGM's source divides KiB/s by 1000 where its comment says MiB;
  gpumon divides by 2^20 (2.4 % apart).
- `DCGM_FI_DEV_ENC_UTIL` is 0 on boards without video encoders (A100, A30, Hopper and Blackwell datacenter
  parts), as dcgm-exporter serves it: NVML answers the encoder call there, always with 0 (a real H200 does:
  `tests/fixtures/captures/h200-load-2.json`). gpumon skips that call, so its own
  `gpumon_gpu_encoder_utilization_ratio` is absent on those boards, and the compat series stands in NVML's 0
  as long as the board answers the decoder call. Where NVML answers NOT_SUPPORTED or an error (the encoder
  call on a board with encoders, or the decoder call), the series is absent, as dcgm-exporter skips DCGM's
  blank value.
- `DCGM_FI_PROF_*` activities are ratios 0-1, as DCGM reports them, though some dcgm-exporter CSVs say
  "(in %)". They need gpumon's profiling counters (NVML GPM on Hopper and later, or DCGM).
- Scaled values are rounded to 6 decimals, so that 29 % is not 28.999999999999996.

## Mapping

"its type": as dcgm-exporter declares it (counters go out untyped, above). "default": enabled in
dcgm-exporter's `default-counters.csv`; the others are fields its CSVs carry
commented out, or that teams commonly add.

| dcgm-exporter metric | its type | unit | default | from gpumon | conversion |
|---|---|---|---|---|---|
"""

_PROMTOOL = """
## promtool

`promtool check metrics` has nothing to say about gpumon's own series. The compat series draw three lint
warnings, inherent to dcgm-exporter's names (its own output draws the same):

- `label names should be written in 'snake_case' not 'camelCase'` (`modelName`, `Hostname`), on every
  family;
- `counter metrics should have "_total" suffix`, on each counter (text format);
- `metric name should not include type 'counter'`, on `DCGM_FI_DEV_PCIE_REPLAY_COUNTER`.
"""


def render_markdown() -> str:
    rows = [
        f"| `{m.name}` | {m.type} | {m.unit} | {'yes' if m.default else ''} | `{m.gpumon}` | {m.conversion} |"
        for m in MAPPING
    ]
    missing = [f"| {name} | {why} |" for name, why in NOT_PROVIDED]
    head = ["", "## dcgm-exporter metrics not provided", "", "| metric | why |", "|---|---|"]
    return _INTRO + "\n".join(rows + head + missing) + "\n" + _PROMTOOL


if __name__ == "__main__":
    sys.stdout.write(render_markdown())
