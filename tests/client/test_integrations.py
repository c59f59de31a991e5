"""The framework adapters and examples/train_tiny.py, run for real (CPU) against an in-test report recorder.

The frameworks are optional for gpumon: missing locally, these tests skip; in CI (CI=true) they fail.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from support.helpers import ROOT
from support.helpers import require_module as require

from gpumon.client.protocol import PATH

pytestmark = pytest.mark.slow  # real PyTorch, transformers and Lightning


class Recorder:
    """A stand-in daemon: records every report POSTed to /v1/report and answers 204."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the SDK keeps its connection alive

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != PATH:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with recorder.lock:
                    recorder.reports.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep pytest output for failures

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def final(self, job: str) -> dict[str, Any]:
        with self.lock:
            finals = [r for r in self.reports if r["job"] == job and r["final"]]
        assert len(finals) == 1, f"expected one final report for {job}, got {len(finals)}"
        return finals[0]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.stop()


@pytest.fixture(autouse=True)
def _no_gpumon_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # a developer's GPUMON_REPORT=0 or GPUMON_URL must not redirect the Reporters under test
    for name in list(os.environ):
        if name.startswith("GPUMON_"):
            monkeypatch.delenv(name)


# ---- the adapters must not drag frameworks into gpumon.client ----------------------------------------------


def test_sdk_imports_no_framework() -> None:
    code = (
        "import sys, gpumon.client; "
        "bad = [m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning') if m in sys.modules]; "
        "sys.exit(str(bad) if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize(
    ("module", "hidden", "hint"),
    [
        ("huggingface", ["transformers"], "pip install transformers"),
        ("lightning", ["lightning", "lightning.pytorch", "pytorch_lightning"], "pip install lightning"),
    ],
)
def test_missing_framework_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, module: str, hidden: list[str], hint: str
) -> None:
    for name in hidden:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules makes the import fail
    monkeypatch.delitem(sys.modules, f"gpumon.client.integrations.{module}", raising=False)
    with pytest.raises(ImportError, match=hint):
        importlib.import_module(f"gpumon.client.integrations.{module}")


# ---- Hugging Face Trainer ----------------------------------------------------------------------------------


def _hf_trainer(tmp_path: Path, callback: Any, grad_accum: int) -> Any:
    transformers = require("transformers")
    require("accelerate")
    torch = require("torch")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    tokens = torch.randint(0, 64, (40, 16))
    dataset = [{"input_ids": row, "labels": row} for row in tokens]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=5,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=grad_accum,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    return transformers.Trainer(model=model, args=args, train_dataset=dataset, callbacks=[callback])


def test_hf_trainer_reports_steps_tokens_samples_and_phases(recorder: Recorder, tmp_path: Path) -> None:
    require("transformers")
    from gpumon.client.integrations.huggingface import GpumonCallback

    callback = GpumonCallback(seq_len=16, job="hf-test", url=recorder.url, interval=60.0)
    _hf_trainer(tmp_path, callback, grad_accum=2).train()

    final = recorder.final("hf-test")
    # 5 optimizer steps x 2 micro-batches x 4 samples x 16 tokens: exactly one epoch of the 40 rows
    assert final["totals"] == {"steps": 5, "tokens": 5 * 8 * 16, "samples": 5 * 8, "requests": 0}
    assert final["anchor"]["steps"] == 1
    assert final["dtype"] == "fp32"
    assert (final["rank"], final["world_size"]) == (0, 1)
    assert set(final["phases"]) == {"forward_backward", "optimizer"}
    assert all(seconds > 0 for seconds in final["phases"].values())
    assert callback.reporter is None  # closed and dropped: a second train() starts a new incarnation


def test_hf_trainer_with_own_reporter_and_no_token_count(
    recorder: Recorder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    require("transformers")
    from gpumon.client import Reporter
    from gpumon.client.integrations.huggingface import GpumonCallback

    reporter = Reporter(job="hf-own", url=recorder.url, interval=60.0)
    with caplog.at_level(logging.INFO, logger="gpumon.client.integrations.huggingface"):
        _hf_trainer(tmp_path, GpumonCallback(reporter), grad_accum=1).train()
    assert any("reporting samples only" in r.getMessage() for r in caplog.records)
    assert reporter.enabled  # the caller's Reporter is flushed, not closed
    assert reporter.totals["steps"] == 5
    reporter.close()
    assert recorder.final("hf-own")["totals"] == {"steps": 5, "tokens": 0, "samples": 20, "requests": 0}


def test_hf_callback_rejects_ambiguous_token_count() -> None:
    require("transformers")
    from gpumon.client.integrations.huggingface import GpumonCallback

    with pytest.raises(ValueError, match="not both"):
        GpumonCallback(tokens_per_step=100, seq_len=16)


# ---- Lightning ---------------------------------------------------------------------------------------------


def _lightning_fit(callback: Any, accumulate: int) -> None:
    pl = require("lightning.pytorch")
    torch = require("torch")
    torch.manual_seed(0)

    class TinyLM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(64, 16)
            self.out = torch.nn.Linear(16, 64)

        def training_step(self, batch: list[Any], batch_idx: int) -> Any:
            (tokens,) = batch
            logits = self.out(self.emb(tokens[:, :-1]))
            return torch.nn.functional.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randint(0, 64, (40, 16))), batch_size=4
    )
    trainer = pl.Trainer(
        max_steps=5,
        accelerator="cpu",
        devices=1,
        accumulate_grad_batches=accumulate,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(TinyLM(), data)


def test_lightning_reports_every_micro_batch_per_optimizer_step(recorder: Recorder) -> None:
    require("lightning")
    from gpumon.client.integrations.lightning import GpumonCallback

    callback = GpumonCallback(
        tokens_from_batch=lambda batch: batch[0].numel(), job="pl-test", url=recorder.url, interval=60.0
    )
    _lightning_fit(callback, accumulate=2)

    final = recorder.final("pl-test")
    # 5 optimizer steps x 2 accumulated batches x 4 rows x 16 tokens
    assert final["totals"] == {"steps": 5, "tokens": 5 * 8 * 16, "samples": 5 * 8, "requests": 0}
    assert final["dtype"] == "fp32"
    assert set(final["phases"]) == {"forward_backward", "optimizer"}
    assert all(seconds > 0 for seconds in final["phases"].values())
    assert callback.reporter is None


def test_lightning_with_own_reporter_and_constant_tokens(recorder: Recorder) -> None:
    require("lightning")
    from gpumon.client import Reporter
    from gpumon.client.integrations.lightning import GpumonCallback

    reporter = Reporter(job="pl-own", url=recorder.url, interval=60.0)
    _lightning_fit(GpumonCallback(reporter, tokens_per_step=100), accumulate=1)
    assert reporter.enabled  # flushed, not closed: it belongs to the caller
    reporter.close()
    assert recorder.final("pl-own")["totals"] == {"steps": 5, "tokens": 500, "samples": 20, "requests": 0}


def test_lightning_count_returning_a_tensor_is_refused_not_synced(caplog: pytest.LogCaptureFixture) -> None:
    torch = require("torch")
    require("lightning")
    from gpumon.client import Reporter
    from gpumon.client.integrations.lightning import GpumonCallback

    reporter = Reporter(job="pl-unit", enabled=True, url="http://127.0.0.1:9", interval=60.0)
    callback = GpumonCallback(reporter, tokens_from_batch=lambda batch: batch.sum())  # .sum(): a tensor
    trainer = SimpleNamespace(global_step=0, precision="32-true", world_size=1)
    module = SimpleNamespace(automatic_optimization=True, device=torch.device("cpu"))
    batch = torch.ones(4, 16, dtype=torch.long)
    callback.on_train_start(trainer, module)  # type: ignore[arg-type]
    callback.on_train_batch_start(trainer, module, batch, 0)  # type: ignore[arg-type]
    trainer.global_step = 1
    with caplog.at_level(logging.WARNING, logger="gpumon.client.integrations.lightning"):
        callback.on_train_batch_end(trainer, module, None, batch, 0)  # type: ignore[arg-type]
    assert "not a Python int" in caplog.text
    totals = reporter.totals
    assert (totals["steps"], totals["tokens"], totals["samples"]) == (1, 0, 4)
    reporter.close(timeout=0.1)


# ---- examples/train_tiny.py --------------------------------------------------------------------------------


def test_train_tiny_throughput_matches_what_the_daemon_computes(recorder: Recorder, tmp_path: Path) -> None:
    require("torch")
    out = tmp_path / "results.json"
    peak = 1e12  # the test's stand-in for the simulated GPU's peak; the script only divides by it
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable, str(ROOT / "examples" / "train_tiny.py"),
        "--steps", "40", "--batch", "4", "--seq", "16", "--job", "tiny-test", "--url", recorder.url,
        "--device", "0", "--peak-flops", str(peak), "--report-interval", "0.5", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr

    result = json.loads(out.read_text())
    final = recorder.final("tiny-test")
    assert final["totals"]["steps"] == result["steps"] == 40
    assert final["totals"]["tokens"] == result["tokens"] == 40 * 4 * 16
    assert final["totals"]["samples"] == 40 * 4
    assert final["devices"] == ["0"]
    assert (final["dtype"], final["flops_convention"]) == ("fp32", "palm")
    assert final["flops_per_token"] == result["flops_per_token"]
    assert set(final["phases"]) == {"data_wait", "forward_backward", "optimizer"}
    # the daemon's rate: tokens after the first step() over the time from the first to the last step()
    anchor = final["anchor"]
    daemon_rate = (final["totals"]["tokens"] - anchor["tokens"]) / (final["updated"] - anchor["time"])
    assert result["tokens_per_second"] == pytest.approx(daemon_rate, rel=0.01)
    assert result["mfu"] == pytest.approx(result["tokens_per_second"] * result["flops_per_token"] / peak)
