"""The one batched ``nvmlDeviceGetFieldValues`` call per GPU: HBM temperature, throttle time, PCIe byte
counters and NVLink throughput (all links; each link only when asked for), and the quantities folded into it
from calls of their own (power, power limit, energy, ECC totals, PCIe replays, remapped rows, the state of
each NVLink).

A folded quantity is read from the batch where the GPU answers its fields; where it does not (an older
driver), its own call reads it, as before. tests/gpu/capture/test_field_probe.py holds each field to its
call on a real H200."""

from __future__ import annotations

from typing import Any

import pynvml

from gpumon.gpu import fields as codec
from gpumon.gpu.nvml.calls import ABSENT_ERRORS, SKIP, Calls, error_kind, scaled, total
from gpumon.gpu.nvml.device import NvmlDevice
from gpumon.gpu.types import THROTTLE_REASONS, NvlinkReading, ReadError, Support

UINT_MAX = 0xFFFFFFFF  # scopeId for "all links"
FI_NVLINK_STATE = pynvml.NVML_FI_DEV_NVLINK_GET_STATE  # per link; its own call: nvmlDeviceGetNvLinkState
# a link in low-power sleep carries traffic again on demand; one with traffic disabled does not
LINK_UP_STATES = (pynvml.NVML_NVLINK_STATE_ACTIVE, pynvml.NVML_NVLINK_STATE_SLEEP)
KIB = 1024

FI_MEMORY_TEMP = 82
FI_NVLINK_COUNT = 91
FI_PCIE_TX, FI_PCIE_RX = 197, 198
FI_NVLINK_TX, FI_NVLINK_RX = 138, 139
THROTTLE_FIELDS = {fid: name for _, name, fid in THROTTLE_REASONS if fid is not None}

# quantity → the fields that carry it in the batch, in the order its own call returns them
FOLDED: dict[str, tuple[int, ...]] = {
    "energy": (pynvml.NVML_FI_DEV_ENERGY,),  # mJ, as nvmlDeviceGetTotalEnergyConsumption
    "ecc": (pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL),
    "ecc_lifetime": (pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL),
    "pcie_replays": (pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,),
    # mW, as nvmlDeviceGetPowerUsage (the 1 s average on Hopper) and nvmlDeviceGetEnforcedPowerLimit
    "power": (pynvml.NVML_FI_DEV_POWER_AVERAGE,),
    "power_limit": (pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT,),
    "remapped_rows": (
        pynvml.NVML_FI_DEV_REMAPPED_COR,
        pynvml.NVML_FI_DEV_REMAPPED_UNC,
        pynvml.NVML_FI_DEV_REMAPPED_PENDING,
        pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
    ),
}
FOLD = "fold:"  # capability key prefix: whether the batch carries the quantity (not shown by doctor)
UNFOLDED = object()  # folded() says: the batch does not carry it here; ask its own call

Fields = dict[tuple[int, int], float]
INACTIVE = -1.0  # a link's state entry answered NOT_SUPPORTED: an inactive link, as its own call says it


class Failed(dict[tuple[int, int], float]):
    """No values: the batch call itself failed this sweep (counted). Folded quantities fall back to their
    own calls for the sweep, so one failed batch does not take power, energy and ECC with it."""


def plan(dev: NvmlDevice, per_link: bool = False) -> list[tuple[str, int, int]]:
    """(quantity, field id, scope id) to request: everything not known to be absent. Rebuilt only when the
    GPU's capabilities change. Each link's traffic is read when ``per_link`` asks for it, or where the GPU
    lacks the all-links field and the total is their sum."""
    if dev.fields_version == dev.support_version:
        return dev.fields
    wanted = [("memory_temperature", FI_MEMORY_TEMP, 0)]
    wanted += [(f"throttle_time:{name}", fid, 0) for fid, name in THROTTLE_FIELDS.items()]
    wanted += [("pcie_bytes", FI_PCIE_TX, 0), ("pcie_bytes", FI_PCIE_RX, 0)]
    wanted += [("nvlink", FI_NVLINK_TX, UINT_MAX), ("nvlink", FI_NVLINK_RX, UINT_MAX)]
    for quantity, fids in FOLDED.items():
        if dev.support.get(quantity) not in SKIP:
            wanted += [(FOLD + quantity, fid, 0) for fid in fids]
    links = range(dev.info.nvlink_count)
    if dev.support.get("nvlink_state") not in SKIP:
        wanted += [(FOLD + "nvlink_state", FI_NVLINK_STATE, link) for link in links]
    if per_link or dev.support.get("nvlink") in SKIP:
        for link in links:
            wanted += [("nvlink_links", FI_NVLINK_TX, link), ("nvlink_links", FI_NVLINK_RX, link)]
    dev.fields = [p for p in wanted if dev.support.get(p[0]) not in SKIP]
    dev.fields_version = dev.support_version
    return dev.fields


def read(c: Calls, per_link: bool = False) -> Fields:
    """Values by (field id, scope id), in NVML's units. Each entry's own return code is classified."""
    dev = c.dev
    wanted = plan(dev, per_link)
    if not wanted:
        return {}
    raw = c.call("field_values", "nvmlDeviceGetFieldValues", dev.handle, [(fid, s) for _, fid, s in wanted])
    if raw is None:
        if dev.support.get("field_values") in SKIP:
            # no field API at all: every field quantity is absent
            for quantity, _, _ in wanted:
                c.absent(quantity, "nvmlDeviceGetFieldValues", Support.NOT_SUPPORTED)
            return {}
        return Failed()
    out: Fields = {}
    unsupported_links = inactive = 0
    for (quantity, fid, scope), (ret, value) in zip(wanted, codec.decode(raw), strict=True):
        if ret == pynvml.NVML_SUCCESS and value is not None:
            out[(fid, scope)] = value
            if dev.support.get(quantity) is not Support.SUPPORTED:
                dev.set_support(quantity, Support.SUPPORTED)
        elif ret in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION):
            if fid == FI_NVLINK_STATE:
                out[(fid, scope)] = INACTIVE  # one inactive link; all of them: the field is not there
                inactive += 1
            elif quantity.startswith(FOLD):
                # not in the batch here: the quantity's own call decides (and logs) whether it exists
                dev.set_support(quantity, Support.NOT_SUPPORTED)
            elif quantity == "nvlink_links":
                unsupported_links += 1  # one inactive link is not "NVLink unsupported"
            else:
                denied = ret == pynvml.NVML_ERROR_NO_PERMISSION
                state = Support.NO_PERMISSION if denied else Support.NOT_SUPPORTED
                c.absent(quantity, f"nvmlDeviceGetFieldValues[{fid}]", state)
        else:
            kind = error_kind(pynvml.NVMLError(ret))
            c.errors.append(ReadError(f"nvmlDeviceGetFieldValues[{fid}]", kind))
    if unsupported_links and unsupported_links == 2 * dev.info.nvlink_count:
        c.absent("nvlink_links", "nvmlDeviceGetFieldValues[138]", Support.NOT_SUPPORTED)
    if inactive and inactive == dev.info.nvlink_count:
        dev.set_support(FOLD + "nvlink_state", Support.NOT_SUPPORTED)  # its own calls decide, as above
    return out


def folded(c: Calls, fields: Fields, quantity: str) -> Any:
    """A folded quantity from the batch: one number, or a tuple in the order of its own call's answer; None
    when a field of it failed this sweep (counted); UNFOLDED when the batch does not carry it on this GPU."""
    dev = c.dev
    if dev.support.get(quantity) in SKIP:
        return None
    if dev.support.get(FOLD + quantity) in SKIP or isinstance(fields, Failed):
        return UNFOLDED
    got = [fields.get((fid, 0)) for fid in FOLDED[quantity]]
    values = [v for v in got if v is not None]
    if len(values) < len(got):
        return None
    if dev.support.get(quantity) is not Support.SUPPORTED:
        dev.set_support(quantity, Support.SUPPORTED)
    return values[0] if len(values) == 1 else tuple(int(v) for v in values)


def nvlinks(dev: NvmlDevice, fields: Fields) -> tuple[NvlinkReading, ...]:
    out = []
    for link in range(dev.info.nvlink_count):
        tx = scaled(fields.get((FI_NVLINK_TX, link)), KIB)
        rx = scaled(fields.get((FI_NVLINK_RX, link)), KIB)
        out.append(NvlinkReading(link, dev.link_states[link], tx, rx))
    return tuple(out)


def nvlink_totals(
    dev: NvmlDevice, fields: Fields, links: tuple[NvlinkReading, ...]
) -> tuple[float | None, float | None]:
    """Bytes over all links. The source never changes for a GPU: the all-links field, or, only where NVML
    lacks it, the sum of the links. Switching on a transient error would make the counter jump backwards
    (each link is rounded to KiB on its own), which Prometheus reads as a reset."""
    if dev.support.get("nvlink") not in SKIP:
        return (
            scaled(fields.get((FI_NVLINK_TX, UINT_MAX)), KIB),
            scaled(fields.get((FI_NVLINK_RX, UINT_MAX)), KIB),
        )
    if not links:
        return None, None
    return total([ln.transmit_bytes for ln in links]), total([ln.receive_bytes for ln in links])


def link_states(c: Calls, fields: Fields, every: int) -> None:
    """Each link's state: from the batch where it carries field 165; else from nvmlDeviceGetNvLinkState per
    link on every ``every``-th read (a call per link, so not every sweep)."""
    dev = c.dev
    if dev.support.get("nvlink_state") in SKIP:
        return
    if dev.support.get(FOLD + "nvlink_state") not in SKIP and not isinstance(fields, Failed):
        states = [fields.get((FI_NVLINK_STATE, link)) for link in range(dev.info.nvlink_count)]
        if any(s is None for s in states):
            dev.link_state_failures += 1
        else:
            dev.link_state_failures = 0
        # a link whose entry failed (counted by read()) keeps its last known state, one failed read being no
        # link down; for at most ``every`` reads in a row, after which its state is unknown (no series)
        stale = dev.link_state_failures >= every
        dev.link_states = [
            (None if stale else old) if s is None else (None if s == INACTIVE else int(s) in LINK_UP_STATES)
            for s, old in zip(states, dev.link_states, strict=True)
        ]
        if any(s is not None for s in states) and dev.support.get("nvlink_state") is not Support.SUPPORTED:
            dev.set_support("nvlink_state", Support.SUPPORTED)
        return
    # at once when the batch has just turned out not to carry the states, then now and then
    if dev.reads % every == 0 or all(s is None for s in dev.link_states):
        read_link_states(c)


def read_link_states(c: Calls) -> None:
    """Link state is read per link: NOT_SUPPORTED on one (an inactive link) leaves the others reported."""
    dev = c.dev
    absent = 0
    failed: list[int] = []
    for link in range(dev.info.nvlink_count):
        dev.begin("nvmlDeviceGetNvLinkState")
        try:
            state = c.nv.nvmlDeviceGetNvLinkState(dev.handle, link)
        except Exception as exc:  # classified below; none escapes
            if error_kind(exc) in ABSENT_ERRORS:  # an inactive link
                dev.link_states[link] = None
                absent += 1
            else:  # counted; the link keeps its last known state until the next try fails too
                c.failed("nvlink_state", "nvmlDeviceGetNvLinkState", exc)
                failed.append(link)
            continue
        finally:
            dev.end()
        c.ok += 1
        dev.link_states[link] = state == pynvml.NVML_FEATURE_ENABLED
    dev.link_state_failures = dev.link_state_failures + 1 if failed else 0
    if dev.link_state_failures >= 2:
        for link in failed:
            dev.link_states[link] = None
    if absent == dev.info.nvlink_count:
        c.absent("nvlink_state", "nvmlDeviceGetNvLinkState", Support.NOT_SUPPORTED)
    elif dev.support.get("nvlink_state") is not Support.SUPPORTED:
        dev.set_support("nvlink_state", Support.SUPPORTED)
