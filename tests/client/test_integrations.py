"""The framework adapters and examples/train_tiny.py, run for real (CPU) against an in-test report recorder.

The frameworks are optional for gpumon: missing locally, these tests skip; in CI (CI=true) they fail.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
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

    def of(self, job: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.reports if r["job"] == job]

    def final(self, job: str) -> dict[str, Any]:
        with self.lock:
            finals = [r for r in self.reports if r["job"] == job and r["final"]]
        assert len(finals) == 1, f"expected one final report for {job}, got {len(finals)}"
        return finals[0]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _open(body: dict[str, Any], phase: str) -> float:
    """How long ``phase`` had been running when ``body`` was built (0: it was not running)."""
    return float(body.get("open_phases", {}).get(phase, 0.0))


Probe = Callable[[str], None]


def _probe(recorder: Recorder, job: str, reporter: Callable[[], Any]) -> tuple[Probe, list[tuple[str, Any]]]:
    """``probe(where)``, called from inside a slow evaluation or save on the training thread, flushes the
    Reporter and records which phases the daemon was just told are running: ``(where, {names})``, or
    ``(where, None)`` if the flush failed. Recorded, not asserted: an assertion there would fail training."""
    seen: list[tuple[str, Any]] = []

    def probe(where: str) -> None:
        current = reporter()
        if current is None or not current.flush():
            seen.append((where, None))
            return
        # the flush's report: the Reporter numbers what it sends in order, its thread's too
        latest = max(recorder.of(job), key=lambda body: body["seq"])
        seen.append((where, set(latest.get("open_phases", {}))))

    return probe, seen


def _assert_live(recorder: Recorder, job: str) -> dict[str, Any]:
    """The periodic reports of ``job`` showed evaluation and checkpoint while they ran (the Reporter's
    interval well under the sleeps), and the final one shows nothing left running: return the final report."""
    reports = recorder.of(job)
    assert max(_open(body, "evaluation") for body in reports) > 0.3
    assert max(_open(body, "checkpoint") for body in reports) > 0.3
    final = recorder.final(job)
    assert "open_phases" not in final
    return final


class SlowRows:
    """A map-style dataset whose every item takes ``sleep`` seconds to load (in this process: the
    DataLoaders here have no workers), so a batch of ``n`` rows takes ``n * sleep``; ``loaded`` counts the
    items, and ``probe`` (called at the first item) sees what the daemon is told while the loop waits."""

    def __init__(self, items: list[Any], sleep: float, probe: Probe | None = None) -> None:
        self.items, self.sleep, self.probe = items, sleep, probe
        self.loaded = 0

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        self.loaded += 1
        time.sleep(self.sleep)
        if self.probe is not None and self.loaded == 1:
            self.probe("fetch")
        return self.items[index]

    @property
    def injected(self) -> float:
        return self.loaded * self.sleep


def _assert_data_wait(final: dict[str, Any], rows: SlowRows) -> None:
    """The run's data_wait is the loading the loop waited for, within 10 %: at least the sleeps (nothing
    else was in the dataset), at most 10 % more (the loop's own work between the hooks, batch by batch)."""
    booked = final["phases"].get("data_wait", 0.0)
    assert rows.loaded > 0
    assert rows.injected <= booked <= rows.injected * 1.1, (booked, rows.injected)


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


def _hf_trainer(
    tmp_path: Path,
    callback: Any,
    grad_accum: int,
    *,
    slow_eval: float = 0.0,
    slow_save: float = 0.0,
    eval_sets: int = 1,
    eval_error: BaseException | None = None,
    probe: Probe | None = None,
    rows: int = 40,
    fetch_sleep: float = 0.0,
    **overrides: Any,
) -> Any:
    """A tiny GPT-2 Trainer. ``slow_eval``: an eval set whose metrics take that long to compute (counted in
    ``trainer.evaluations``; the metric ``order`` is that count), ``eval_sets`` of them (named a, b, ...);
    ``slow_save``: each checkpoint's model save takes that long (counted in ``trainer.saves``).
    ``eval_error``: raised by the metrics after their sleep. ``probe``: called after each sleep, with
    "evaluate" or "save", and at the first training row's loading with "fetch". ``rows``: the training
    set's; ``fetch_sleep``: the time each of them takes to load (the set is then ``trainer.train_rows``, a
    SlowRows)."""
    transformers = require("transformers")
    require("accelerate")
    torch = require("torch")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)
    tokens = torch.randint(0, 64, (max(rows, 8), 16))
    dataset = [{"input_ids": row, "labels": row} for row in tokens]
    slow_rows = SlowRows(dataset[:rows], fetch_sleep, probe)
    settings: dict[str, Any] = {
        "output_dir": str(tmp_path),
        "max_steps": 5,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "gradient_accumulation_steps": grad_accum,
        "use_cpu": True,
        "report_to": [],
        "save_strategy": "no",
        "logging_strategy": "no",
        "disable_tqdm": True,
    }
    for name, value in overrides.items():
        settings[_hf_argument(transformers, name)] = value

    class Trainer(transformers.Trainer):
        evaluations = saves = 0
        train_rows = slow_rows

        def save_model(self, *args: Any, **kwargs: Any) -> None:
            Trainer.saves += 1
            time.sleep(slow_save)
            if probe is not None:
                probe("save")
            super().save_model(*args, **kwargs)

    def compute_metrics(prediction: Any) -> dict[str, float]:
        Trainer.evaluations += 1
        time.sleep(slow_eval)
        if probe is not None:
            probe("evaluate")
        if eval_error is not None:
            raise eval_error
        return {"order": float(Trainer.evaluations)}

    eval_dataset: Any = None
    if slow_eval:
        eval_dataset = dataset[:8] if eval_sets == 1 else {chr(97 + i): dataset[:8] for i in range(eval_sets)}
    return Trainer(
        model=model,
        args=transformers.TrainingArguments(**settings),
        train_dataset=slow_rows if fetch_sleep else dataset[:rows],
        eval_dataset=eval_dataset,
        compute_metrics=compute_metrics if slow_eval else None,
        callbacks=[callback],
    )


def _hf_argument(transformers: Any, name: str) -> str:
    """TrainingArguments' field ``name``: before transformers 4.41, eval_strategy was evaluation_strategy."""
    fields = {field.name for field in dataclasses.fields(transformers.TrainingArguments)}
    return "evaluation_strategy" if name == "eval_strategy" and name not in fields else name


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
    assert set(final["phases"]) == {"data_wait", "forward_backward", "optimizer"}
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


def test_hf_trainer_times_evaluation_and_checkpoints(recorder: Recorder, tmp_path: Path) -> None:
    require("transformers")
    from gpumon.client.integrations.huggingface import GpumonCallback

    slow_eval, slow_save = 0.4, 0.1
    callback = GpumonCallback(seq_len=16, job="hf-badput", url=recorder.url, interval=60.0)
    trainer = _hf_trainer(
        tmp_path, callback, grad_accum=1, max_steps=4, slow_eval=slow_eval, slow_save=slow_save,
        eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
        logging_strategy="steps", logging_steps=1,  # an on_log before and one inside every evaluation
    )  # fmt: skip
    trainer.train()

    assert (trainer.evaluations, trainer.saves) == (2, 2)  # at steps 2 and 4
    final = recorder.final("hf-badput")
    assert final["totals"]["steps"] == 4
    phases = final["phases"]
    assert set(phases) == {"data_wait", "forward_backward", "optimizer", "evaluation", "checkpoint"}
    # the eval metrics' on_log (after the slow metrics) must not restart the evaluation's clock
    assert phases["evaluation"] >= trainer.evaluations * slow_eval
    assert phases["checkpoint"] >= trainer.saves * slow_save
    # nor may a checkpoint's clock start before the evaluation it follows (a tiny model saves in milliseconds)
    assert phases["checkpoint"] < trainer.evaluations * slow_eval
    assert all("resumed_step" not in report for report in recorder.of("hf-badput"))  # a fresh run


def test_hf_trainer_reports_evaluation_and_checkpoint_while_they_run(
    recorder: Recorder, tmp_path: Path
) -> None:
    require("transformers")
    from gpumon.client.integrations.huggingface import GpumonCallback

    slow_eval, slow_save = 0.8, 0.8
    callback = GpumonCallback(seq_len=16, job="hf-live", url=recorder.url, interval=0.05)
    probe, seen = _probe(recorder, "hf-live", lambda: callback.reporter)
    trainer = _hf_trainer(
        tmp_path, callback, grad_accum=1, max_steps=2, slow_eval=slow_eval, slow_save=slow_save, probe=probe,
        eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
        logging_strategy="steps", logging_steps=1,
    )  # fmt: skip
    trainer.train()

    assert (trainer.evaluations, trainer.saves) == (1, 1)  # at step 2, the save after the evaluation
    # inside each, the daemon was told that one was running, and only that one
    assert seen == [("evaluate", {"evaluation"}), ("save", {"checkpoint"})]
    final = _assert_live(recorder, "hf-live")
    phases = final["phases"]
    assert phases["evaluation"] >= slow_eval
    assert phases["checkpoint"] >= slow_save
    assert phases["evaluation"] < slow_eval + slow_save / 2  # the save is not inside the evaluation
    assert phases["checkpoint"] < slow_save + slow_eval / 2  # nor the evaluation inside the save
    assert callback.held_phase is None


def test_hf_trainer_live_phases_with_two_eval_sets_and_best_saves(recorder: Recorder, tmp_path: Path) -> None:
    require("transformers")
    from gpumon.client.integrations.huggingface import GpumonCallback

    # each set's evaluation is one stretch of the phase; the save is long enough that one inside an evaluation
    # stands out from the trainer's own work around each evaluation (~0.1 s on a loaded 2-core machine)
    slow_eval, slow_save = 0.4, 1.2
    callback = GpumonCallback(job="hf-best", url=recorder.url, interval=0.05)
    probe, seen = _probe(recorder, "hf-best", lambda: callback.reporter)
    # the metric is the evaluation's count, lower is better: the first evaluation is the best, and saved
    trainer = _hf_trainer(
        tmp_path, callback, grad_accum=1, max_steps=4, slow_eval=slow_eval, slow_save=slow_save, eval_sets=2,
        probe=probe, eval_strategy="steps", eval_steps=2, save_strategy="best",
        metric_for_best_model="a_order", greater_is_better=False,
    )  # fmt: skip
    trainer.train()

    assert (trainer.evaluations, trainer.saves) == (4, 1)  # two sets at steps 2 and 4; a save at step 2 only
    # the second set's evaluation follows the first's on_evaluate: it is evaluation again, not a checkpoint
    assert (
        seen
        == [("evaluate", {"evaluation"})] * 2
        + [("save", {"checkpoint"})]
        + [("evaluate", {"evaluation"})] * 2
    )
    final = _assert_live(recorder, "hf-best")
    phases = final["phases"]
    assert phases["evaluation"] >= trainer.evaluations * slow_eval
    assert phases["checkpoint"] >= slow_save
    assert phases["checkpoint"] < slow_save + slow_eval * 0.8  # no evaluation inside
    assert phases["evaluation"] < trainer.evaluations * slow_eval + slow_save * 0.8  # no save inside
    assert callback.held_phase is None


def test_hf_trainer_that_raises_in_an_evaluation_leaves_it_at_the_next_train(
    recorder: Recorder, tmp_path: Path
) -> None:
    require("transformers")
    from gpumon.client.integrations.huggingface import GpumonCallback

    callback = GpumonCallback(job="hf-raise", url=recorder.url, interval=60.0)
    failing = _hf_trainer(
        tmp_path / "failing", callback, 1, max_steps=2, slow_eval=0.1,
        eval_error=RuntimeError("metrics broke"), eval_strategy="steps", eval_steps=2,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="metrics broke"):
        failing.train()
    # the Trainer has no exception hook: the evaluation is still open, and the daemon sees it running
    assert callback.held_phase == "evaluation"
    assert callback.reporter is not None and callback.reporter.flush()
    assert _open(max(recorder.of("hf-raise"), key=lambda body: body["seq"]), "evaluation") >= 0.1

    _hf_trainer(tmp_path / "next", callback, 1, max_steps=2).train()  # a retry: it is left before it starts
    finals = [body for body in recorder.of("hf-raise") if body["final"]]
    assert len(finals) == 2  # one per train(): the failed one's Reporter was closed by the second
    assert all("open_phases" not in body for body in finals)
    assert sorted(body["phases"].get("evaluation", 0.0) >= 0.1 for body in finals) == [False, True]
    assert callback.held_phase is None and callback.reporter is None


def test_hf_announced_phases_that_never_come_are_left_at_the_next_step() -> None:
    require("transformers")
    from gpumon.client import Reporter
    from gpumon.client.integrations.huggingface import GpumonCallback

    reporter = Reporter(job="hf-unit", enabled=True, url="http://127.0.0.1:9", interval=60.0)
    callback = GpumonCallback(reporter)
    args = SimpleNamespace(
        train_batch_size=4, gradient_accumulation_steps=1, eval_on_start=True, save_strategy="best"
    )
    state = SimpleNamespace(global_step=0)

    def control(evaluate: bool = False, save: bool = False) -> Any:
        return SimpleNamespace(should_evaluate=evaluate, should_save=save, should_log=False)

    def hook(name: str, flags: Any = None, **kwargs: Any) -> None:
        getattr(callback, name)(args, state, flags if flags is not None else control(), **kwargs)

    hook("on_train_begin")
    assert callback.held_phase == "evaluation"  # eval_on_start evaluates right after on_train_begin
    hook("on_evaluate", metrics={})
    # no save follows an eval_on_start, best-model strategy or not: the first batches are waited for
    assert callback.held_phase == "data_wait"
    hook("on_step_begin")
    hook("on_step_end", control(evaluate=True, save=True))
    assert callback.held_phase == "evaluation"
    hook("on_step_begin")  # a callback after this one took both back: neither came
    assert callback.held_phase is None
    hook("on_step_end", control(save=True))
    assert callback.held_phase == "checkpoint"
    hook("on_save")
    assert callback.held_phase == "data_wait"
    hook("on_step_end", control(save=True))
    hook("on_train_end")  # an announced save that never came ends with the run
    assert callback.held_phase is None
    phases = reporter.totals["phases"]
    assert phases["evaluation"] > 0 and phases["checkpoint"] > 0
    hook("on_evaluate", metrics={})  # trainer.evaluate() after train(): not timed
    assert callback.held_phase is None
    reporter.close(timeout=0.1)


def test_hf_data_wait_counts_only_the_span_the_next_step_ends() -> None:
    require("transformers")
    from gpumon.client import Reporter
    from gpumon.client.integrations.huggingface import GpumonCallback

    reporter = Reporter(job="hf-unit-wait", enabled=True, url="http://127.0.0.1:9", interval=60.0)
    callback = GpumonCallback(reporter)
    args = SimpleNamespace(train_batch_size=4, gradient_accumulation_steps=1, save_strategy="steps")
    state = SimpleNamespace(global_step=0)
    quiet = SimpleNamespace(should_evaluate=False, should_save=False, should_log=False)

    def hook(name: str, pause: float = 0.0) -> float:
        """Sleep ``pause`` (the loop's work before the hook), call it; the data_wait booked so far."""
        time.sleep(pause)
        getattr(callback, name)(args, state, quiet)
        return float(reporter.totals["phases"].get("data_wait", 0.0))

    hook("on_train_begin")
    hook("on_epoch_begin")
    first = hook("on_step_begin", 0.1)  # the epoch's iterator and first batch
    assert 0.1 <= first < 0.2
    hook("on_step_end")
    # a save no flag announced (a callback after this one asked for it) is a checkpoint, not a wait
    assert hook("on_save", 0.1) == first
    assert reporter.totals["phases"]["checkpoint"] >= 0.1
    second = hook("on_step_begin", 0.05)
    assert 0.05 <= second - first < 0.1
    hook("on_step_end")
    assert hook("on_log", 0.1) == second  # logging, the loss's .item() waiting for the GPU: no wait either
    third = hook("on_step_begin", 0.05)
    assert 0.05 <= third - second < 0.1
    hook("on_step_end")
    # the epoch's and the run's end: no batch followed the last step
    assert hook("on_epoch_end", 0.1) == third
    assert hook("on_train_end", 0.1) == third
    assert callback.held_phase is None
    reporter.close(timeout=0.1)


def test_hf_trainer_resumed_from_checkpoint_reports_its_step(recorder: Recorder, tmp_path: Path) -> None:
    require("transformers")
    from gpumon.client import Reporter
    from gpumon.client.integrations.huggingface import GpumonCallback

    first = GpumonCallback(job="hf-first", url=recorder.url, interval=60.0)
    _hf_trainer(tmp_path / "first", first, 1, max_steps=4, save_strategy="steps", save_steps=2).train()
    checkpoint = tmp_path / "first" / "checkpoint-2"
    assert checkpoint.is_dir()
    assert all("resumed_step" not in report for report in recorder.of("hf-first"))

    # a Reporter the callback owns is created with the checkpoint's step
    owned = GpumonCallback(job="hf-resumed", url=recorder.url, interval=60.0)
    _hf_trainer(tmp_path / "owned", owned, 1, max_steps=4).train(resume_from_checkpoint=str(checkpoint))
    assert recorder.final("hf-resumed")["totals"]["steps"] == 2  # steps 3 and 4
    assert {report.get("resumed_step") for report in recorder.of("hf-resumed")} == {2}  # in every report

    # the caller's Reporter is told with resume(); an evaluate() after train() is not the run's badput
    reporter = Reporter(job="hf-resumed-own", url=recorder.url, interval=60.0)
    trainer = _hf_trainer(
        tmp_path / "own", GpumonCallback(reporter), 1, max_steps=4, slow_eval=0.2, eval_strategy="steps"
    )  # evaluates at the end (at step 4): eval_steps come from the checkpoint's state, here the default 500
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert reporter.settings.resumed_step == 2
    assert trainer.evaluations == 1
    evaluation = reporter.totals["phases"]["evaluation"]
    assert evaluation >= 0.2
    trainer.evaluate()
    assert trainer.evaluations == 2
    assert reporter.totals["phases"]["evaluation"] == evaluation
    reporter.close()
    assert recorder.final("hf-resumed-own")["resumed_step"] == 2


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_hf_trainer_books_a_slow_input_pipeline_as_data_wait(
    recorder: Recorder, tmp_path: Path, grad_accum: int
) -> None:
    require("transformers")
    from gpumon.client.integrations.huggingface import GpumonCallback

    # 6 batches of 4 rows an epoch and 4 optimizer steps: the run crosses into a second epoch (a new
    # iterator); with accumulation every micro-batch is fetched before its step's on_step_begin
    job = f"hf-wait-{grad_accum}"
    callback = GpumonCallback(seq_len=16, job=job, url=recorder.url, interval=60.0)
    trainer = _hf_trainer(
        tmp_path, callback, grad_accum, max_steps=4, rows=24, fetch_sleep=0.03, logging_strategy="steps",
        logging_steps=1,
    )  # fmt: skip
    trainer.train()

    final = recorder.final(job)
    assert final["totals"]["steps"] == 4
    # a batch of 4 rows takes 0.12 s; at least one per micro-batch (accelerate's loader reads one ahead)
    assert trainer.train_rows.loaded >= 4 * grad_accum * 4
    _assert_data_wait(final, trainer.train_rows)
    assert "open_phases" not in final


def test_hf_trainer_books_no_evaluation_or_checkpoint_as_data_wait(
    recorder: Recorder, tmp_path: Path
) -> None:
    require("transformers")
    from gpumon.client.integrations.huggingface import GpumonCallback

    slow_eval, slow_save = 0.6, 0.6
    callback = GpumonCallback(seq_len=16, job="hf-wait-badput", url=recorder.url, interval=0.05)
    probe, seen = _probe(recorder, "hf-wait-badput", lambda: callback.reporter)
    trainer = _hf_trainer(
        tmp_path, callback, 2, max_steps=4, rows=24, fetch_sleep=0.03, slow_eval=slow_eval,
        slow_save=slow_save, probe=probe, eval_strategy="steps", eval_steps=2, save_strategy="steps",
        save_steps=2, logging_strategy="steps", logging_steps=1,
    )  # fmt: skip
    trainer.train()

    assert (trainer.evaluations, trainer.saves) == (2, 2)  # at steps 2 and 4, between fetches
    # while the loop waited for data the daemon was told so, and only that
    assert seen[0] == ("fetch", {"data_wait"})
    final = recorder.final("hf-wait-badput")
    _assert_data_wait(final, trainer.train_rows)
    phases = final["phases"]
    assert phases["evaluation"] >= 2 * slow_eval
    assert phases["checkpoint"] >= 2 * slow_save
    assert max(_open(body, "data_wait") for body in recorder.of("hf-wait-badput")) > 0.0
    assert "open_phases" not in final


def test_hf_callback_rejects_ambiguous_token_count() -> None:
    require("transformers")
    from gpumon.client.integrations.huggingface import GpumonCallback

    with pytest.raises(ValueError, match="not both"):
        GpumonCallback(tokens_per_step=100, seq_len=16)


# ---- Lightning ---------------------------------------------------------------------------------------------


def _tiny_lm(val_sleep: float = 0.0, sanity_sleep: float = 0.0, save_sleep: float = 0.0) -> Any:
    """A tiny LightningModule. ``validations`` counts validation runs during fit (not the sanity check), each
    batch of which sleeps ``val_sleep`` (``sanity_sleep`` in the sanity check); ``saves`` counts checkpoints,
    each of which sleeps ``save_sleep``; ``save_error``, if set, is raised by every save (after the sleep),
    ``val_error`` by every validation batch during fit; ``probe``, if set, is called after each sleep with
    "validate" or "save"."""
    pl = require("lightning.pytorch")
    torch = require("torch")
    torch.manual_seed(0)

    class TinyLM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(64, 16)
            self.out = torch.nn.Linear(16, 64)
            self.validations = self.saves = 0
            self.save_error: BaseException | None = None
            self.val_error: BaseException | None = None
            self.probe: Probe | None = None

        def _loss(self, batch: list[Any]) -> Any:
            (tokens,) = batch
            logits = self.out(self.emb(tokens[:, :-1]))
            return torch.nn.functional.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))

        def training_step(self, batch: list[Any], batch_idx: int) -> Any:
            return self._loss(batch)

        def validation_step(self, batch: list[Any], batch_idx: int) -> Any:
            if self.trainer.sanity_checking:
                time.sleep(sanity_sleep)
                return self._loss(batch)
            time.sleep(val_sleep)
            if self.probe is not None:
                self.probe("validate")
            if self.val_error is not None:
                raise self.val_error
            return self._loss(batch)

        def on_validation_start(self) -> None:
            if not self.trainer.sanity_checking:
                self.validations += 1

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.saves += 1
            time.sleep(save_sleep)
            if self.probe is not None:
                self.probe("save")
            if self.save_error is not None:
                raise self.save_error

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return TinyLM()


def _token_rows(rows: int, fetch_sleep: float = 0.0, probe: Probe | None = None) -> Any:
    """Batches of 4 rows of 16 tokens; with ``fetch_sleep`` each row takes that long to load (the dataset,
    a SlowRows, is the loader's ``dataset``)."""
    torch = require("torch")
    data = torch.utils.data.TensorDataset(torch.randint(0, 64, (rows, 16)))
    if fetch_sleep:
        data = SlowRows([data[i] for i in range(rows)], fetch_sleep, probe)
    return torch.utils.data.DataLoader(data, batch_size=4)


def _lightning_trainer(*callbacks: Any, **overrides: Any) -> Any:
    pl = require("lightning.pytorch")
    settings: dict[str, Any] = {
        "max_steps": 5,
        "accelerator": "cpu",
        "devices": 1,
        # a ModelCheckpoint among the callbacks is the only one, else none
        "enable_checkpointing": any(isinstance(cb, pl.callbacks.Checkpoint) for cb in callbacks),
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "callbacks": list(callbacks),
        **overrides,
    }
    return pl.Trainer(**settings)


def _lightning_fit(callback: Any, accumulate: int) -> None:
    trainer = _lightning_trainer(callback, accumulate_grad_batches=accumulate)
    trainer.fit(_tiny_lm(), _token_rows(40))


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
    assert set(final["phases"]) == {"data_wait", "forward_backward", "optimizer"}
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


def test_lightning_times_validation_and_checkpoints(recorder: Recorder, tmp_path: Path) -> None:
    pl = require("lightning.pytorch")
    from gpumon.client.integrations.lightning import GpumonCallback

    val_sleep, sanity_sleep, save_sleep = 0.05, 0.6, 0.1
    callback = GpumonCallback(job="pl-badput", url=recorder.url, interval=60.0)
    saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = _lightning_trainer(
        callback, saver, max_steps=4, val_check_interval=2, limit_val_batches=2, num_sanity_val_steps=1
    )
    module = _tiny_lm(val_sleep=val_sleep, sanity_sleep=sanity_sleep, save_sleep=save_sleep)
    trainer.fit(module, _token_rows(40), _token_rows(8))

    assert (module.validations, module.saves) == (2, 2)  # after steps 2 and 4
    final = recorder.final("pl-badput")
    assert final["totals"]["steps"] == 4
    phases = final["phases"]
    assert set(phases) == {"data_wait", "forward_backward", "optimizer", "evaluation", "checkpoint"}
    assert phases["evaluation"] >= module.validations * 2 * val_sleep
    assert phases["evaluation"] < sanity_sleep  # the sanity check is no evaluation of the run
    assert phases["checkpoint"] >= module.saves * save_sleep
    assert all("resumed_step" not in report for report in recorder.of("pl-badput"))  # a fresh run
    assert "save_checkpoint" not in vars(trainer)  # the class's method again
    assert callback.reporter is None


def test_lightning_reports_validation_and_checkpoints_while_they_run(
    recorder: Recorder, tmp_path: Path
) -> None:
    pl = require("lightning.pytorch")
    from gpumon.client.integrations.lightning import GpumonCallback

    val_sleep, save_sleep = 0.4, 0.8  # two validation batches: 0.8 s a validation

    class SaveInsideValidation(
        pl.Callback
    ):  # before this callback's on_validation_end: inside the evaluation
        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            trainer.save_checkpoint(tmp_path / f"inside-{trainer.global_step}.ckpt")

    callback = GpumonCallback(job="pl-live", url=recorder.url, interval=0.05)
    trainer = _lightning_trainer(
        callback, SaveInsideValidation(), max_steps=2, val_check_interval=2, limit_val_batches=2,
        num_sanity_val_steps=0,
    )  # fmt: skip
    module = _tiny_lm(val_sleep=val_sleep, save_sleep=save_sleep)
    module.probe, seen = _probe(recorder, "pl-live", lambda: callback.reporter)
    trainer.fit(module, _token_rows(40), _token_rows(8))

    assert (module.validations, module.saves) == (1, 1)
    # inside each, the daemon was told that one was running, and only that one
    assert seen == [("validate", {"evaluation"})] * 2 + [("save", {"checkpoint"})]
    final = _assert_live(recorder, "pl-live")
    phases = final["phases"]
    assert phases["evaluation"] >= 2 * val_sleep
    assert phases["checkpoint"] >= save_sleep
    assert phases["evaluation"] < 2 * val_sleep + save_sleep / 2  # the save inside it was taken out
    assert phases["checkpoint"] < save_sleep + val_sleep / 2
    assert callback.held_phase is None


@pytest.mark.parametrize("accumulate", [1, 2])
def test_lightning_books_a_slow_input_pipeline_as_data_wait(recorder: Recorder, accumulate: int) -> None:
    require("lightning")
    from gpumon.client.integrations.lightning import GpumonCallback

    job = f"pl-wait-{accumulate}"
    callback = GpumonCallback(job=job, url=recorder.url, interval=60.0)
    # 6 batches an epoch, two epochs: each epoch's first batch comes from a new iterator
    loader = _token_rows(24, fetch_sleep=0.03)
    _lightning_trainer(callback, max_steps=-1, max_epochs=2, accumulate_grad_batches=accumulate).fit(
        _tiny_lm(), loader
    )

    final = recorder.final(job)
    assert final["totals"]["steps"] == 12 // accumulate
    assert loader.dataset.loaded == 2 * 24  # every micro-batch's fetch, each a wait of 0.12 s
    _assert_data_wait(final, loader.dataset)
    assert "open_phases" not in final


def test_lightning_books_no_validation_or_checkpoint_as_data_wait(recorder: Recorder, tmp_path: Path) -> None:
    pl = require("lightning.pytorch")
    from gpumon.client.integrations.lightning import GpumonCallback

    val_sleep, save_sleep = 0.3, 0.6  # two validation batches: 0.6 s a validation
    callback = GpumonCallback(job="pl-wait-badput", url=recorder.url, interval=0.05)
    saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = _lightning_trainer(
        callback, saver, max_steps=4, val_check_interval=2, limit_val_batches=2, num_sanity_val_steps=0,
        accumulate_grad_batches=1,
    )  # fmt: skip
    module = _tiny_lm(val_sleep=val_sleep, save_sleep=save_sleep)
    module.probe, seen = _probe(recorder, "pl-wait-badput", lambda: callback.reporter)
    loader = _token_rows(40, fetch_sleep=0.03, probe=module.probe)
    trainer.fit(module, loader, _token_rows(8))

    assert (module.validations, module.saves) == (2, 2)  # after steps 2 and 4, between fetches
    # while the loop waited for data the daemon was told so, and only that
    assert seen[0] == ("fetch", {"data_wait"})
    final = recorder.final("pl-wait-badput")
    _assert_data_wait(final, loader.dataset)
    phases = final["phases"]
    assert phases["evaluation"] >= 2 * 2 * val_sleep
    assert phases["checkpoint"] >= 2 * save_sleep
    assert "open_phases" not in final


def test_lightning_failing_validation_leaves_the_evaluation(recorder: Recorder) -> None:
    require("lightning")
    from gpumon.client.integrations.lightning import GpumonCallback

    callback = GpumonCallback(job="pl-val-fail", url=recorder.url, interval=60.0)
    trainer = _lightning_trainer(
        callback, max_steps=2, val_check_interval=2, limit_val_batches=1, num_sanity_val_steps=0
    )
    module = _tiny_lm(val_sleep=0.1)
    module.val_error = RuntimeError("validation broke")
    with pytest.raises(RuntimeError, match="validation broke"):
        trainer.fit(module, _token_rows(40), _token_rows(8))

    final = recorder.final("pl-val-fail")  # on_exception sent it, the evaluation left before
    assert "open_phases" not in final
    assert final["phases"]["evaluation"] >= 0.1
    assert callback.held_phase is None and callback.reporter is None


def test_lightning_fit_from_a_checkpoint_reports_its_step(recorder: Recorder, tmp_path: Path) -> None:
    pl = require("lightning.pytorch")
    torch = require("torch")
    from gpumon.client import Reporter
    from gpumon.client.integrations.lightning import GpumonCallback

    saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    first = _lightning_trainer(GpumonCallback(job="pl-first", url=recorder.url, interval=60.0), saver)
    first.fit(_tiny_lm(), _token_rows(40))
    (path,) = tmp_path.glob("*step=3.ckpt")
    step = torch.load(path, weights_only=False)["global_step"]
    assert step == 3
    assert all("resumed_step" not in report for report in recorder.of("pl-first"))

    # a Reporter the callback owns is created with the checkpoint's step
    owned = _lightning_trainer(GpumonCallback(job="pl-resumed", url=recorder.url, interval=60.0), max_steps=5)
    owned.fit(_tiny_lm(), _token_rows(40), ckpt_path=str(path))
    assert recorder.final("pl-resumed")["totals"]["steps"] == 2  # steps 4 and 5
    assert {report.get("resumed_step") for report in recorder.of("pl-resumed")} == {step}

    # the caller's Reporter is told with resume(); a validate() after fit is not the run's badput
    reporter = Reporter(job="pl-resumed-own", url=recorder.url, interval=60.0)
    trainer = _lightning_trainer(
        GpumonCallback(reporter), max_steps=5, val_check_interval=1, limit_val_batches=1
    )
    module = _tiny_lm(val_sleep=0.05)
    trainer.fit(module, _token_rows(40), _token_rows(8), ckpt_path=str(path))
    assert module.validations == 2  # after steps 4 and 5
    assert reporter.settings.resumed_step == step
    evaluation = reporter.totals["phases"]["evaluation"]
    assert evaluation >= module.validations * 0.05
    trainer.validate(module, _token_rows(8))
    assert reporter.totals["phases"]["evaluation"] == evaluation
    reporter.close()
    assert recorder.final("pl-resumed-own")["resumed_step"] == step


def test_lightning_checkpoint_timing_keeps_the_callers_save_checkpoint(
    recorder: Recorder, tmp_path: Path
) -> None:
    pl = require("lightning.pytorch")
    from gpumon.client.integrations.lightning import GpumonCallback

    saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    callback = GpumonCallback(job="pl-spy", url=recorder.url, interval=60.0)
    trainer = _lightning_trainer(callback, saver, max_steps=4)
    calls: list[str] = []
    original = trainer.save_checkpoint

    def spy(filepath: Any, *args: Any, **kwargs: Any) -> None:  # the caller's own instance attribute
        calls.append(str(filepath))
        time.sleep(0.1)
        original(filepath, *args, **kwargs)

    trainer.save_checkpoint = spy
    trainer.fit(_tiny_lm(), _token_rows(40))
    assert len(calls) == 2
    assert vars(trainer)["save_checkpoint"] is spy  # put back as it was, not deleted
    assert recorder.final("pl-spy")["phases"]["checkpoint"] >= 2 * 0.1  # timed through the caller's


def test_lightning_times_the_last_checkpoint_saved_at_train_end(recorder: Recorder, tmp_path: Path) -> None:
    pl = require("lightning.pytorch")
    from gpumon.client.integrations.lightning import GpumonCallback

    # nothing saved during the run: ModelCheckpoint saves "last" in its on_train_end, after this callback's
    saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=100)
    trainer = _lightning_trainer(GpumonCallback(job="pl-last", url=recorder.url, interval=60.0), saver)
    module = _tiny_lm(save_sleep=0.1)
    trainer.fit(module, _token_rows(40))
    assert module.saves == 1
    assert (tmp_path / "last.ckpt").is_file()
    assert recorder.final("pl-last")["phases"]["checkpoint"] >= 0.1


def test_lightning_failing_checkpoint_propagates_and_is_unwrapped_once(
    recorder: Recorder, tmp_path: Path
) -> None:
    pl = require("lightning.pytorch")
    from gpumon.client.integrations.lightning import GpumonCallback

    callback = GpumonCallback(job="pl-fail", url=recorder.url, interval=60.0)
    saver = pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = _lightning_trainer(callback, saver, max_steps=4)
    module = _tiny_lm(save_sleep=0.1)
    module.save_error = OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        trainer.fit(module, _token_rows(40))

    assert module.saves == 1
    assert "save_checkpoint" not in vars(trainer)
    callback.teardown(trainer, module, "fit")  # a late hook finds nothing left to undo or to send
    assert "save_checkpoint" not in vars(trainer)
    final = recorder.final("pl-fail")  # exactly one: on_exception sent it
    assert final["totals"]["steps"] == 2
    assert final["phases"]["checkpoint"] >= 0.1  # the failed save held training up too
    assert "open_phases" not in final  # and its phase was left before the final report
    assert callback.held_phase is None


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
