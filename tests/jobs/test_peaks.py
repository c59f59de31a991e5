"""gpumon.jobs.peaks: the peak FLOP/s table, device-name matching, and the user override."""

from __future__ import annotations

import pytest

from gpumon.client.protocol import DTYPES as PROTOCOL_DTYPES
from gpumon.jobs import peaks
from gpumon.jobs.peaks import DTYPES, GpuPeaks, lookup, parse_override, peak_flops, tokens

T = 1e12
G = 1e9

# REFERENCE.md "Peak dense throughput", row for row: model -> (fp32, tf32, bf16, fp16, fp8) TFLOP/s, HBM TB/s
TABLE: dict[str, tuple[tuple[float | None, ...], float | None]] = {
    "V100 SXM2": ((15.7, None, None, 125, None), 0.9),
    "V100 PCIe": ((14, None, None, 112, None), 0.9),
    "A100 SXM4 40GB": ((19.5, 156, 312, 312, None), 1.555),
    "A100 SXM4 80GB": ((19.5, 156, 312, 312, None), 2.039),
    "A100 PCIe 40GB": ((19.5, 156, 312, 312, None), 1.555),
    "A100 PCIe 80GB": ((19.5, 156, 312, 312, None), 1.935),
    "A800 SXM4 80GB": ((19.5, 156, 312, 312, None), 2.039),
    "A800 PCIe 80GB": ((19.5, 156, 312, 312, None), 1.935),
    "A10": ((31.2, 62.5, 125, 125, None), 0.6),
    "L4": ((30.3, 60, 121, 121, 242), 0.3),
    "L40": ((90.5, 90.5, 181, 181, 362), 0.864),
    "L40S": ((91.6, 183, 362, 362, 733), 0.864),
    "RTX 6000 Ada": ((91.1, 182, 364, 364, 728.5), 0.96),
    "GeForce RTX 4090": ((82.6, 82.6, 165, 165, None), 1.0),
    "H100 SXM": ((67, 494.5, 989.5, 989.5, 1979), 3.35),
    "H100 PCIe": ((51.2, 378, 756, 756, 1513), 2.0),
    "H100 NVL": ((60, 417.5, 835.5, 835.5, 1671), 3.9),
    "H200 SXM": ((67, 494.5, 989.5, 989.5, 1979), 4.8),
    "H200 NVL": ((60, 417.5, 835.5, 835.5, 1671), 4.8),  # corrected in REFERENCE on 2026-11-26 (was 840)
    "H800 SXM": ((67, 494.5, 989.5, 989.5, 1979), 3.35),
    "GH200": ((67, 494.5, 989.5, 989.5, 1979), None),  # the name does not say which HBM
    "GH200 HBM3": ((67, 494.5, 989.5, 989.5, 1979), 4.0),
    "GH200 HBM3e": ((67, 494.5, 989.5, 989.5, 1979), 4.9),
    "H20": ((44, 74, 148, 148, 296), 4.0),
    "B200": ((80, None, 2250, 2250, 4500), 8.0),
    "GB200": ((None, None, 2500, 2500, 5000), 8.0),
}

# every device-name string REFERENCE.md lists, and the model each must be
REFERENCE_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA A100-SXM4-80GB": "A100 SXM4 80GB",
    "NVIDIA A100 80GB PCIe": "A100 PCIe 80GB",
    "NVIDIA L40S": "L40S",
    "NVIDIA L4": "L4",
    "Tesla V100-SXM2-32GB": "V100 SXM2",
}

OTHER_KNOWN_NAMES = {
    "NVIDIA A100-SXM4-40GB": "A100 SXM4 40GB",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe 40GB",
    "NVIDIA H200 NVL": "H200 NVL",
    "Tesla V100-PCIE-16GB": "V100 PCIe",
    "Tesla V100-PCIE-32GB": "V100 PCIe",
    "Tesla V100-SXM2-16GB": "V100 SXM2",
    "NVIDIA A10": "A10",
    "NVIDIA H20": "H20",
    "NVIDIA B200": "B200",
    "NVIDIA GB200": "GB200",
    # the rows REFERENCE gained on 2026-11-26, by the names NVML gives them
    "NVIDIA A800-SXM4-80GB": "A800 SXM4 80GB",
    "NVIDIA A800 80GB PCIe": "A800 PCIe 80GB",
    "NVIDIA L40": "L40",
    "NVIDIA RTX 6000 Ada Generation": "RTX 6000 Ada",
    "NVIDIA GeForce RTX 4090": "GeForce RTX 4090",
    "NVIDIA H800": "H800 SXM",
    "NVIDIA H800 80GB HBM3": "H800 SXM",
    "NVIDIA GH200 480GB": "GH200 HBM3",
    "NVIDIA GH200 120GB": "GH200 HBM3",
    "NVIDIA GH200 144G HBM3e": "GH200 HBM3e",
    "NVIDIA GH200": "GH200",
    # spellings a person types into a config or a flag
    "nvidia h100 80gb hbm3": "H100 SXM",
    "  NVIDIA   H100   PCIe  ": "H100 PCIe",
    "H100-SXM": "H100 SXM",
    "h100 sxm5 80gb": "H100 SXM",
    "H200 SXM": "H200 SXM",
    "A100 SXM 80GB": "A100 SXM4 80GB",
    "NVIDIA_L40S": "L40S",
    "l4": "L4",
}

UNKNOWN = [
    "",
    "   ",
    "NVIDIA A10G",  # AWS's A10 variant: no NVIDIA datasheet to cite
    "NVIDIA A100",  # which A100? HBM bandwidth differs by form and size
    "NVIDIA A100 80GB",
    "NVIDIA H100",  # SXM 989.5, PCIe 756 or NVL 835.5: a guess either way
    "Tesla V100",  # SXM2 125 or PCIe 112
    "Tesla V100S-PCIE-32GB",  # V100S: other clocks
    "Tesla V100-SXM3-32GB",  # DGX-2's V100: other clocks
    "Tesla V100-FHHL-16GB",
    "NVIDIA H800 PCIe",  # other clocks than the H800 SXM row
    "NVIDIA H800 NVL",
    "NVIDIA A800-SXM4-40GB",  # REFERENCE gives the 80 GB parts only
    "NVIDIA GeForce RTX 4090 D",  # cut compute: never the RTX 4090's peak
    "NVIDIA GeForce RTX 4090 Laptop GPU",  # another die
    "Quadro RTX 6000",  # Turing, not the Ada card
    "NVIDIA H20-3e",
    "NVIDIA H20 141GB HBM3e",
    "NVIDIA RTX A6000",  # the simulator's non-datacenter GPU
    "NVIDIA B300",
    "NVIDIA H100 80GB HBM3 MIG 1g.10gb",  # a MIG slice has a fraction of the peak
    "NVIDIA H100 PCIe NVL",  # two entries match equally: ambiguous
    "AMD Instinct MI300X",
    "garbage",
    "h1OO",
    "l40s-but-not-really l4",  # tokens l40s, l4 ... both match one token: ambiguous, not a guess
    "🙂",
]


@pytest.mark.parametrize("model", list(TABLE))
def test_every_row_is_the_reference_table(model: str) -> None:
    entry = next(e.peaks for e in peaks._TABLE if e.peaks.model == model)
    flops, hbm = TABLE[model]
    expected = [None if v is None else v * T for v in flops]
    assert [entry.flops(d) for d in DTYPES] == pytest.approx(expected)
    assert entry.hbm_bytes_per_second == (None if hbm is None else pytest.approx(hbm * T))


def test_the_table_has_exactly_the_reference_rows() -> None:
    models = [e.peaks.model for e in peaks._TABLE]
    assert sorted(models) == sorted(TABLE) and len(set(models)) == len(models)


def test_dtypes_are_the_protocols() -> None:
    assert DTYPES == PROTOCOL_DTYPES


@pytest.mark.parametrize(("name", "model"), [*REFERENCE_NAMES.items(), *OTHER_KNOWN_NAMES.items()])
def test_known_names(name: str, model: str) -> None:
    found = lookup(name)
    assert found is not None and found.model == model


@pytest.mark.parametrize("name", UNKNOWN)
def test_unknown_names_are_none_never_a_guess(name: str) -> None:
    assert lookup(name) is None
    assert peak_flops(name, "bf16") is None


def test_lookup_of_a_non_string_is_none() -> None:
    assert lookup(None) is None  # type: ignore[arg-type]


def test_near_misses_are_told_apart() -> None:
    # the anchors' bugs: L40S as L4, A10 as A100, a plain H200 missed, PCIe as SXM
    assert lookup("NVIDIA L40S").model == "L40S"  # type: ignore[union-attr]
    assert lookup("NVIDIA L4").model == "L4"  # type: ignore[union-attr]
    assert lookup("NVIDIA A10").model == "A10"  # type: ignore[union-attr]
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756 * T
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.5 * T
    assert peak_flops("NVIDIA H200", "fp8") == 1979 * T
    assert peak_flops("NVIDIA H200 NVL", "fp8") == 1671 * T
    assert lookup("NVIDIA L40").model == "L40" and lookup("NVIDIA L40S").model == "L40S"  # type: ignore[union-attr]
    # same compute, different memory
    sxm, pcie = lookup("NVIDIA A100-SXM4-80GB"), lookup("NVIDIA A100 80GB PCIe")
    assert sxm is not None and pcie is not None
    assert sxm.bf16 == pcie.bf16 == 312 * T
    assert (sxm.hbm_bytes_per_second, pcie.hbm_bytes_per_second) == (2.039 * T, 1.935 * T)


def test_absent_dtypes_are_none() -> None:
    assert peak_flops("Tesla V100-SXM2-32GB", "bf16") is None  # FP16 tensor cores only
    assert peak_flops("Tesla V100-SXM2-32GB", "fp16") == 125 * T
    assert peak_flops("Tesla V100-PCIE-16GB", "fp16") == 112 * T
    assert peak_flops("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert peak_flops("NVIDIA H20", "fp32") == 44 * T
    assert peak_flops("NVIDIA GeForce RTX 4090", "fp8") is None  # REFERENCE gives none
    assert peak_flops("NVIDIA B200", "tf32") is None
    assert peak_flops("NVIDIA GB200", "bf16") == 2500 * T


def test_links() -> None:
    def links(name: str) -> tuple[float | None, float | None]:
        p = lookup(name)
        assert p is not None
        return p.nvlink_total_bytes_per_second, p.pcie_bytes_per_second_per_direction

    assert links("NVIDIA A100-SXM4-80GB") == (600 * G, 32 * G)
    assert links("NVIDIA A100 80GB PCIe") == (None, 32 * G)  # NVLink only through an optional bridge
    assert links("NVIDIA H100 80GB HBM3") == (900 * G, 64 * G)
    assert links("NVIDIA H200") == (900 * G, 64 * G)
    assert links("NVIDIA B200") == (1800 * G, 64 * G)
    assert links("NVIDIA GB200") == (1800 * G, None)  # NVLink-C2C to Grace, not PCIe
    assert links("NVIDIA L4") == (None, 32 * G)
    assert links("Tesla V100-SXM2-32GB") == (None, 16 * G)
    assert links("NVIDIA GH200 480GB") == (900 * G, None)  # NVLink-C2C to Grace, not PCIe
    assert links("NVIDIA H800") == (None, 64 * G)  # cut NVLink: REFERENCE gives no figure


def test_unknown_dtype_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        peak_flops("NVIDIA H100 80GB HBM3", "int8")
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        peak_flops("no such GPU", "int8")


def test_tokens() -> None:
    assert tokens("NVIDIA H100 80GB HBM3") == {"nvidia", "h100", "80gb", "hbm3"}
    assert tokens("NVIDIA A100-SXM4-80GB") == {"nvidia", "a100", "sxm4", "80gb"}
    assert tokens("  --  ") == frozenset()


def test_peaks_is_frozen() -> None:
    p = lookup("NVIDIA L4")
    assert isinstance(p, GpuPeaks)
    with pytest.raises(AttributeError):
        p.bf16 = 1.0  # type: ignore[misc]


# --- the override -----------------------------------------------------------------------------------------


def test_override_one_number_is_every_dtype() -> None:
    assert parse_override("989.5") == dict.fromkeys(DTYPES, 989.5 * T)
    assert parse_override(" 1e3 ") == dict.fromkeys(DTYPES, 1000 * T)


def test_override_per_dtype() -> None:
    assert parse_override("bf16=989.5,fp8=1979") == {"bf16": 989.5 * T, "fp8": 1979 * T}
    assert parse_override(" BF16 = 312 , tf32=156 ") == {"bf16": 312 * T, "tf32": 156 * T}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty; expected TFLOP/s for every dtype"),
        ("   ", "empty"),
        ("fast", r"must be a number of TFLOP/s, got 'fast'"),
        ("0", "must be a positive number of TFLOP/s"),
        ("-5", "must be a positive number of TFLOP/s"),
        ("nan", "must be a positive number of TFLOP/s"),
        ("inf", "must be a positive number of TFLOP/s"),
        ("9.895e14", r"give TFLOP/s \(989.5\), not FLOP/s"),
        ("bf16=989.5,int8=1979", "unknown dtype 'int8', use one of fp32, tf32, bf16, fp16, fp8"),
        ("bf16=1,bf16=2", "bf16 given twice"),
        ("bf16=989.5,fp8", "'fp8' is not dtype=TFLOPS"),
        ("bf16=989.5,", "'' is not dtype=TFLOPS"),
        ("=989.5", "is not dtype=TFLOPS"),
        ("bf16=", r"bf16 must be a number of TFLOP/s, got ''"),
        ("bf16=lots", "bf16 must be a number of TFLOP/s"),
    ],
)
def test_override_errors_say_what_to_fix(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_override(text)
