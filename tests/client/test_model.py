"""gpumon.client.model: parameter counts and FLOPs per token, checked against arithmetic done by hand."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import ROOT

from gpumon.client.model import PRESETS, ModelSpec, default_ffn_hidden, preset

MODEL_PY = ROOT / "gpumon" / "client" / "model.py"

# A model small enough to count by hand: 2 layers, hidden 8, 2 query heads of dim 4, 1 KV head (GQA),
# gated MLP 16 wide, vocab 10, sequence 4.
TINY = ModelSpec(layers=2, hidden=8, heads=2, kv_heads=1, vocab=10, seq_len=4, ffn_hidden=16)
# q 8x8 = 64, k 8x4 = 32, v 8x4 = 32, o 8x8 = 64             -> attention 192 per layer
# gated MLP: 3 matrices 8x16 = 3 * 128                        -> 384 per layer
# two norms of 8                                               -> 16 per layer
# per layer 192 + 384 + 16 = 592; two layers                   -> 1184
# embedding 10x8 = 80, final norm 8, output head 10x8 = 80     -> total 80 + 1184 + 8 + 80 = 1352
TINY_TOTAL = 1352
TINY_N = 1352 - 80  # the input embedding is a lookup: 1272
# L·H·Q·T = 2 * 2 * 4 * 4 = 64
TINY_LHQT = 64


def test_tiny_model_parameters_by_hand() -> None:
    assert TINY.resolved_kv_heads == 1 and TINY.resolved_head_dim == 4 and TINY.resolved_ffn_hidden == 16
    assert TINY.parameter_breakdown() == {
        "embedding": 80,
        "position_embedding": 0,
        "attention": 2 * 192,
        "mlp": 2 * 384,
        "norms": 2 * 16 + 8,
        "output_head": 80,
    }
    assert TINY.parameters() == TINY_TOTAL
    assert TINY.non_embedding_parameters() == TINY_N
    assert TINY.attention_flops_term() == TINY_LHQT


def test_flops_per_token_palm_and_megatron_by_hand() -> None:
    # PaLM: train 6N + 12·LHQT = 6*1272 + 12*64 = 7632 + 768 = 8400; inference 2N + 4·LHQT = 2544 + 256
    assert TINY.flops_per_token() == 8400
    assert TINY.flops_per_token(train=True, convention="palm") == 8400
    assert TINY.flops_per_token(train=False) == 2800
    # Megatron halves the attention term: 7632 + 6*64 = 8016; inference 2544 + 2*64 = 2672
    assert TINY.flops_per_token(convention="megatron") == 8016
    assert TINY.flops_per_token(train=False, convention="megatron") == 2672


def test_unknown_convention_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"unknown FLOPs convention 'kaplan'.*palm, megatron"):
        TINY.flops_per_token(convention="kaplan")


def test_plain_mlp_and_defaults() -> None:
    # plain MLP: ffn defaults to 4h = 32, two matrices 2 * 8 * 32 = 512 per layer; MHA: kv_heads = heads
    plain = ModelSpec(layers=1, hidden=8, heads=2, vocab=10, seq_len=4, gated_mlp=False)
    assert plain.resolved_ffn_hidden == 32 and plain.resolved_kv_heads == 2
    # q, k, v, o all 8x8 = 256; MLP 512; norms 16; embedding 80 + final norm 8 + head 80
    assert plain.parameters() == 256 + 512 + 16 + 80 + 8 + 80


def test_gated_ffn_default_is_the_llama_rule() -> None:
    # int(2 * 4 * 4096 / 3) = 10922, rounded up to a multiple of 256 = 11008 (LLaMA-2 7B's width)
    assert default_ffn_hidden(4096, gated_mlp=True) == 11008
    # int(2 * 4 * 5120 / 3) = 13653 -> 13824 (LLaMA-2 13B's)
    assert default_ffn_hidden(5120, gated_mlp=True) == 13824
    # int(2 * 32 / 3) = 21 -> 256
    assert default_ffn_hidden(8, gated_mlp=True) == 256
    assert default_ffn_hidden(8, gated_mlp=False) == 32
    derived = ModelSpec(layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096)
    assert derived.parameters() == PRESETS["llama2-7b"].parameters()


def test_tied_embeddings_keep_the_output_head_in_n() -> None:
    tied = dataclasses.replace(TINY, tied_embeddings=True)
    assert tied.parameters() == TINY_TOTAL - 80  # the head is the embedding matrix, counted once
    # the shared matrix still multiplies every token into logits: N is the same as untied
    assert tied.non_embedding_parameters() == TINY_N
    assert tied.flops_per_token() == TINY.flops_per_token()


def test_biases_and_learned_positions_by_hand() -> None:
    spec = ModelSpec(
        layers=1, hidden=8, heads=2, vocab=10, seq_len=4, gated_mlp=False, biases=True, learned_positions=True
    )
    # weights as in test_plain_mlp_and_defaults: 256 + 512 + 16 + 80 + 8 + 80 = 952
    # biases: q, k, v 8 each + o 8 = 32; MLP 32 + 8 = 40; two LayerNorm biases 16; final LayerNorm bias 8
    # learned positions: 4 x 8 = 32
    assert spec.parameters() == 952 + 32 + 40 + 16 + 8 + 32
    # N leaves out both embeddings (token 80, position 32)
    assert spec.non_embedding_parameters() == spec.parameters() - 80 - 32


@pytest.mark.parametrize(
    ("name", "published"),
    [
        # Hugging Face parameter counts of the released checkpoints
        ("llama2-7b", 6_738_415_616),
        ("llama2-13b", 13_015_864_320),
        ("llama2-70b", 68_976_648_192),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("mistral-7b", 7_241_732_096),
        ("gpt2", 124_439_808),
    ],
)
def test_presets_match_published_sizes(name: str, published: int) -> None:
    count = PRESETS[name].parameters()
    assert abs(count - published) / published < 0.01
    assert count == published  # in fact exactly


@pytest.mark.parametrize(
    ("name", "rounded"), [("llama2-7b", 6.74e9), ("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9)]
)
def test_presets_match_the_rounded_sizes_in_the_papers(name: str, rounded: float) -> None:
    assert PRESETS[name].parameters() == pytest.approx(rounded, rel=0.01)


def test_llama2_7b_flops_by_hand() -> None:
    spec = PRESETS["llama2-7b"]
    n = 6_738_415_616 - 32000 * 4096  # minus the input embedding: 6,607,343,616
    assert spec.non_embedding_parameters() == n
    lhqt = 32 * 32 * 128 * 4096
    assert spec.flops_per_token() == 6 * n + 12 * lhqt
    assert spec.flops_per_token(train=False, convention="megatron") == 2 * n + 2 * lhqt


def test_preset_lookup() -> None:
    assert preset(" Llama3-8B ") is PRESETS["llama3-8b"]
    with pytest.raises(ValueError, match=r"unknown model preset 'llama9'.*llama2-7b"):
        preset("llama9")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"layers": 0}, "ModelSpec.layers must be a positive integer, got 0"),
        ({"hidden": -8}, "ModelSpec.hidden must be a positive integer"),
        ({"layers": True}, "ModelSpec.layers must be a positive integer, got True"),
        ({"vocab": 10.0}, "ModelSpec.vocab must be a positive integer"),
        ({"kv_heads": 0}, "ModelSpec.kv_heads must be a positive integer"),
        ({"heads": 3}, r"hidden \(8\) is not divisible by heads \(3\); fix one of them or give head_dim"),
        ({"kv_heads": 3, "heads": 4}, r"heads \(4\) must be a multiple of kv_heads \(3\)"),
        ({"gated_mlp": "yes"}, "ModelSpec.gated_mlp must be true or false"),
        ({"name": 7}, "ModelSpec.name must be a string"),
    ],
)
def test_validation_says_what_to_fix(kw: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"layers": 2, "hidden": 8, "heads": 2, "vocab": 10, "seq_len": 4}
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**base, **kw})  # type: ignore[arg-type]


def test_explicit_head_dim_allows_any_hidden() -> None:
    # 3 heads of dim 4 on hidden 8: q 8x12 = 96, k, v 8x12 = 96 each, o 12x8 = 96
    spec = ModelSpec(layers=1, hidden=8, heads=3, head_dim=4, vocab=10, seq_len=4, ffn_hidden=16)
    assert spec.parameter_breakdown()["attention"] == 4 * 96


def test_is_standard_library_only() -> None:
    # the SDK imports this inside training processes, where only the training stack is installed
    tree = ast.parse(MODEL_PY.read_text())
    imported = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_the_whole_sdk_reports_from_a_python_without_site_packages(tmp_path: Path) -> None:
    """gpumon.client as a training process imports it where nothing but the standard library is installed
    (-S: no site-packages): steps, a phase, a final report over HTTP."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "import http.server, json, threading\n"
        "got = []\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        "        got.append(json.loads(self.rfile.read(int(self.headers['Content-Length']))))\n"
        "        self.send_response(204); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        "srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)\n"
        "threading.Thread(target=srv.serve_forever, daemon=True).start()\n"
        "from gpumon.client import Reporter\n"
        "r = Reporter(job='bare', url='http://127.0.0.1:%d' % srv.server_address[1], dtype='bf16')\n"
        "for _ in range(5):\n"
        "    with r.phase('data_wait'): pass\n"
        "    r.step(tokens=10, samples=1)\n"
        "r.close()\n"
        "third = sorted(set(sys.modules) & {'prometheus_client', 'fastapi', 'psutil', 'pynvml'})\n"
        "print(got[-1]['final'], got[-1]['totals']['tokens'], third)\n"
    )
    env = {"PATH": os.environ.get("PATH", "")}
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "50", "[]"]
