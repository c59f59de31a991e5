"""gpumon estimate: the memory formulas against hand arithmetic, and the command end to end."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpumon.cli import main
from gpumon.cli.daemon_api import DaemonError
from gpumon.cli.estimate import fetch_job
from gpumon.client.model import PRESETS, ModelSpec
from gpumon.estimate.breakdown import (
    Setup,
    activation_bytes_per_layer,
    estimate,
    estimate_json,
    kv_cache_bytes,
    kv_heads_per_gpu,
    output_activation_bytes,
    state_bytes_per_parameter,
)

# The tiny model of test_model.py: 1352 parameters (embedding 80, output head 80).
TINY = ModelSpec(layers=2, hidden=8, heads=2, kv_heads=1, vocab=10, seq_len=4, ffn_hidden=16)
P = 1352
TINY_FLAGS = [
    "--layers",
    "2",
    "--hidden",
    "8",
    "--heads",
    "2",
    "--kv-heads",
    "1",
    "--vocab",
    "10",
    "--seq",
    "4",
]
TINY_FLAGS += ["--ffn-hidden", "16"]
# s·b·h with s = 4, b = 1, h = 8; a = 2 heads, so a·s/h = 2 * 4 / 8 = 1
SBH = 32


# --- formulas ---------------------------------------------------------------------------------------------


def test_bytes_per_parameter() -> None:
    # mixed precision Adam: 2 weights + 2 grads + 12 (fp32 master 4 + m 4 + v 4) = 16
    assert state_bytes_per_parameter("bf16", "adamw") == (2, 2, 12)
    assert state_bytes_per_parameter("fp16", "adam") == (2, 2, 12)
    assert state_bytes_per_parameter("fp8", "adamw") == (2, 2, 12)  # bf16 parameters, fp8 in the matmuls
    assert state_bytes_per_parameter("bf16", "sgd") == (2, 2, 8)  # master + momentum
    assert state_bytes_per_parameter("bf16", "none") == (2, 2, 0)
    assert state_bytes_per_parameter("fp32", "adamw") == (4, 4, 8)  # no master copy: m + v
    assert state_bytes_per_parameter("fp32", "sgd") == (4, 4, 4)
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        state_bytes_per_parameter("bf16", "lion")
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        state_bytes_per_parameter("int4", "adamw")


def test_activations_per_layer_are_korthikanti_table_2() -> None:
    s, b, h, a = 4, 1, 8, 2
    # no parallelism: s·b·h·(34 + 5·a·s/h) = 32 * (34 + 5) = 1248
    assert activation_bytes_per_layer(s, b, h, a) == 1248
    # tensor parallel t = 2: s·b·h·(10 + 24/t + 5·a·s/(h·t)) = 32 * (10 + 12 + 2.5) = 784
    assert activation_bytes_per_layer(s, b, h, a, tp=2) == 784
    # tensor + sequence parallel: s·b·h·(34 + 5·a·s/h)/t = 32 * 39 / 2 = 624
    assert activation_bytes_per_layer(s, b, h, a, tp=2, sequence_parallel=True) == 624
    # selective recomputation drops the scores: 34·s·b·h = 1088; with t = 2: 32 * (10 + 12) = 704; with SP 544
    assert activation_bytes_per_layer(s, b, h, a, checkpointing="selective") == 1088
    assert activation_bytes_per_layer(s, b, h, a, tp=2, checkpointing="selective") == 704
    assert (
        activation_bytes_per_layer(s, b, h, a, tp=2, sequence_parallel=True, checkpointing="selective") == 544
    )
    # FlashAttention never stores the scores either
    assert activation_bytes_per_layer(s, b, h, a, flash_attention=True) == 1088
    # full recomputation: the layer input, 2·s·b·h = 64 (the sequence-parallel input is split: 32)
    assert activation_bytes_per_layer(s, b, h, a, checkpointing="full") == 64
    assert activation_bytes_per_layer(s, b, h, a, tp=2, checkpointing="full") == 64
    assert activation_bytes_per_layer(s, b, h, a, tp=2, sequence_parallel=True, checkpointing="full") == 32
    # fp32 activations (e = 4 bytes, masks 1): replicated 4e + 2 = 18, split 12e = 48, scores 2e + 1 = 9
    # 32 * (18 + 48 + 9 * 1) = 2400
    assert activation_bytes_per_layer(s, b, h, a, element_bytes=4) == 2400
    with pytest.raises(ValueError, match="unknown checkpointing 'some'"):
        activation_bytes_per_layer(s, b, h, a, checkpointing="some")


def test_activations_at_gpt3_scale_match_the_paper() -> None:
    # GPT-3 175B (s 2048, h 12288, a 96), b = 1: 5·a·s/h = 80, so 34 + 80 = 114 bytes per s·b·h per layer
    s, h, a = 2048, 12288, 96
    assert activation_bytes_per_layer(s, 1, h, a) == s * h * 114
    assert activation_bytes_per_layer(s, 1, h, a, tp=8) == s * h * (10 + 24 / 8 + 80 / 8)


def test_output_layer_activations_are_section_4_3() -> None:
    s, b, h, v = 4, 1, 8, 10
    # s·b·h·(5 + 4·v/h) = 32 * (5 + 5) = 320: dropout mask 1 + final norm input 2 + head input 2, fp32 logits
    assert output_activation_bytes(s, b, h, v) == 320
    # tensor parallel: only the vocab-parallel logits split: 32 * 5 + 4 * 4 * 10 / 2 = 160 + 80 = 240
    assert output_activation_bytes(s, b, h, v, tp=2) == 240
    # with sequence parallelism everything splits: 320 / 2
    assert output_activation_bytes(s, b, h, v, tp=2, sequence_parallel=True) == 160
    # fp32: 32 * (1 + 2 * 4) + 4 * 4 * 10 = 288 + 160
    assert output_activation_bytes(s, b, h, v, element_bytes=4) == 448


def test_kv_cache() -> None:
    # 2 (K, V) · L 2 · kv_heads 1 · head_dim 4 · seq 4 · batch 1 · 2 B = 128
    assert kv_cache_bytes(TINY, batch=1, element_bytes=2) == 128
    assert kv_cache_bytes(TINY, batch=3, element_bytes=1) == 192
    # Llama-3 8B, bf16, one 8192-token sequence: 2 · 32 · 8 · 128 · 8192 · 2 = 1 GiB
    assert kv_cache_bytes(PRESETS["llama3-8b"], batch=1, element_bytes=2) == 1024**3
    # seed 000: the KV cache grows 16x from 2K to 32K context
    short = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, vocab=128256, seq_len=2048)
    long = ModelSpec(layers=32, hidden=4096, heads=32, kv_heads=8, vocab=128256, seq_len=32768)
    assert kv_cache_bytes(long, 1, 2) == 16 * kv_cache_bytes(short, 1, 2)


def test_kv_heads_per_tensor_parallel_rank() -> None:
    assert kv_heads_per_gpu(8, 4) == 2  # split
    assert kv_heads_per_gpu(8, 16) == 1  # replicated: every rank keeps one
    with pytest.raises(ValueError, match="neither divides nor is a multiple"):
        kv_heads_per_gpu(8, 3)


def test_estimate_by_hand() -> None:
    est = estimate(TINY, Setup())
    assert (est.parameters, est.non_embedding_parameters) == (P, P - 80)
    # bf16 + AdamW: weights 2 B, grads 2 B, optimizer 12 B per parameter
    assert (est.weights_bytes, est.gradients_bytes, est.optimizer_states_bytes) == (2 * P, 2 * P, 12 * P)
    # 2 layers * 1248 + 320 outside the layers
    assert est.activations_bytes == 2 * 1248 + 320
    assert est.train_total_bytes == 16 * P + 2816 == 24448
    assert est.attention_scores_bytes == 2 * 32 * 5  # L · s·b·h · 5·a·s/h
    assert (est.inference_weights_bytes, est.kv_cache_bytes, est.inference_total_bytes) == (
        2 * P,
        128,
        2 * P + 128,
    )
    assert (est.train_flops_per_token, est.inference_flops_per_token) == (8400, 2800)
    assert estimate(TINY, Setup(convention="megatron")).train_flops_per_token == 8016


def test_zero_stages_shard_over_dp() -> None:
    def states(zero: int) -> tuple[float, float, float]:
        est = estimate(TINY, Setup(zero=zero, dp=4))
        return est.weights_bytes, est.gradients_bytes, est.optimizer_states_bytes

    assert states(0) == (2 * P, 2 * P, 12 * P)
    assert states(1) == (2 * P, 2 * P, 12 * P / 4)
    assert states(2) == (2 * P, 2 * P / 4, 12 * P / 4)
    assert states(3) == (2 * P / 4, 2 * P / 4, 12 * P / 4)


def test_optimizer_offload_leaves_the_weights_and_activations_on_the_gpu() -> None:
    on_gpu = estimate(TINY, Setup(zero=3, dp=4))
    off = estimate(TINY, Setup(zero=3, dp=4, offload="optimizer"))
    assert (off.weights_bytes, off.gradients_bytes, off.optimizer_states_bytes) == (2 * P / 4, 0, 0)
    assert off.activations_bytes == on_gpu.activations_bytes
    assert "host" in off.formulas["optimizer_states"]
    with pytest.raises(ValueError, match="ZeRO stage of 1 or more"):
        Setup(offload="optimizer")
    with pytest.raises(ValueError, match="offload 'params'"):
        Setup(zero=3, offload="params")


def test_the_cli_takes_an_offload(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, *TINY_FLAGS, "--zero", "3", "--dp", "4", "--offload", "optimizer")
    assert code == 0, err
    text = " ".join(out.split())
    assert "ZeRO-3, dp 4, tp 1, optimizer offloaded to the host" in text
    assert "optimizer states 0 B 0: on the host (optimizer offload)" in text
    code, _, err = run_cli(capsys, *TINY_FLAGS, "--offload", "optimizer")
    assert code == 2 and "needs a ZeRO stage of 1 or more" in err and "Traceback" not in err


def test_tensor_parallel_divides_state_and_activations() -> None:
    est = estimate(TINY, Setup(tp=2))
    assert est.parameters_per_gpu == P / 2
    assert (est.weights_bytes, est.gradients_bytes, est.optimizer_states_bytes) == (P, P, 6 * P)
    assert est.activations_bytes == 2 * 784 + 240
    assert est.kv_cache_bytes == 128  # one KV head: every tp rank keeps it
    sp = estimate(TINY, Setup(tp=2, sequence_parallel=True))
    assert sp.activations_bytes == 2 * 624 + 160


def test_fp32_and_fp8() -> None:
    fp32 = estimate(TINY, Setup(dtype="fp32"))
    assert (fp32.weights_bytes, fp32.gradients_bytes, fp32.optimizer_states_bytes) == (4 * P, 4 * P, 8 * P)
    assert fp32.activations_bytes == 2 * 2400 + 448
    assert (fp32.inference_weights_bytes, fp32.kv_cache_bytes) == (4 * P, 256)
    fp8 = estimate(TINY, Setup(dtype="fp8"))
    assert fp8.train_total_bytes == estimate(TINY, Setup()).train_total_bytes  # bf16 params and activations
    assert (fp8.inference_weights_bytes, fp8.kv_cache_bytes) == (P, 64)  # 1 B weights and KV when serving


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"batch": 0}, "batch must be a positive integer"),
        ({"dp": -1}, "dp must be a positive integer"),
        ({"dtype": "int8"}, "dtype 'int8': use one of fp32, bf16, fp16, fp8"),
        ({"zero": 4}, "zero 4: use one of 0, 1, 2, 3"),
        ({"zero": True}, "zero True"),
        ({"checkpointing": "all"}, "checkpointing 'all'"),
        ({"convention": "user"}, "flops convention 'user': use one of palm, megatron"),
        ({"sequence_parallel": True}, "needs tp > 1"),
    ],
)
def test_setup_validation(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Setup(**kw)


def test_tensor_parallel_must_fit_the_heads() -> None:
    with pytest.raises(ValueError, match=r"tensor parallel size 3 must divide the number of heads \(2\)"):
        estimate(TINY, Setup(tp=3))


def test_json_is_base_units() -> None:
    out = estimate_json(estimate(TINY, Setup()))
    assert out["parameters"] == {"total": P, "non_embedding": P - 80, "per_gpu": P}
    assert out["train"]["total_bytes"] == 24448
    assert out["inference"]["kv_cache_bytes"] == 128
    assert out["flops_per_token"] == {"train": 8400, "inference": 2800, "convention": "palm"}
    assert out["model"]["kv_heads"] == 1 and out["model"]["ffn_hidden"] == 16
    assert "34 + 5·a·s/h" in out["formulas"]["activations"]
    json.dumps(out)


# --- the command ------------------------------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["estimate", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, *TINY_FLAGS)
    assert code == 0, err
    text = " ".join(out.split())  # the columns' padding aside
    assert (
        "custom: 2 layers, hidden 8, 2 heads (1 KV, head dim 4), gated (SwiGLU) MLP 16, vocab 10, seq 4"
        in text
    )
    assert "setup: bf16, adamw, micro-batch 1, checkpointing none, ZeRO-0, dp 1, tp 1" in text
    assert "total 1,352 V·h embedding" in text and "non-embedding 1,272" in text
    assert "weights 2.64 KiB P x 2 B" in text  # 2704 B
    assert "optimizer states 15.84 KiB P x 12 B (fp32 master + m + v)" in text  # 16224 B
    # 2816 B
    assert (
        "activations 2.75 KiB L·s·b·h·(34 + 5·a·s/h) + s·b·h·(5 + 4·v/h) B (Korthikanti et al. 2022)" in text
    )
    assert "total 23.88 KiB sum of the above" in text  # 24448 B
    assert "KV cache 128 B 2·L·kv_heads·head_dim·s·b x 2 B" in text
    assert "training 8.40 kFLOP 6·N + 12·L·H·Q·T (palm)" in text
    assert "inference 2.80 kFLOP 2·N + 4·L·H·Q·T (palm)" in text
    assert "not counted: CUDA context" in text


def test_cli_text_units_at_scale(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_cli(capsys, "--model", "llama3-8b")
    text = " ".join(out.split())
    assert "total 8.03 B" in text
    assert "weights 14.96 GiB P x 2 B" in text  # 8,030,261,248 * 2 / 2^30
    assert "KV cache 1.00 GiB" in text
    assert "training 57.91 GFLOP" in text


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, *TINY_FLAGS, "--json", "--zero", "3", "--dp", "4")
    assert code == 0
    data = json.loads(out)
    assert data["train"]["weights_bytes"] == 2 * P / 4
    assert data["train"]["total_bytes"] == 16 * P / 4 + 2816
    assert data["setup"]["zero"] == 3 and data["setup"]["dp"] == 4
    assert data["formulas"]["optimizer_states"] == "P/dp x 12 B (fp32 master + m + v)"


def test_cli_preset_with_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "--model", "llama3-8b", "--seq", "2048", "--json", "--flops-convention", "megatron"
    )
    assert code == 0
    data = json.loads(out)
    assert data["model"]["name"] == "llama3-8b" and data["model"]["seq_len"] == 2048
    assert data["parameters"]["total"] == 8_030_261_248
    n = 8_030_261_248 - 128256 * 4096
    assert data["flops_per_token"]["train"] == 6 * n + 6 * 32 * 32 * 128 * 2048
    code, out, _ = run_cli(capsys, "--model", "llama3-8b", "--seq", "2048")
    assert "llama3-8b with --seq 2048: 32 layers" in out


def test_cli_gpt2_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--model", "gpt2")
    assert code == 0 and "124.44 M" in out and "plain MLP 3072" in out and "tied embeddings, biases" in out
    code, out, _ = run_cli(capsys, *TINY_FLAGS, "--no-gated-mlp", "--tied-embeddings", "--json")
    assert code == 0
    model = json.loads(out)["model"]
    assert model["gated_mlp"] is False and model["tied_embeddings"] is True


def test_cli_flash_attention_note(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_cli(capsys, "--model", "llama3-8b")
    assert "of the activations are stored attention scores" in out and "--flash-attention" in out
    _, out, _ = run_cli(capsys, "--model", "llama3-8b", "--flash-attention")
    assert "stored attention scores" not in out and "L·34·s·b·h" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers", "2"], "give --model PRESET (llama2-7b"),
        (["--layers", "2", "--hidden", "8"], "missing --heads, --vocab, --seq"),
        (["--model", "llama9"], "unknown model preset 'llama9'"),
        ([*TINY_FLAGS[:-2], "--ffn-hidden", "0"], "--ffn-hidden: expected a positive integer, got '0'"),
        (["--model", "gpt2", "--layers", "many"], "--layers: expected a positive integer, got 'many'"),
        (["--model", "gpt2", "--heads", "5"], "hidden (768) is not divisible by heads (5)"),
        (["--model", "llama3-8b", "--kv-heads", "5"], "must be a multiple of kv_heads (5)"),
        (["--model", "gpt2", "--tp", "5"], "tensor parallel size 5 must divide the number of heads (12)"),
        (["--model", "gpt2", "--sequence-parallel"], "sequence parallelism"),
        (["--model", "gpt2", "--batch", "0"], "--batch: expected a positive integer"),
        (
            ["--model", "gpt2", "--job", "j", "--url", "ftp://x"],
            "--url: expected the daemon's http://HOST:PORT",
        ),
        (["--model", "gpt2", "--job", "j", "--fetch-timeout", "0"], "--fetch-timeout: expected a positive"),
        (["--model", "gpt2", "--dtype", "int8"], "invalid choice: 'int8'"),
        (["--model", "gpt2", "--zero", "4"], "invalid choice: '4'"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumon estimate: error: "), err
    assert message in lines[0]


# --- --job against a daemon -------------------------------------------------------------------------------


class _Daemon(BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, bytes]] = {}

    def do_GET(self) -> None:
        status, body = self.routes.get(self.path, (404, b'{"detail": "unknown job"}'))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def daemon() -> Iterator[tuple[str, dict[str, tuple[int, bytes]]]]:
    routes: dict[str, tuple[int, bytes]] = {}
    handler = type("Handler", (_Daemon,), {"routes": routes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", routes
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


GIB = 1024**3
# the fields of GET /v1/jobs/{job} that estimate reads (gpumon/jobs/jobjson.py has more)
JOB = {
    "job": "train-7b",
    "ranks": [
        {
            "rank": 1,
            "kind": "train",
            "gpus": [{"uuid": "GPU-b", "memory_used_bytes": None, "memory_total_bytes": 80 * GIB}],
        },
        {
            "rank": 0,
            "kind": "train",
            "gpus": [
                {
                    "uuid": "GPU-a",
                    "memory_used_bytes": 30 * GIB,
                    "memory_total_bytes": 80 * GIB,
                    "shared_by_ranks": 1,
                }
            ],
        },
    ],
}


def test_job_comparison(
    capsys: pytest.CaptureFixture[str], daemon: tuple[str, dict[str, tuple[int, bytes]]]
) -> None:
    url, routes = daemon
    routes["/v1/jobs/train-7b"] = (200, json.dumps(JOB).encode())
    args = [*TINY_FLAGS, "--job", "train-7b", "--url", url]
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == 0, err
    job = json.loads(out)["job"]
    assert job["estimated_per_gpu_bytes"] == {"train": 24448, "inference": 2 * P + 128}
    rank0, rank1 = job["ranks"]  # sorted by rank
    assert rank0 == {
        "rank": 0,
        "kind": "train",
        "gpus": ["GPU-a"],
        "shared": False,
        "estimated_bytes": 24448,
        "actual_bytes": 30 * GIB,
        "memory_total_bytes": 80 * GIB,
        "ratio": 30 * GIB / 24448,
    }
    assert rank1["actual_bytes"] is None and rank1["ratio"] is None
    code, out, _ = run_cli(capsys, *args)
    assert code == 0
    assert f"job train-7b ({url}): the estimate (training, or serving for inference ranks)" in out
    rows = [line.split() for line in out.splitlines()[-3:]]
    assert rows[0] == ["RANK", "KIND", "GPUS", "ESTIMATED", "USED", "GPU", "MEMORY", "USED/ESTIMATED"]
    assert rows[1] == [
        "0",
        "train",
        "1",
        "23.88",
        "KiB",
        "30.00",
        "GiB",
        "80.00",
        "GiB",
        f"{30 * GIB / 24448:.2f}",
    ]
    assert rows[2] == ["1", "train", "1", "23.88", "KiB", "-", "80.00", "GiB", "-"]


def test_job_inference_ranks_and_shared_gpus(
    capsys: pytest.CaptureFixture[str], daemon: tuple[str, dict[str, tuple[int, bytes]]]
) -> None:
    url, routes = daemon
    gpu = {
        "uuid": "GPU-a",
        "memory_used_bytes": 40 * GIB,
        "memory_total_bytes": 80 * GIB,
        "shared_by_ranks": 2,
    }
    served = {"job": "serve/a", "ranks": [{"rank": r, "kind": "inference", "gpus": [gpu]} for r in (0, 1)]}
    routes["/v1/jobs/serve%2Fa"] = (200, json.dumps(served).encode())  # the name is one path segment
    code, out, err = run_cli(capsys, *TINY_FLAGS, "--job", "serve/a", "--url", url + "/", "--json")
    assert code == 0, err
    for rank in json.loads(out)["job"]["ranks"]:
        assert rank["kind"] == "inference" and rank["estimated_bytes"] == 2 * P + 128  # weights + KV cache
        assert rank["shared"] is True
        assert (rank["actual_bytes"], rank["memory_total_bytes"]) == (20 * GIB, 40 * GIB)  # half each
    code, out, _ = run_cli(capsys, *TINY_FLAGS, "--job", "serve/a", "--url", url)
    assert "* a GPU other ranks share" in out and " 1* " in out


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (404, b"{}", "does not know job 'train-7b'"),
        (500, b"{}", "with HTTP 500"),
        (200, b"not json", "not JSON"),
        (200, b'{"ranks": 3}', "without a list of ranks"),
        (200, b'{"ranks": [{"rank": 0}]}', "has a rank without a list of GPUs"),
    ],
)
def test_job_errors_are_one_line_exit_1(
    capsys: pytest.CaptureFixture[str],
    daemon: tuple[str, dict[str, tuple[int, bytes]]],
    status: int,
    body: bytes,
    message: str,
) -> None:
    url, routes = daemon
    routes["/v1/jobs/train-7b"] = (status, body)
    code, out, err = run_cli(capsys, "--model", "gpt2", "--job", "train-7b", "--url", url)
    assert code == 1, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumon estimate: error: ") and message in lines[0], err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_daemon_down_is_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    code, out, err = run_cli(capsys, "--model", "gpt2", "--job", "j", "--url", url)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1 and f"cannot reach the gpumon daemon at {url}/v1/jobs/j" in err


def test_fetch_job_raises_daemon_error() -> None:
    with pytest.raises(DaemonError, match="cannot reach the gpumon daemon"):
        fetch_job(f"http://127.0.0.1:{_closed_port()}", "j", timeout=2.0)


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0 and "usage: gpumon estimate" in out and "--flash-attention" in out
