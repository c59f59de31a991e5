"""A catalogue of NVIDIA XID error codes: what each means, how bad it is, and what an operator should do.

The NVIDIA driver writes an XID to the kernel log whenever the GPU reports an error. The number alone is
rarely enough to find a root cause, but it is enough to decide who has to act: the owner of the job, or the
owner of the node. That decision is what this table encodes.

Sources (read 2026-11):

* NVIDIA, *Analyzing Xid Errors with the Xid Catalog* (Ampere and newer), which gives every code a
  description and an immediate and an investigatory "resolution bucket":
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
* NVIDIA, *Xid Errors* for Volta and older GPUs, for the codes the catalog above marks "Unused" on newer
  GPUs but that older boards still log (56, 57, 61, 122, 123):
  https://docs.nvidia.com/deploy/xid-errors/archive/index.html

Severity is derived from the catalog's immediate action, so that it stays checkable against the source:
RESET_GPU, RESTART_BM (reboot), CHECK_MECHANICALS, UPDATE_SWFW and RESTART_VM need an operator and are
CRITICAL; RESTART_APP is WARNING; IGNORE is WARNING when the catalog still wants the event investigated
and INFO when it calls the event harmless, a test, or corrected. Where the action hides in a decode
(Xid 144 to 150, 154) the entry says so; codes with no bucket at all (the older-GPU ones, 162 to 172)
take the severity their trigger text implies. Codes the catalog leaves without a usable meaning or action
(marked Unused, or CC-only and DLA-only ones) are left out on purpose: an unknown code gets
:func:`lookup`'s generic entry rather than a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
LEGACY_URL = "https://docs.nvidia.com/deploy/xid-errors/archive/index.html"
SOURCES_DATE = "2026-11"


class Severity(str, Enum):
    INFO = "info"  # nothing to do
    WARNING = "warning"  # likely the application, or transient: the job owner looks first
    CRITICAL = "critical"  # the GPU or node needs an operator: reset, reboot, drain, re-cable or RMA


class Cause(str, Enum):
    APPLICATION = "application"  # a bug or an abort in the user's program; the GPU stays healthy
    DRIVER = "driver"  # NVIDIA software, including firmware the driver runs on the GPU (GSP, FECS)
    HARDWARE = "hardware"  # a GPU unit or engine failed
    NVLINK = "nvlink"  # NVLink, NVLink-C2C or the NVLink fabric
    MEMORY = "memory"  # ECC, row remapping, page retirement
    THERMAL_POWER = "thermal_power"  # power delivery, power smoothing
    SYSTEM = "system"  # PCIe bus, InfoROM and flash, platform; also driver summaries of other XIDs


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    description: str
    severity: Severity
    cause: Cause
    action: str


# The catalog's resolution buckets, phrased as instructions; shared so that one bucket reads the same
# everywhere.
_RESTART_APP = "restart the application"
_RESTART_APP_SUPPORT = "restart the application; contact support if it repeats"
_RESTART_APP_DEBUG = "restart the application; debug it with compute-sanitizer or cuda-gdb"
_RESTART_APP_CHECK = "restart the application; check what it sends to the GPU"
_RESET_GPU_SUPPORT = "reset GPU; contact support if it repeats"
_WATCH_SUPPORT = "none now; contact support if it repeats"
_INFORMATIONAL = "none: informational"

_S, _C = Severity, Cause  # short aliases keep the table rows short


def _engine_errors() -> Iterable[XidInfo]:
    """The copy, video and optical-flow engine exceptions: one bucket (RESTART_APP, then CONTACT_SUPPORT)."""
    copy_engines = {39: 0, 40: 1, 41: 2, 70: 3, 71: 4, 72: 5, 75: 6, 76: 7, 77: 8, 85: 9}
    copy_engines.update({126 + i: 10 + i for i in range(10)})
    for code, n in copy_engines.items():
        yield XidInfo(code, f"Copy engine CE{n} exception", _S.WARNING, _C.HARDWARE, _RESTART_APP_SUPPORT)
    decoders = {68: 0, 83: 1, 84: 2, 88: 3, 89: 4, 96: 5, 97: 6, 98: 7}
    for code, n in decoders.items():
        yield XidInfo(
            code, f"NVDEC{n} video decoder exception", _S.WARNING, _C.HARDWARE, _RESTART_APP_SUPPORT
        )
    jpeg = {82: 0, 99: 1, 100: 2, 101: 3, 102: 4, 103: 5, 104: 6, 105: 7}
    for code, n in jpeg.items():
        yield XidInfo(code, f"NVJPG{n} JPEG engine exception", _S.WARNING, _C.HARDWARE, _RESTART_APP_SUPPORT)
    yield XidInfo(86, "OFA0 optical flow engine exception", _S.WARNING, _C.HARDWARE, _RESTART_APP_SUPPORT)
    yield XidInfo(139, "OFA1 optical flow engine exception", _S.WARNING, _C.HARDWARE, _RESTART_APP_SUPPORT)
    # The only engine whose immediate bucket is CONTACT_SUPPORT rather than RESTART_APP.
    yield XidInfo(142, "NVENC3 video encoder error", _S.WARNING, _C.HARDWARE, "contact support")


_ENTRIES: tuple[XidInfo, ...] = (
    # --- Channel and graphics-engine errors: mostly the application's own doing.
    XidInfo(8, "GPU stopped processing (channel idle timeout)", _S.WARNING, _C.DRIVER, _RESTART_APP_SUPPORT),
    XidInfo(11, "Invalid or corrupted push buffer stream", _S.WARNING, _C.APPLICATION, _RESTART_APP_CHECK),
    XidInfo(
        13,
        "Graphics engine exception, usually an application fault",
        _S.WARNING,
        _C.APPLICATION,
        _RESTART_APP_DEBUG,
    ),
    XidInfo(
        14, "Fake or injected error from userspace", _S.INFO, _C.APPLICATION, "none: injected on purpose"
    ),
    XidInfo(25, "Invalid or illegal push buffer stream", _S.WARNING, _C.APPLICATION, _RESTART_APP_CHECK),
    XidInfo(
        31,
        "GPU memory page fault: illegal address access, usually the application",
        _S.WARNING,
        _C.APPLICATION,
        _RESTART_APP_DEBUG,
    ),
    # NVIDIA: PBDMA faults are mostly PCIe quality problems, not the application.
    XidInfo(
        32,
        "Invalid or corrupted push buffer stream (PBDMA fault, often PCIe)",
        _S.WARNING,
        _C.SYSTEM,
        "restart the application; check PCIe health if it repeats",
    ),
    XidInfo(
        37,
        "Driver firmware error: unimplemented firmware method",
        _S.WARNING,
        _C.APPLICATION,
        "none on the GPU; check what the application sends to it",
    ),
    XidInfo(38, "Driver firmware error: FECS watchdog timeout", _S.WARNING, _C.DRIVER, _WATCH_SUPPORT),
    XidInfo(
        43,
        "GPU stopped processing: application hit a software-induced fault",
        _S.WARNING,
        _C.APPLICATION,
        "none on the GPU, which stays healthy; check the application",
    ),
    XidInfo(44, "Graphics engine fault during context switch", _S.WARNING, _C.DRIVER, _WATCH_SUPPORT),
    # Ctrl-C, SIGKILL and GPU resets log 45 too; the catalog asks for action (restart Fabric Manager) only
    # when it comes alone.
    XidInfo(
        45,
        "Preemptive cleanup: application aborted or torn down after another error",
        _S.WARNING,
        _C.APPLICATION,
        "follow the other XIDs logged with it; alone, restart Fabric Manager",
    ),
    XidInfo(46, "GPU stopped processing (GPU timeout)", _S.CRITICAL, _C.DRIVER, _RESET_GPU_SUPPORT),
    XidInfo(60, "Video processor exception (SEC2)", _S.WARNING, _C.DRIVER, _RESTART_APP),
    XidInfo(
        66,
        "Illegal access by driver (FECS register access violation)",
        _S.WARNING,
        _C.DRIVER,
        "none now; report it to NVIDIA if it repeats",
    ),
    XidInfo(
        67, "Illegal access by driver (FECS verification violation)", _S.WARNING, _C.DRIVER, _WATCH_SUPPORT
    ),
    XidInfo(69, "Graphics engine class error", _S.WARNING, _C.APPLICATION, _RESTART_APP_CHECK),
    XidInfo(
        80, "Corrupted data sent to GPU (push buffer CRC mismatch)", _S.WARNING, _C.SYSTEM, _RESTART_APP_CHECK
    ),
    XidInfo(109, "Context switch timeout", _S.CRITICAL, _C.DRIVER, _RESET_GPU_SUPPORT),
    XidInfo(
        137,
        "NVLink privilege error: illegal peer-to-peer access, usually the application",
        _S.WARNING,
        _C.APPLICATION,
        "debug the application with compute-sanitizer or cuda-gdb",
    ),
    XidInfo(141, "CUDA fast path error", _S.WARNING, _C.DRIVER, _WATCH_SUPPORT),
    XidInfo(160, "Channel retirement event", _S.WARNING, _C.DRIVER, "none now; investigate the software"),
    XidInfo(161, "Channel retirement failure", _S.WARNING, _C.DRIVER, "none now; investigate the software"),
    # --- GPU-resident firmware and micro-controllers.
    XidInfo(
        61,
        "Internal micro-controller breakpoint or warning (older GPUs)",
        _S.WARNING,
        _C.DRIVER,
        _WATCH_SUPPORT,
    ),
    XidInfo(62, "Internal micro-controller (PMU) halt", _S.CRITICAL, _C.HARDWARE, _RESET_GPU_SUPPORT),
    XidInfo(
        119,
        "GSP RPC timeout: the GPU System Processor stopped answering",
        _S.CRITICAL,
        _C.DRIVER,
        "reset GPU; power-cycle the node if it persists",
    ),
    XidInfo(
        120,
        "GSP error in code running on the GPU System Processor",
        _S.CRITICAL,
        _C.DRIVER,
        "reset GPU; power-cycle the node if it persists",
    ),
    XidInfo(143, "GPU initialization error", _S.CRITICAL, _C.HARDWARE, _RESET_GPU_SUPPORT),
    XidInfo(151, "Key rotation error", _S.CRITICAL, _C.DRIVER, "restart the VM that owns the GPU"),
    XidInfo(158, "GPU fatal timeout", _S.CRITICAL, _C.HARDWARE, _RESET_GPU_SUPPORT),
    # --- Memory: ECC, containment, row remapping.
    XidInfo(
        48,
        "Double-bit ECC error: uncorrectable memory error",
        _S.CRITICAL,
        _C.MEMORY,
        "reset GPU; drain and reset if Xid 63 or 64 came with it",
    ),
    XidInfo(
        63,
        "GPU memory row remapping or page retirement event",
        _S.INFO,
        _C.MEMORY,
        "none now; the remap applies at the next GPU reset",
    ),
    XidInfo(
        64, "GPU memory row remapping or page retirement failure", _S.CRITICAL, _C.MEMORY, _RESET_GPU_SUPPORT
    ),
    XidInfo(92, "High single-bit ECC error rate", _S.WARNING, _C.MEMORY, _WATCH_SUPPORT),
    XidInfo(
        94,
        "Contained memory error: only the faulting application is affected",
        _S.WARNING,
        _C.MEMORY,
        "restart the application; reset GPU when convenient",
    ),
    XidInfo(
        95,
        "Uncontained memory error: several applications are affected",
        _S.CRITICAL,
        _C.MEMORY,
        "drain the GPU and reset it before restarting applications",
    ),
    XidInfo(
        140,
        "Uncorrectable memory error escaped page offlining and row remapping",
        _S.CRITICAL,
        _C.MEMORY,
        _RESET_GPU_SUPPORT,
    ),
    XidInfo(156, "Resource retirement event", _S.CRITICAL, _C.MEMORY, "reset GPU to apply the retirement"),
    XidInfo(
        157,
        "Resource retirement failure: no spare resources left to repair",
        _S.WARNING,
        _C.MEMORY,
        "contact support; the same XID may recur",
    ),
    XidInfo(
        168,
        "Errors found in the write-protected region while ECC is disabled",
        _S.WARNING,
        _C.MEMORY,
        "enable ECC, or reboot with the protected region shifted",
    ),
    XidInfo(
        171,
        "Uncorrectable DRAM error: details for an Xid 48",
        _S.CRITICAL,
        _C.MEMORY,
        "follow the Xid 48 guidance",
    ),
    XidInfo(
        172,
        "Uncorrectable SRAM error: details for an Xid 48",
        _S.CRITICAL,
        _C.MEMORY,
        "follow the Xid 48 guidance; check the SRAM RMA threshold",
    ),
    XidInfo(
        57,
        "Error programming video memory interface (older GPUs)",
        _S.WARNING,
        _C.MEMORY,
        _WATCH_SUPPORT,
    ),
    # --- NVLink and NVLink-C2C.
    XidInfo(
        74,
        "NVLink error on a link to another GPU or NVSwitch",
        _S.CRITICAL,
        _C.NVLINK,
        "check NVLink cabling and reset GPU; contact support if it persists",
    ),
    XidInfo(
        121,
        "Corrected errors on the C2C NVLink to the Grace CPU",
        _S.INFO,
        _C.NVLINK,
        "none now; reset GPU at the next service window",
    ),
    XidInfo(
        136, "NVLink link training failed", _S.CRITICAL, _C.NVLINK, "reset GPU; check NVLink signal integrity"
    ),
    # 144 to 150 are NVLink 5 units: the driver marks each message fatal or non-fatal, and the catalog's
    # decode table resets the GPU only for the fatal ones, so the code alone is a warning unless every
    # documented sub-case of it is fatal (150) or nearly every one is (149).
    XidInfo(144, "NVLink SAW error", _S.WARNING, _C.NVLINK, "decode the message; reset GPU if it is fatal"),
    XidInfo(145, "NVLink RLW error", _S.WARNING, _C.NVLINK, "decode the message; reset GPU if it is fatal"),
    XidInfo(146, "NVLink TLW error", _S.WARNING, _C.NVLINK, "decode the message; reset GPU if it is fatal"),
    XidInfo(147, "NVLink TREX error", _S.INFO, _C.NVLINK, _WATCH_SUPPORT),
    XidInfo(148, "NVLink NVLPW_CTRL error", _S.INFO, _C.NVLINK, _WATCH_SUPPORT),
    XidInfo(
        149,
        "NVLink NETIR error: link down, bit-error-rate or MFDE event",
        _S.CRITICAL,
        _C.NVLINK,
        "reset GPU; check NVLink cables and the peer device",
    ),
    XidInfo(
        150, "NVLink MSE error: firmware degraded or watchdog", _S.CRITICAL, _C.NVLINK, _RESET_GPU_SUPPORT
    ),
    XidInfo(
        155,
        "NVLink link down flagged as intentional (software defined)",
        _S.CRITICAL,
        _C.NVLINK,
        "reset GPU; find out who took the link down",
    ),
    XidInfo(
        159,
        "CHI non-data error on a C2C-connected GPU",
        _S.WARNING,
        _C.NVLINK,
        "reset GPU if UVM or vGPU is in use; otherwise none",
    ),
    # --- PCIe, platform, power.
    XidInfo(
        79,
        "GPU has fallen off the bus: not reachable over PCIe",
        _S.CRITICAL,
        _C.SYSTEM,
        "drain and reboot the node; contact support if it repeats",
    ),
    XidInfo(
        54,
        "Auxiliary power is not connected to the GPU board",
        _S.CRITICAL,
        _C.THERMAL_POWER,
        "check power cabling and board seating",
    ),
    XidInfo(
        162, "Power smoothing circuitry capability re-engaged", _S.INFO, _C.THERMAL_POWER, _INFORMATIONAL
    ),
    XidInfo(
        163,
        "Power smoothing circuitry capability disengaged",
        _S.WARNING,
        _C.THERMAL_POWER,
        "resolve thermal events; reset GPU if it was a timeout",
    ),
    XidInfo(
        164,
        "Power smoothing circuitry low lifetime reached",
        _S.WARNING,
        _C.THERMAL_POWER,
        "watch power swings; plan GPU replacement if smoothing is needed",
    ),
    XidInfo(
        165,
        "Power smoothing circuitry lifetime exhausted",
        _S.WARNING,
        _C.THERMAL_POWER,
        "replace the GPU if power swings are not acceptable",
    ),
    XidInfo(
        93,
        "InfoROM wear limit reached (non-fatal)",
        _S.INFO,
        _C.SYSTEM,
        "clear the InfoROM erase limit with nvflash",
    ),
    XidInfo(106, "SMBPBI test message", _S.INFO, _C.SYSTEM, _INFORMATIONAL),
    XidInfo(107, "SMBPBI test message (silent)", _S.INFO, _C.SYSTEM, _INFORMATIONAL),
    XidInfo(122, "SPI PMU RPC read failure (older GPUs)", _S.WARNING, _C.SYSTEM, _WATCH_SUPPORT),
    XidInfo(123, "SPI PMU RPC write failure (older GPUs)", _S.WARNING, _C.SYSTEM, _WATCH_SUPPORT),
    # NVIDIA: revert recent hardware changes and cold-reset; uncommon unless hardware has failed.
    XidInfo(
        110,
        "Security fault error",
        _S.CRITICAL,
        _C.HARDWARE,
        "cold-reset the node; contact the vendor if it persists",
    ),
    XidInfo(
        78,
        "vGPU start error: guest and host drivers or vGPU type incompatible",
        _S.CRITICAL,
        _C.DRIVER,
        "update driver and firmware to compatible versions",
    ),
    XidInfo(56, "Display engine error (older GPUs)", _S.WARNING, _C.HARDWARE, _WATCH_SUPPORT),
    # Xid 154 restates, in its text, the recovery the driver wants for other XIDs (None, Drain P2P, Drain
    # and Reset, GPU Reset Required, Node Reboot Required): the code alone cannot say which.
    XidInfo(
        154,
        "GPU recovery action changed: summarises the action for other XIDs",
        _S.WARNING,
        _C.SYSTEM,
        "follow the recovery action named in the message",
    ),
    *_engine_errors(),
)


def _index(entries: Iterable[XidInfo]) -> dict[int, XidInfo]:
    table: dict[int, XidInfo] = {}
    for info in entries:
        if info.code in table:
            raise ValueError(f"XID {info.code} is catalogued twice")
        table[info.code] = info
    return dict(sorted(table.items()))


CATALOGUE: Mapping[int, XidInfo] = MappingProxyType(_index(_ENTRIES))


def lookup(code: int) -> XidInfo:
    """The catalogue entry for `code`, or a generic one: an XID we do not know is still worth a look."""
    info = CATALOGUE.get(code)
    if info is not None:
        return info
    return XidInfo(
        code,
        f"unknown XID {code}",
        Severity.WARNING,
        Cause.SYSTEM,
        "look up the code in NVIDIA's XID catalogue",
    )


def as_json(code: int) -> dict[str, object]:
    info = lookup(code)
    return {
        "code": info.code,
        "description": info.description,
        "severity": info.severity.value,
        "cause": info.cause.value,
        "action": info.action,
    }


def render_markdown() -> str:
    lines = [
        "## XID catalogue",
        "",
        "What gpumon knows about the XID codes the NVIDIA driver writes to the kernel log. Sources, read in",
        f"{SOURCES_DATE}:",
        "",
        f"- NVIDIA, [Analyzing Xid Errors with the Xid Catalog]({CATALOG_URL}), Ampere and newer GPUs:",
        "  descriptions and resolution buckets for most codes.",
        f"- NVIDIA, [Xid Errors for Volta and older GPUs]({LEGACY_URL}): codes 56, 57, 61, 122 and 123,",
        "  which the catalog marks unused on newer GPUs.",
        "",
        "Severity follows the catalog's immediate action: *critical* when the GPU or node needs an operator",
        "(reset, reboot, drain, cabling, RMA), *warning* when the application or a transient fault is the",
        "likely cause, *info* when nothing needs doing. A code not listed here is reported as unknown, with",
        "severity warning.",
        "",
        "| Code | Description | Severity | Cause | Action |",
        "| ---: | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {i.code} | {i.description} | {i.severity.value} | {i.cause.value} | {i.action} |"
        for i in CATALOGUE.values()
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_markdown(), end="")
