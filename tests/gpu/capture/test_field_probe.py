"""Which dedicated NVML calls the batched nvmlDeviceGetFieldValues can replace, checked on a real H200
(tests/fixtures/field-probes/, recorded by bench/device/field_probe.py on driver 580.159.04, idle and under
bf16 products). Each field is compared with its dedicated call made just before and just after the batch:
issue 18 folds a call only where this holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest
from support.helpers import ROOT

from gpumon.gpu.capture import load

PROBES = sorted((ROOT / "tests" / "fixtures" / "field-probes").glob("*.json"))
ECC = {
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (0, 0),  # (error type, counter type) of nvmlDeviceGetTotalEccErrors
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (1, 0),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (0, 1),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (1, 1),
}
REMAPPED = {  # position in nvmlDeviceGetRemappedRows' (correctable, uncorrectable, pending, failure)
    pynvml.NVML_FI_DEV_REMAPPED_COR: 0,
    pynvml.NVML_FI_DEV_REMAPPED_UNC: 1,
    pynvml.NVML_FI_DEV_REMAPPED_PENDING: 2,
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: 3,
}


def rounds(path: Path) -> list[tuple[dict[Any, Any], dict[int, Any], dict[Any, Any]]]:
    """Per batch: the dedicated answers just before it, its fields, the dedicated answers just after."""
    calls = load(str(path)).calls
    out = []
    for i, c in enumerate(calls):
        if c["op"] != "nvmlDeviceGetFieldValues":
            continue
        fields = {}
        for item in c["value"]["items"]:
            f = item["fields"]
            assert f["nvmlReturn"] == pynvml.NVML_SUCCESS, f  # the real board answers every one
            fields[f["fieldId"]] = f["value"]
        before, after = _around(calls, i, -1), _around(calls, i, 1)
        out.append((before, fields, after))
    assert out
    return out


def _around(calls: list[dict[str, Any]], i: int, step: int) -> dict[Any, Any]:
    found: dict[Any, Any] = {}
    j = i + step
    while 0 <= j < len(calls) and calls[j]["op"] not in ("nvmlDeviceGetFieldValues", "nvmlDeviceGetName"):
        c = calls[j]
        found.setdefault((c["op"], tuple(c["args"][1:])), c.get("value"))  # the nearest answer
        j += step
    return found


@pytest.mark.parametrize("path", PROBES, ids=[p.stem for p in PROBES])
def test_counters_in_the_batch_are_the_dedicated_calls_counters(path: Path) -> None:
    for before, fields, after in rounds(path):
        energy = [d[("nvmlDeviceGetTotalEnergyConsumption", ())] for d in (before, after)]
        assert energy[0] <= fields[pynvml.NVML_FI_DEV_ENERGY] <= energy[1]  # mJ, the same counter
        for fid, (kind, counter) in ECC.items():
            assert fields[fid] == before[("nvmlDeviceGetTotalEccErrors", (kind, counter))]
        assert (
            fields[pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER] == before[("nvmlDeviceGetPcieReplayCounter", ())]
        )
        rows = before[("nvmlDeviceGetRemappedRows", ())]["tuple"]
        for fid, at in REMAPPED.items():
            assert fields[fid] == rows[at]


@pytest.mark.parametrize("path", PROBES, ids=[p.stem for p in PROBES])
def test_power_usage_is_the_average_field_and_the_limit_the_current_limit(path: Path) -> None:
    """nvmlDeviceGetPowerUsage is the 1 s average on Hopper (field 185, to the milliwatt), not the
    instantaneous draw (186, up to ~9 % apart under load); the enforced limit is field 190."""
    for before, fields, after in rounds(path):
        usage = {before[("nvmlDeviceGetPowerUsage", ())], after[("nvmlDeviceGetPowerUsage", ())]}
        assert fields[pynvml.NVML_FI_DEV_POWER_AVERAGE] in usage
        limits = {
            before[("nvmlDeviceGetEnforcedPowerLimit", ())],
            after[("nvmlDeviceGetEnforcedPowerLimit", ())],
        }
        assert fields[pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT] in limits
