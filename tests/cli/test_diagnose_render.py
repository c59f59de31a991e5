"""gpumon diagnose's text: notes, shared GPUs, and one memory section for ranks that match."""

from __future__ import annotations

import argparse

from gpumon.cli.diagnose import render


def _rank(rank: int, allocated: float) -> dict:
    return {
        "rank": rank,
        "gpus": [{"index": rank, "name": "H100", "shared_with": ["llama-70b"] if rank == 0 else []}],
        "rates": {"tokens_per_second": 100.0, "phase_ratios": {}},
        "mfu": 0.3,
        "diagnosis": {"bottleneck": "input"},
        "memory": {"observed": {"allocated_bytes": allocated, "reserved_bytes": allocated}, "estimate": None},
    }


def test_notes_shared_gpus_and_repeated_memory_sections() -> None:
    job = {
        "job": "tiny",
        "ranks_on_node": 3,
        "tokens_per_second": 300.0,
        "mfu": 0.3,
        "window_seconds": 60,
        "diagnosis": {
            "bottleneck": "input",
            "summary": "input-bound",
            "advice": "more workers",
            "findings": ["gpu_shared"],
            "notes": ["GPU shared with llama-70b (GPU 0): GPU activity is not attributable"],
            "evidence": [],
        },
        "ranks": [_rank(0, 2**30), _rank(1, 2**30), _rank(2, 2**31)],
    }
    text = render(job)
    assert "  Note: GPU shared with llama-70b (GPU 0): GPU activity is not attributable." in text
    assert "rank 0 on GPU 0 H100 (shared with llama-70b):" in text
    assert "rank 1 on GPU 1 H100:" in text
    assert text.count("1.0 GiB allocated") == 1 and "      memory: as rank 0" in text
    assert "2.0 GiB allocated" in text, "a rank whose memory differs gets its own section"


def test_strings_from_the_daemon_reach_the_terminal_escaped(monkeypatch, capsys) -> None:
    """Found by review: a NIC named with an escape and a newline (root names RDMA devices; --sys-root reads
    any tree) drove the terminal and forged a line through the verdict's summary."""
    from gpumon.cli import diagnose

    job = {
        "job": "evil",
        "ranks_on_node": 1,
        "diagnosis": {
            "bottleneck": "communication",
            "summary": "waiting on peers: its NICs (ev\x1b[31mil\nVerdict: fine) carry 3 %",
            "advice": "a",
            "findings": [],
            "notes": [],
            "evidence": [],
        },
        "ranks": [],
    }
    monkeypatch.setattr(diagnose, "get_json", lambda url, path, **kw: job)
    args = argparse.Namespace(url="http://127.0.0.1:1", job="evil", json=False)
    assert diagnose.run(None, args) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[31mil\\nVerdict: fine" in out
    assert not [line for line in out.splitlines() if line.startswith("Verdict: fine")]
