"""GPU models the simulator can impersonate, with the figures their datasheets and NVML report.

Which NVML quantities each model lacks is modelled on purpose (no fan on passively cooled boards, no HBM
temperature on GDDR boards, no cumulative PCIe byte counters before Hopper) so that the simulator exercises
the same NOT_SUPPORTED paths that real fleets do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from gpumon.gpu.sim.mig_layout import LayoutError, place

MiB = 1024 * 1024


@dataclass(frozen=True)
class SimModel:
    key: str
    nvml_name: str
    memory_mib: int
    reserved_mib: int
    tdp_watts: float
    idle_watts: float
    sm_clock_max_mhz: int
    sm_clock_idle_mhz: int
    memory_clock_mhz: int
    nvlinks: int
    nvlink_link_gbps: float  # per link, per direction, GB/s
    pcie_generation: int
    pcie_width: int = 16
    board_part_number: str = ""
    vbios: str = ""
    hbm: bool = True  # memory temperature (field 82) is reported for HBM parts
    fan: bool = False
    pcie_counters: bool = True  # fields 197/198
    # fields 74/76/269/270/271: every board seen reports them (H100, H200, L40S, RTX A6000 and GeForce
    # captures); the driver, not the board, decides, so no model lacks them by default
    throttle_time_fields: bool = True
    ecc: bool = True
    remapped_rows: bool = True
    mig: bool = False
    mig_layout: tuple[str, ...] = ()  # MIG instances (profiles such as "3g.40gb"); empty: MIG off
    # what real boards do at idle (docs/simulator.md says which entries a capture checked)
    memory_clock_idle_mhz: int | None = None  # None: the memory clock holds (HBM parts)
    pcie_idle_generation: int | None = None  # None: the link keeps its generation (datacenter boards)
    persistence: bool = True
    # HBM temperature = GPU temperature + a + b x load (load: power / TDP); fitted to the H100 capture
    hbm_offset_c: tuple[float, float] = (7.0, -12.0)
    pci_device_id: int = 0  # nvmlPciInfo_t.pciDeviceId, device id << 16 | 0x10DE

    @property
    def process_bytes(self) -> int:
        """HBM processes can hold: the board's memory less what the driver reserves."""
        return (self.memory_mib - self.reserved_mib) * MiB

    @property
    def gpm(self) -> bool:
        """GPU performance monitoring (nvmlGpm*) exists from Hopper on."""
        return self.nvml_name.startswith(("NVIDIA H1", "NVIDIA H2", "NVIDIA B"))


MODELS: dict[str, SimModel] = {
    m.key: m
    for m in (
        SimModel(
            "H100-SXM",
            "NVIDIA H100 80GB HBM3",
            81559,
            534,
            700.0,
            72.0,
            1980,
            345,
            2619,
            18,
            25.0,
            5,
            board_part_number="692-2G520-0200-000",
            vbios="96.00.99.00.01",
            mig=True,
            pci_device_id=0x233010DE,
        ),
        SimModel(
            "H100-PCIe",
            "NVIDIA H100 PCIe",
            81559,
            534,
            350.0,
            48.0,
            1755,
            345,
            1593,
            0,
            0.0,
            5,
            board_part_number="900-21010-0000-000",
            vbios="96.00.30.00.01",
            mig=True,
            pci_device_id=0x233110DE,
        ),
        SimModel(
            "H100-NVL",
            "NVIDIA H100 NVL",
            95830,
            534,
            400.0,
            55.0,
            1785,
            345,
            2619,
            12,
            25.0,
            5,
            board_part_number="900-21010-0020-000",
            vbios="96.00.81.00.01",
            mig=True,
            pci_device_id=0x232110DE,
        ),
        # checked against a real H200 (tests/fixtures/captures/h200-*.json, driver 580.159.04): 615 MiB
        # reserved, 80-82 W idle, HBM as warm as the GPU at idle and ~14 °C cooler under load
        SimModel(
            "H200",
            "NVIDIA H200",
            143771,
            615,
            700.0,
            80.0,
            1980,
            345,
            3201,
            18,
            25.0,
            5,
            board_part_number="692-2G520-0282-000",
            vbios="96.00.A5.00.1A",
            mig=True,
            pci_device_id=0x233510DE,
            hbm_offset_c=(0.0, -15.0),
        ),
        SimModel(
            "A100-SXM4-80GB",
            "NVIDIA A100-SXM4-80GB",
            81920,
            489,
            400.0,
            55.0,
            1410,
            210,
            1593,
            12,
            25.0,
            4,
            board_part_number="692-2G506-0210-002",
            vbios="92.00.36.00.02",
            pcie_counters=False,
            mig=True,
            pci_device_id=0x20B210DE,
        ),
        SimModel(
            "A100-PCIe",
            "NVIDIA A100 80GB PCIe",
            81920,
            489,
            300.0,
            45.0,
            1410,
            210,
            1512,
            0,
            0.0,
            4,
            board_part_number="900-21001-0020-100",
            vbios="92.00.68.00.01",
            pcie_counters=False,
            mig=True,
            pci_device_id=0x20B510DE,
        ),
        SimModel(
            "L40S",
            "NVIDIA L40S",
            46068,
            495,
            350.0,
            35.0,
            2520,
            210,
            9001,
            0,
            0.0,
            4,
            board_part_number="900-2G133-0080-000",
            vbios="95.02.66.00.02",
            hbm=False,
            pcie_counters=False,
            pci_device_id=0x26B910DE,
            memory_clock_idle_mhz=405,
            persistence=False,
        ),
        SimModel(
            "L4",
            "NVIDIA L4",
            23034,
            385,
            72.0,
            16.0,
            2040,
            210,
            6251,
            0,
            0.0,
            4,
            board_part_number="900-2G193-0000-001",
            vbios="95.04.5B.00.02",
            hbm=False,
            pcie_counters=False,
            pci_device_id=0x27B810DE,
        ),
        SimModel(
            "RTX-A6000",
            "NVIDIA RTX A6000",
            49140,
            420,
            300.0,
            22.0,
            2100,
            210,
            8001,
            0,
            0.0,
            4,
            board_part_number="900-5G133-2200-000",
            vbios="94.02.5C.00.02",
            hbm=False,
            fan=True,
            pcie_counters=False,
            ecc=False,
            remapped_rows=False,
            pci_device_id=0x223010DE,
            pcie_idle_generation=1,
        ),
        SimModel(
            "B200",
            "NVIDIA B200",
            183359,
            1056,
            1000.0,
            140.0,
            1965,
            345,
            3996,
            18,
            50.0,
            6,
            board_part_number="692-2G525-0200-000",
            vbios="97.00.6F.00.01",
            mig=True,
            pci_device_id=0x290110DE,
        ),
        # The boards below come from datasheets and NVML's names for them, not from a capture of the board
        # (docs/simulator.md): memory as NVML reports it for the part, its power limit, clocks and links.
        SimModel(
            "A100-SXM4-40GB",
            "NVIDIA A100-SXM4-40GB",
            40960,
            489,
            400.0,
            52.0,
            1410,
            210,
            1215,
            12,
            25.0,
            4,
            pcie_counters=False,
            mig=True,
            pci_device_id=0x20B010DE,
        ),
        SimModel(
            "H800",
            "NVIDIA H800 80GB HBM3",
            81559,
            534,
            700.0,
            72.0,
            1980,
            345,
            2619,
            8,  # the export part: 400 GB/s of NVLink instead of 900
            25.0,
            5,
            mig=True,
            pci_device_id=0x232410DE,
        ),
        SimModel(
            "H20",
            "NVIDIA H20",
            97871,
            534,
            400.0,
            60.0,
            1980,
            345,
            2619,
            18,
            25.0,
            5,
            mig=True,
            pci_device_id=0x232910DE,
        ),
        SimModel(
            "GH200",
            "NVIDIA GH200 480GB",  # named for the superchip's memory; the GPU has 96 GB of HBM3
            97871,
            534,
            900.0,
            90.0,
            1980,
            345,
            2619,
            18,
            25.0,
            5,
            pci_device_id=0x234210DE,
        ),
        SimModel(
            "GB200",
            "NVIDIA GB200",
            189471,
            1056,
            1200.0,
            160.0,
            2062,
            345,
            3996,
            18,
            50.0,
            6,
            pci_device_id=0x294110DE,
        ),
        SimModel(
            "L40",
            "NVIDIA L40",
            46068,
            495,
            300.0,
            32.0,
            2490,
            210,
            9001,
            0,
            0.0,
            4,
            hbm=False,
            pcie_counters=False,
            pci_device_id=0x26B510DE,
            memory_clock_idle_mhz=405,
            persistence=False,
        ),
        SimModel(
            "A10G",
            "NVIDIA A10G",
            23028,
            356,
            300.0,
            18.0,
            1710,
            210,
            6251,
            0,
            0.0,
            4,
            hbm=False,
            pcie_counters=False,
            remapped_rows=False,
            pci_device_id=0x223710DE,
            memory_clock_idle_mhz=405,
        ),
    )
}

ALIASES = {
    "H100": "H100-SXM",
    "H100-SXM5": "H100-SXM",
    "H200-SXM": "H200",
    "A100": "A100-SXM4-80GB",
    "A100-SXM": "A100-SXM4-80GB",
    "A100-40GB": "A100-SXM4-40GB",
    "H800-SXM": "H800",
}

_GROUP = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9][A-Za-z0-9-]*)(?:/mig=([\w.+]+))?\s*$")


class SpecError(ValueError):
    pass


def lookup(key: str) -> SimModel:
    for candidate in (key, ALIASES.get(key), ALIASES.get(key.upper())):
        if candidate and candidate in MODELS:
            return MODELS[candidate]
    by_upper = {k.upper(): m for k, m in MODELS.items()}
    if key.upper() in by_upper:
        return by_upper[key.upper()]
    raise SpecError(f"unknown GPU model {key!r}; known: {', '.join(MODELS)}")


def _with_mig(model: SimModel, layout: str, spec: str) -> SimModel:
    profiles = tuple(layout.split("+"))
    if not model.mig:
        raise SpecError(f"bad simulation spec {spec!r}: {model.key} has no MIG")
    try:
        place(model.key, model.memory_mib, profiles)
    except LayoutError as exc:
        raise SpecError(f"bad simulation spec {spec!r}: {exc}") from None
    return replace(model, mig_layout=profiles)


def parse_spec(spec: str) -> list[SimModel]:
    """``"8xH100-SXM"``, ``"4xH100-SXM,2xL4"`` or ``"1xH100-SXM/mig=3g.40gb+3g.40gb"`` → one model per
    simulated GPU, in index order."""
    gpus: list[SimModel] = []
    for part in spec.split(","):
        match = _GROUP.match(part)
        if not match:
            raise SpecError(f"bad simulation spec {spec!r}: expected COUNTxMODEL, e.g. 8xH100-SXM")
        count = int(match.group(1) or 1)
        if not 1 <= count <= 64:
            raise SpecError(f"bad simulation spec {spec!r}: GPU count must be 1..64")
        model = lookup(match.group(2))
        if match.group(3):
            model = _with_mig(model, match.group(3), spec)
        gpus.extend([model] * count)
    if len(gpus) > 64:
        raise SpecError(f"bad simulation spec {spec!r}: at most 64 GPUs per node")
    return gpus
