"""Record, on a real GPU, each quantity gpumon reads with a dedicated NVML call next to the field value that
could carry it in the one batched ``nvmlDeviceGetFieldValues`` call (issue 18: the fewest NVML calls).

The output is a gpumon capture (docs/captures.md, masked): tests/gpu/capture/test_field_probe.py compares,
round by round, each field with its dedicated call, so folding a call into the batch rests on what real
boards answer rather than on the documentation.

    python bench/device/field_probe.py --rounds 5 --out h200-fields.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys
import time
from pathlib import Path

import pynvml

from gpumon.gpu.capture import Capture, RecordingNvml, dump, mask
from gpumon.gpu.sim import SimNvml

# field id → (dedicated op, its extra arguments): what the field should equal
FIELDS: dict[int, tuple[str, tuple[int, ...]]] = {
    pynvml.NVML_FI_DEV_ENERGY: ("nvmlDeviceGetTotalEnergyConsumption", ()),
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (
        "nvmlDeviceGetTotalEccErrors",
        (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    ),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (
        "nvmlDeviceGetTotalEccErrors",
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    ),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (
        "nvmlDeviceGetTotalEccErrors",
        (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
    ),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (
        "nvmlDeviceGetTotalEccErrors",
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
    ),
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: ("nvmlDeviceGetPcieReplayCounter", ()),
    pynvml.NVML_FI_DEV_REMAPPED_COR: ("nvmlDeviceGetRemappedRows", ()),
    pynvml.NVML_FI_DEV_REMAPPED_UNC: ("nvmlDeviceGetRemappedRows", ()),
    pynvml.NVML_FI_DEV_REMAPPED_PENDING: ("nvmlDeviceGetRemappedRows", ()),
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: ("nvmlDeviceGetRemappedRows", ()),
    pynvml.NVML_FI_DEV_POWER_AVERAGE: ("nvmlDeviceGetPowerUsage", ()),
    pynvml.NVML_FI_DEV_POWER_INSTANT: ("nvmlDeviceGetPowerUsage", ()),
    pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: ("nvmlDeviceGetEnforcedPowerLimit", ()),
}


def probe(rounds: int, gap: float, simulate: str | None = None) -> Capture:
    nv = RecordingNvml(SimNvml(simulate) if simulate else pynvml)
    nv.nvmlInit()
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        for h in handles:
            nv.nvmlDeviceGetUUID(h)
            nv.nvmlDeviceGetName(h)
        for r in range(rounds):
            if r:
                time.sleep(gap)
            for h in handles:
                # the dedicated calls just before and just after the batch bracket it in time
                for op, args in dict.fromkeys(FIELDS.values()):
                    _call(nv, op, h, *args)
                nv.nvmlDeviceGetFieldValues(h, list(FIELDS))
                for op, args in dict.fromkeys(FIELDS.values()):
                    _call(nv, op, h, *args)
    finally:
        nv.nvmlShutdown()
    meta = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": "sim" if simulate else "nvml",
        "probe": "field values next to their dedicated calls (bench/device/field_probe.py)",
        "sweeps": rounds,
        "interval_seconds": gap,
        "masked": False,
    }
    return mask(Capture(meta, nv.calls))


def _call(nv: RecordingNvml, op: str, *args: object) -> None:
    with contextlib.suppress(pynvml.NVMLError):  # recorded all the same: NOT_SUPPORTED is an answer
        getattr(nv, op)(*args)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--gap", type=float, default=1.0, help="seconds between rounds")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--simulate", metavar="SPEC", help="the simulator instead of real NVML (to try it)")
    a = p.parse_args()
    a.out.write_text(dump(probe(a.rounds, a.gap, a.simulate)))
    print(f"field probe: {a.rounds} rounds written to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
