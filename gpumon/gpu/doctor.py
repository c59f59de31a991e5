"""What this node supports and what to do about what it does not: the logic behind ``gpumon doctor``."""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.gpu.backend import NOT_HARDWARE
from gpumon.gpu.snapshot import GpuStatus, Snapshot
from gpumon.gpu.types import Support
from gpumon.net.doctor import NetReport
from gpumon.net.doctor import report as net_report

DEVICE_NODES = ("/dev/nvidiactl",)


@dataclass
class Report:
    backend: str
    driver: dict[str, str]
    device_count: int
    gpus: list[dict[str, Any]]
    quantities: list[str]
    devices: dict[str, str]
    uid: int
    telemetry: dict[str, str] = field(default_factory=dict)  # deep telemetry sources and their state
    advice: list[str] = field(default_factory=list)
    network: NetReport = field(default_factory=NetReport)  # RDMA ports, GPU-NIC affinity (gpumon/net)

    def as_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "simulated": self.backend == "sim",
            "replayed": self.backend == "replay",
            "driver": self.driver,
            "device_count": self.device_count,
            "identified": len(self.gpus),
            "uid": self.uid,
            "device_nodes": self.devices,
            "telemetry": self.telemetry,
            "gpus": self.gpus,
            "network": self.network.as_json(),
            "advice": self.advice,
        }


def device_access(paths: list[str]) -> dict[str, str]:
    out = {}
    for path in paths:
        if not os.path.exists(path):
            out[path] = "missing"
        elif os.access(path, os.R_OK | os.W_OK):
            out[path] = "read-write"
        else:
            out[path] = "no access"
    return out


def _by_state(caps: dict[str, str], state: Support) -> list[str]:
    return sorted(q for q, s in caps.items() if s == state.value)


def telemetry(snap: Snapshot, sources: Mapping[str, str] | None = None) -> dict[str, str]:
    """One line per deep-telemetry source: what it does on this node, or why not."""
    out = dict(sources or {})
    ev = snap.events
    if ev is None:
        out["events"] = "off (--no-events)"
    elif ev.running:
        n = len(ev.registered)
        out["events"] = f"watching {n} of {len(snap.gpus)} GPU(s)" + (f"; {ev.reason}" if ev.reason else "")
    else:
        out["events"] = f"not running: {ev.reason}"
    gpm = [st.info.index for st in snap.gpus if st.capabilities.get("gpm") == Support.SUPPORTED.value]
    if "profiling" not in out:
        out["profiling"] = (
            f"NVML GPM on GPU(s) {', '.join(map(str, gpm))}" if gpm else "none (no GPU has GPM)"
        )
    if snap.owners is None:
        out.setdefault("attribution", "off (--no-processes)")
    out["mig"] = "; ".join(f"GPU {st.info.index} {_mig_mode(st)}" for st in snap.gpus)
    order = ("events", "profiling", "dcgm", "attribution", "mig")
    return {k: out[k] for k in sorted(out, key=lambda k: order.index(k) if k in order else len(order))}


def _mig_mode(st: GpuStatus) -> str:
    if st.capabilities.get("mig") in (Support.NOT_SUPPORTED.value, Support.NO_PERMISSION.value):
        return "not supported"
    if st.reading is None:
        return "unknown (GPU down)"
    if st.reading.mig is None:
        return "disabled"
    return f"enabled, {len(st.reading.mig)} MIG device(s)"


def diagnose(
    snap: Snapshot,
    *,
    check_devices: bool = True,
    sources: Mapping[str, str] | None = None,
) -> Report:
    gpus: list[dict[str, Any]] = []
    for st in snap.gpus:
        gpus.append(
            {
                "index": st.info.index,
                "uuid": st.info.uuid,
                "name": st.info.name,
                "pci_bus_id": st.info.pci_bus_id,
                "up": st.up,
                "down_reason": st.down_reason,
                "persistence_mode": st.info.persistence_mode,
                "nvlinks": st.info.nvlink_count,
                "capabilities": dict(st.capabilities),
            }
        )
    quantities = sorted({q for g in gpus for q in g["capabilities"]})
    simulated = snap.backend == "sim"
    # a replay's device nodes are the captured node's: this machine's say nothing about them
    nodes = []
    if snap.backend not in NOT_HARDWARE and check_devices:
        nodes = [*DEVICE_NODES, *sorted(glob.glob("/dev/nvidia[0-9]*"))]
    report = Report(
        backend=snap.backend,
        driver={
            "driver_version": snap.driver.driver_version,
            "cuda_driver_version": snap.driver.cuda_driver_version,
            "nvml_version": snap.driver.nvml_version,
        },
        device_count=snap.device_count,
        gpus=gpus,
        quantities=quantities,
        devices=device_access(nodes),
        uid=os.getuid(),
        telemetry=telemetry(snap, sources),
    )
    indices = {st.info.uuid: st.info.index for st in snap.gpus}
    report.network = net_report(indices, snap.nics, snap.nic_affinity, snap.nic_peermem)
    report.advice = _advice(report, simulated, replayed=snap.backend == "replay") + report.network.advice
    return report


def _gpu_list(gpus: list[dict[str, Any]]) -> str:
    return ", ".join(str(g["index"]) for g in gpus)


def _advice(r: Report, simulated: bool, *, replayed: bool = False) -> list[str]:
    advice = []
    if simulated:
        advice.append(
            "These are simulated GPUs: the capabilities shown are the simulator's model of that GPU, "
            "not a measurement of this machine."
        )
    if replayed:
        advice.append(
            "These GPUs are replayed from a capture: the capabilities shown are what the captured node's "
            "NVML answered, not a measurement of this machine."
        )
    if r.device_count > len(r.gpus):
        advice.append(
            f"NVML counts {r.device_count} GPUs but only {len(r.gpus)} could be identified: check "
            "`nvidia-smi` and dmesg for XID errors or a GPU that fell off the bus; gpumon looks for the "
            "missing ones every 30 s."
        )
    down = [g for g in r.gpus if not g["up"]]
    for g in down:
        advice.append(
            f"GPU {g['index']} did not answer ({g['down_reason']}); gpumon reports it with "
            "gpumon_gpu_up 0 and retries with backoff."
        )
    no_pm = [g for g in r.gpus if g["persistence_mode"] is False]
    if no_pm:
        advice.append(
            f"Persistence mode is off on GPU {_gpu_list(no_pm)}: enable it (`nvidia-smi -pm 1` or the "
            "nvidia-persistenced service); without it the driver unloads between clients and NVML "
            "initialisation can take seconds."
        )
    denied = {g["index"]: _by_state(g["capabilities"], Support.NO_PERMISSION) for g in r.gpus}
    denied = {i: q for i, q in denied.items() if q}
    if denied:
        advice.append(
            "NVML refused some queries for lack of permission ("
            + "; ".join(f"GPU {i}: {', '.join(q)}" for i, q in denied.items())
            + "). Run gpumon as root, or in a container with the NVIDIA container toolkit and "
            "NVIDIA_DRIVER_CAPABILITIES=utility."
        )
    blocked = [p for p, state in r.devices.items() if state != "read-write"]
    if blocked:
        advice.append(
            f"Device nodes not usable by uid {r.uid}: {', '.join(f'{p} ({r.devices[p]})' for p in blocked)}. "
            "NVML needs read-write access to /dev/nvidiactl and /dev/nvidiaN."
        )
    caps = {g["index"]: g["capabilities"] for g in r.gpus}
    fallback = [g for g in r.gpus if caps[g["index"]].get("pcie_bytes") == Support.NOT_SUPPORTED.value]
    if fallback:
        advice.append(
            f"{'GPUs' if len(fallback) > 1 else 'GPU'} {_gpu_list(fallback)} "
            f"{'lack' if len(fallback) > 1 else 'lacks'} cumulative PCIe byte counters (fields 197/198): "
            "gpumon falls back to nvmlDeviceGetPcieThroughput, a 20 ms sample per direction taken in "
            "parallel; expect gpumon_gpu_pcie_*_bytes_per_second instead of the *_bytes_total counters."
        )
    no_ecc = [g for g in r.gpus if caps[g["index"]].get("ecc") == Support.NOT_SUPPORTED.value]
    if no_ecc:
        advice.append(
            f"ECC counters are unavailable on GPU {_gpu_list(no_ecc)} (ECC disabled or unsupported): "
            "memory errors will not be visible."
        )
    nvl_missing = [
        g
        for g in r.gpus
        if g["nvlinks"]
        and caps[g["index"]].get("nvlink") == "not_supported"
        and caps[g["index"]].get("nvlink_links") != "supported"
    ]
    if nvl_missing:
        advice.append(
            f"GPU {_gpu_list(nvl_missing)} report NVLinks but no NVLink throughput counters: a driver "
            "older than R450 or a virtualised GPU; NVLink traffic will not be visible."
        )
    if not advice:
        advice.append("Nothing to fix: every GPU answered and every quantity it has is readable.")
    return advice
