"""Peak dense (no sparsity) FLOP/s per GPU model and dtype, memory and link bandwidths: the MFU denominator.

The numbers are NVIDIA's datasheet figures (as quoted by Lightning, Composer, torchtitan, verl and the JAX
scaling book; the project's REFERENCE notes, "Peak dense throughput"); a dtype with no figure there is None
here. An unknown GPU is unknown: ``lookup`` returns None, never the nearest guess (anchors that fell back to
A100, or matched L40S as L4, reported MFU off by 3x). Users with a GPU the table lacks, or clocks it does not
assume, give ``parse_override`` text instead.

Names are matched on tokens, not substrings: "NVIDIA A100-SXM4-80GB" -> {nvidia, a100, sxm4, 80gb}. An entry
matches when the name holds all of one of its required token sets and none of its excluded tokens; the most
specific match (most required tokens) wins, so "H100 PCIe" beats "H100 80GB HBM3", and "L40S" can never be
"L4" or "L40". Two different entries matching equally well is ambiguous and answers None.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from gpumon.client import protocol as P

DTYPES = P.DTYPES

T = 1e12  # the table is in TFLOP/s and TB/s
G = 1e9
# PCIe x16, per direction, as REFERENCE rounds it: Gen4 ~32 GB/s, Gen5 ~64 GB/s. Gen3 (V100) is 8 GT/s x 16
# lanes x 128/130 encoding / 8 bits = 15.75 GB/s, rounded the same way.
_PCIE = {3: 16 * G, 4: 32 * G, 5: 64 * G}
# A MIG slice has a fraction of the GPU's peak: its name carries the parent's ("... MIG 1g.10gb")
_NEVER = frozenset({"mig"})
# values beyond this are surely FLOP/s typed where TFLOP/s was asked for (100 PFLOP/s per GPU)
_MAX_OVERRIDE_TFLOPS = 1e5


@dataclass(frozen=True)
class GpuPeaks:
    """One GPU model. FLOP/s values are dense (no 2:4 sparsity); None: the GPU has no such tensor-core path
    or the datasheet gives none."""

    model: str
    fp32: float | None
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None
    hbm_bytes_per_second: float | None  # device memory bandwidth (GDDR6 on A10, L4, L40S)
    # NVLink per GPU, both directions together (NVIDIA's quoting); None where REFERENCE gives none (PCIe
    # cards with optional bridges, V100)
    nvlink_total_bytes_per_second: float | None
    pcie_bytes_per_second_per_direction: float | None  # the host link, x16 (None: not PCIe-attached)

    def flops(self, dtype: str) -> float | None:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
        value: float | None = getattr(self, dtype)
        return value


@dataclass(frozen=True)
class _Entry:
    peaks: GpuPeaks
    required: tuple[frozenset[str], ...]  # alternatives: any one set, complete, identifies the GPU
    excluded: frozenset[str] = frozenset()


def _entry(
    model: str,
    flops: tuple[float | None, float | None, float | None, float | None, float | None],
    hbm_tb: float | None,
    required: list[str],
    excluded: str = "",
    nvlink: float | None = None,
    pcie_gen: int | None = None,
) -> _Entry:
    """``flops``: (fp32, tf32, bf16, fp16, fp8) in TFLOP/s; ``required``: space-separated token sets."""
    fp32, tf32, bf16, fp16, fp8 = (None if v is None else v * T for v in flops)
    peaks = GpuPeaks(
        model=model,
        fp32=fp32,
        tf32=tf32,
        bf16=bf16,
        fp16=fp16,
        fp8=fp8,
        hbm_bytes_per_second=None if hbm_tb is None else hbm_tb * T,
        nvlink_total_bytes_per_second=nvlink,
        pcie_bytes_per_second_per_direction=None if pcie_gen is None else _PCIE[pcie_gen],
    )
    return _Entry(peaks, tuple(frozenset(r.split()) for r in required), frozenset(excluded.split()))


# (fp32, tf32, bf16, fp16, fp8) TFLOP/s, HBM TB/s: REFERENCE.md's table, row for row.
_HOPPER_SXM = (67.0, 494.5, 989.5, 989.5, 1979.0)
_A100 = (19.5, 156.0, 312.0, 312.0, None)
_TABLE: tuple[_Entry, ...] = (
    # V100: FP16 tensor cores only. "V100" alone could be SXM2 (125) or PCIe (112): needs the form factor;
    # V100S, SXM3 (DGX-2) and FHHL are other clocks, not in REFERENCE, and do not match.
    _entry("V100 SXM2", (15.7, None, None, 125.0, None), 0.9, ["v100 sxm2"], pcie_gen=3),
    _entry("V100 PCIe", (14.0, None, None, 112.0, None), 0.9, ["v100 pcie"], pcie_gen=3),
    # A100: same compute in every form; HBM differs by memory size and form, which NVML names carry
    # ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB"). Without both: unknown.
    _entry("A100 SXM4 40GB", _A100, 1.555, ["a100 sxm4 40gb", "a100 sxm 40gb"], nvlink=600 * G, pcie_gen=4),
    _entry("A100 SXM4 80GB", _A100, 2.039, ["a100 sxm4 80gb", "a100 sxm 80gb"], nvlink=600 * G, pcie_gen=4),
    _entry("A100 PCIe 40GB", _A100, 1.555, ["a100 pcie 40gb"], pcie_gen=4),
    _entry("A100 PCIe 80GB", _A100, 1.935, ["a100 pcie 80gb"], pcie_gen=4),
    # A800: A100 compute with NVLink cut to 400 GB/s (REFERENCE gives no NVLink figure); 80 GB parts only,
    # as REFERENCE lists them ("NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe")
    _entry("A800 SXM4 80GB", _A100, 2.039, ["a800 sxm4 80gb", "a800 sxm 80gb"], pcie_gen=4),
    _entry("A800 PCIe 80GB", _A100, 1.935, ["a800 pcie 80gb"], pcie_gen=4),
    # tokens, so "a10" is never A100 and A10G (AWS's variant, no NVIDIA datasheet) is unknown
    _entry("A10", (31.2, 62.5, 125.0, 125.0, None), 0.6, ["a10"], pcie_gen=4),
    _entry("L4", (30.3, 60.0, 121.0, 121.0, 242.0), 0.3, ["l4"], pcie_gen=4),
    _entry("L40S", (91.6, 183.0, 362.0, 362.0, 733.0), 0.864, ["l40s"], pcie_gen=4),
    # "l40" is its own token: "NVIDIA L40S" is never this row, nor this one L40S
    _entry("L40", (90.5, 90.5, 181.0, 181.0, 362.0), 0.864, ["l40"], pcie_gen=4),
    # "NVIDIA RTX 6000 Ada Generation"; the Turing "Quadro RTX 6000" lacks "ada"
    _entry("RTX 6000 Ada", (91.1, 182.0, 364.0, 364.0, 728.5), 0.96, ["rtx 6000 ada"], pcie_gen=4),
    # with FP32 accumulate, as training runs; the cut "RTX 4090 D" and the laptop chip (another die) are not
    _entry(
        "GeForce RTX 4090",
        (82.6, 82.6, 165.0, 165.0, None),
        1.0,
        ["rtx 4090"],
        excluded="d laptop",
        pcie_gen=4,
    ),
    # H100 SXM reports as "NVIDIA H100 80GB HBM3" (the PCIe card is HBM2e, the NVL names itself); a bare
    # "H100" could be any of three peaks and stays unknown
    _entry(
        "H100 SXM",
        _HOPPER_SXM,
        3.35,
        ["h100 hbm3", "h100 sxm5", "h100 sxm"],
        excluded="pcie nvl",
        nvlink=900 * G,
        pcie_gen=5,
    ),
    _entry("H100 PCIe", (51.2, 378.0, 756.0, 756.0, 1513.0), 2.0, ["h100 pcie"], pcie_gen=5),
    _entry("H100 NVL", (60.0, 417.5, 835.5, 835.5, 1671.0), 3.9, ["h100 nvl"], pcie_gen=5),
    # the SXM part is plain "NVIDIA H200"
    _entry("H200 SXM", _HOPPER_SXM, 4.8, ["h200"], excluded="nvl pcie", nvlink=900 * G, pcie_gen=5),
    _entry("H200 NVL", (60.0, 417.5, 835.5, 835.5, 1671.0), 4.8, ["h200 nvl"], pcie_gen=5),
    # H800: H100 SXM compute with NVLink cut (REFERENCE gives no figure). Its SXM part names itself plain
    # "NVIDIA H800" or "NVIDIA H800 80GB HBM3"; "H800 PCIe" and "H800 NVL" are other clocks, not this row
    _entry("H800 SXM", _HOPPER_SXM, 3.35, ["h800"], excluded="pcie nvl", pcie_gen=5),
    # GH200: the superchip's Hopper GPU, attached to Grace by NVLink-C2C. The 96 GB HBM3 parts name the
    # superchip's memory ("NVIDIA GH200 480GB", "NVIDIA GH200 120GB"), the 144 GB HBM3e part its HBM
    # ("NVIDIA GH200 144G HBM3e"); a bare "GH200" has the compute but not the bandwidth
    _entry("GH200", _HOPPER_SXM, None, ["gh200"], nvlink=900 * G),
    _entry("GH200 HBM3", _HOPPER_SXM, 4.0, ["gh200 480gb", "gh200 120gb", "gh200 96gb"], nvlink=900 * G),
    _entry("GH200 HBM3e", _HOPPER_SXM, 4.9, ["gh200 hbm3e", "gh200 144g"], nvlink=900 * G),
    # REFERENCE's 4.0 TB/s is the 96 GB HBM3 H20; an HBM3e (141 GB) H20 has been sold since, so names that
    # say so are not this row
    _entry("H20", (44.0, 74.0, 148.0, 148.0, 296.0), 4.0, ["h20"], excluded="3e hbm3e 141gb", pcie_gen=5),
    _entry("B200", (80.0, None, 2250.0, 2250.0, 4500.0), 8.0, ["b200"], nvlink=1800 * G, pcie_gen=5),
    # GB200: per GPU; attached to Grace by NVLink-C2C, not PCIe
    _entry("GB200", (None, None, 2500.0, 2500.0, 5000.0), 8.0, ["gb200"], nvlink=1800 * G),
    # Not here on purpose: H20-3e, A10G, A800 40GB, H800 PCIe/NVL, RTX 4090 D and other parts REFERENCE
    # gives no row (or no figures) for. They are unknown: MFU needs an override.
)


def tokens(device_name: str) -> frozenset[str]:
    """Lowercase alphanumeric runs: "NVIDIA A100-SXM4-80GB" -> {nvidia, a100, sxm4, 80gb}."""
    return frozenset(t for t in re.split(r"[^a-z0-9]+", device_name.lower()) if t)


def _specificity(entry: _Entry, name: frozenset[str]) -> int:
    """How many tokens the best-matching required set of ``entry`` explains; 0 when it does not match."""
    if entry.excluded & name:
        return 0
    return max((len(r) for r in entry.required if r <= name), default=0)


def lookup(device_name: str) -> GpuPeaks | None:
    """The table row for an NVML/torch device name, or None when the GPU is unknown or ambiguous."""
    if not isinstance(device_name, str):
        return None
    return _lookup(device_name)


@functools.lru_cache(maxsize=256)  # a node has a handful of names, asked for per rank on every scrape
def _lookup(device_name: str) -> GpuPeaks | None:
    name = tokens(device_name)
    if not name or name & _NEVER:
        return None
    scored = [(_specificity(e, name), e) for e in _TABLE]
    best = max(score for score, _ in scored)
    if best == 0:
        return None
    winners = [e for score, e in scored if score == best]
    return winners[0].peaks if len(winners) == 1 else None


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of ``device_name`` in ``dtype``; None when the GPU is unknown or lacks the dtype.

    An unknown dtype is a programming error (ValueError), not an unknown GPU.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    peaks = lookup(device_name)
    return None if peaks is None else peaks.flops(dtype)


def _tflops(text: str, what: str, whole: str) -> float:
    hint = f"peak FLOP/s override {whole!r}: {what}"
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{hint} must be a number of TFLOP/s, got {text.strip()!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{hint} must be a positive number of TFLOP/s, got {text.strip()!r}")
    if value > _MAX_OVERRIDE_TFLOPS:
        raise ValueError(
            f"{hint} is {value:g} TFLOP/s, more than any GPU: give TFLOP/s (989.5), not FLOP/s (9.895e14)"
        )
    return value * T


def parse_override(text: str) -> dict[str, float]:
    """A user's peak FLOP/s, in TFLOP/s: "989.5" (every dtype) or "bf16=989.5,fp8=1979" (those dtypes).

    Returns FLOP/s per dtype. Raises ValueError with a message fit for a ConfigError on bad input.
    """
    usage = "expected TFLOP/s for every dtype (989.5) or per dtype (bf16=989.5,fp8=1979)"
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"peak FLOP/s override: empty; {usage}")
    if "=" not in text:
        value = _tflops(text, "the value", text)
        return dict.fromkeys(DTYPES, value)
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, raw = part.partition("=")
        key = key.strip().lower()
        if not sep or not key:
            raise ValueError(f"peak FLOP/s override {text!r}: {part.strip()!r} is not dtype=TFLOPS; {usage}")
        if key not in DTYPES:
            raise ValueError(
                f"peak FLOP/s override {text!r}: unknown dtype {key!r}, use one of {', '.join(DTYPES)}"
            )
        if key in out:
            raise ValueError(f"peak FLOP/s override {text!r}: {key} given twice")
        out[key] = _tflops(raw, key, text)
    return out
