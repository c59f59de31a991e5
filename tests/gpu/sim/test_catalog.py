"""The simulator's catalogue: the boards fleets run, under the names NVML gives them, each with the peak the
reference table has for that name (or none, where it has none), and the MIG profiles each board offers."""

from __future__ import annotations

import pytest

from gpumon.gpu.sim.catalog import MODELS, SpecError, parse_spec
from gpumon.gpu.sim.mig_layout import PROFILE_GB, profiles
from gpumon.jobs.peaks import peak_flops

# NVML name → dense BF16 TFLOP/s in ../shared/REFERENCE.md's table (None: the table has no row for it)
BF16 = {
    "NVIDIA H100 80GB HBM3": 989.5,
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.5,
    "NVIDIA H200": 989.5,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA H800 80GB HBM3": 989.5,
    "NVIDIA H20": 148.0,
    "NVIDIA GH200 480GB": 989.5,
    "NVIDIA GB200": 2500.0,
    "NVIDIA B200": 2250.0,
    "NVIDIA L40S": 362.0,
    "NVIDIA L40": 181.0,
    "NVIDIA L4": 121.0,
    "NVIDIA A10G": None,  # AWS's part: no NVIDIA datasheet, so no borrowed A10 figure
    "NVIDIA RTX A6000": None,
}


def test_the_boards_fleets_run_are_in_the_catalogue() -> None:
    names = {m.nvml_name for m in MODELS.values()}
    assert names == set(BF16)


@pytest.mark.parametrize("key", sorted(MODELS))
def test_each_board_gets_the_reference_peak_for_its_nvml_name(key: str) -> None:
    m = MODELS[key]
    want = BF16[m.nvml_name]
    got = peak_flops(m.nvml_name, "bf16")
    assert got == (None if want is None else pytest.approx(want * 1e12))


@pytest.mark.parametrize("key", sorted(MODELS))
def test_every_mig_board_offers_its_profiles_and_others_none(key: str) -> None:
    m = MODELS[key]
    if not m.mig:
        assert key not in PROFILE_GB
        return
    offered = profiles(key)
    assert len(offered) == 5 and offered[-1].startswith("7g.")
    (one,) = parse_spec(f"1x{key}/mig={offered[-1]}")  # the whole GPU as one instance always fits
    assert one.mig_layout == (offered[-1],)


def test_a_profile_of_another_board_is_refused_with_the_boards_own() -> None:
    with pytest.raises(SpecError, match=r"H20 has no MIG profile 1g\.10gb; it has 1g\.12gb, 2g\.24gb"):
        parse_spec("1xH20/mig=1g.10gb")
    with pytest.raises(SpecError, match="GB200 has no MIG"):
        parse_spec("1xGB200/mig=1g.23gb")
