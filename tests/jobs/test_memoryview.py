"""A rank's allocator view beside the estimate: the breakdown, the gap named, the advice."""

from __future__ import annotations

from typing import Any

import pytest
from support.reports import report

from gpumon.client.model import preset
from gpumon.estimate.breakdown import Setup, estimate
from gpumon.jobs.memoryview import memory_json
from gpumon.jobs.report import parse

GIB = 1 << 30
LLAMA = {"layers": 32, "hidden": 4096, "heads": 32, "vocab": 32000, "seq_len": 4096, "name": "llama2-7b"}


def rank(peak: int | None = None, **extra: Any) -> Any:
    body = report(
        world_size=8,
        setup={"model": LLAMA, "micro_batch": 1, "zero_stage": 1, "checkpointing": "full"},
        **extra,
    )
    if peak is not None:
        body["memory"] = {"device": 0, "allocated_bytes": peak, "allocated_peak_bytes": peak,
                          "reserved_bytes": peak + GIB, "alloc_retries": 0, "ooms": 0}  # fmt: skip
    return parse(body)


def expected(zero: int = 1, dtype: str = "bf16") -> float:
    setup = Setup(batch=1, dtype=dtype, zero=zero, dp=8, checkpointing="full")
    return estimate(preset("llama2-7b"), setup).train_total_bytes


def test_the_estimate_is_set_against_the_allocators_peak() -> None:
    total = expected()
    out = memory_json(rank(int(total * 1.02)), 80 * GIB, 0, 0)
    assert out["estimate"]["total_bytes"] == pytest.approx(total)
    assert set(out["estimate"]["parts_bytes"]) == {"weights", "gradients", "optimizer_states", "activations"}
    assert "within 5 %" in out["gap"] and out["advice"] == []
    assert "more than estimated" in memory_json(rank(int(total * 1.3)), 80 * GIB, 0, 0)["gap"]


def test_tf32_is_estimated_as_fp32() -> None:
    out = memory_json(rank(dtype="tf32"), None, None, None)
    assert out["estimate"]["total_bytes"] == pytest.approx(expected(dtype="fp32"))
    assert out["observed"] is None and out["gap"] is None


def test_an_unknown_dtype_says_why_there_is_no_estimate() -> None:
    out = memory_json(rank(dtype=None), None, None, None)
    assert out["estimate"] is None and "needs the rank's dtype" in out["estimate_problem"]


def test_an_inference_rank_is_set_against_weights_and_kv_cache() -> None:
    out = memory_json(rank(20 * GIB, kind="inference"), 80 * GIB, 3, 0)
    assert set(out["estimate"]["parts_bytes"]) == {"weights", "kv_cache"}
    assert not any("ZeRO" in line for line in out["advice"])  # serving has no optimizer states to shard


def test_retries_bring_advice_with_the_lowest_zero_stage_that_fits() -> None:
    body = rank(70 * GIB)
    out = memory_json(body, 80 * GIB, 5, 0)
    assert any("expandable_segments" in line for line in out["advice"])
    hbm = (expected(zero=1) + expected(zero=2)) / 2 / 0.9  # stage 1 does not fit, stage 2 does
    out = memory_json(body, hbm, 5, 0)
    assert any(line.startswith("ZeRO stage 2 would need") for line in out["advice"])
    assert any("no ZeRO stage fits" in line for line in memory_json(body, 8 * GIB, 5, 0)["advice"])
