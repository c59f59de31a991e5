"""End to end: the goodput ledger of a real training process (the real SDK, a real daemon) that starts,
checkpoints, evaluates, is SIGKILLed, restarts from an older checkpoint, redoes steps, stalls and finishes:
every bucket equals what the loop injected, each within a report interval or 10 % of itself (one tolerance
for all, a share of the whole run, would let a half-second bucket go missing unnoticed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.goodput_loop import REPORT_INTERVAL
from support.helpers import ROOT
from support.poll import poll

pytestmark = pytest.mark.slow  # about 30 s of injected time

LOOP = ROOT / "tests" / "support" / "goodput_loop.py"
JOB = "goodput-e2e"


def _tolerance(injected: float) -> float:
    """A report interval (how late a phase's end or a step is seen), or 10 % of the bucket (timing noise
    that grows with it: sleeps that overrun, the loop's own bookkeeping in its steps)."""
    return max(REPORT_INTERVAL, 0.1 * injected)


def _events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _start(url: str, log: Path, *args: str) -> tuple[subprocess.Popen[str], float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.time()
    proc = subprocess.Popen([sys.executable, str(LOOP), url, str(log), *args], env=env, text=True)
    return proc, started


def _wait_for(log: Path, kind: str, step: int | None = None, timeout: float = 60.0) -> None:
    def seen() -> bool:
        return log.exists() and any(
            e["event"] == kind and (step is None or e.get("step") == step) for e in _events(log)
        )

    poll(seen, timeout, f"a {kind} event in {log}")


def _truth(first: list[dict[str, Any]], second: list[dict[str, Any]], popen: float) -> dict[str, float]:
    """Each bucket as the loop injected it, by the ledger's rules (docs/training.md)."""
    truth = dict.fromkeys(
        ("goodput", "startup", "restart", "checkpoint", "evaluation", "data_wait", "stall", "lost_progress"),
        0.0,
    )
    steps1 = [e for e in first if e["event"] == "step"]
    steps2 = [e for e in second if e["event"] == "step"]
    truth["startup"] = steps1[0]["time"] - popen
    truth["restart"] = steps2[0]["time"] - steps1[-1]["time"]
    high = steps1[-1]["step"]
    for events in (first, second):
        opening = next(e["step"] for e in events if e["event"] == "step")
        for e in events:
            kind, step = e["event"], e.get("step")
            if kind in ("checkpoint", "evaluation"):
                truth[kind] += e["seconds"]
            elif kind == "stall":
                truth["stall"] += e["seconds"]
            elif step == opening and kind in ("data_wait", "compute"):
                continue  # before the process's first step: start-up or restart
            elif kind == "data_wait":
                truth["data_wait"] += e["seconds"]
            elif kind == "compute":  # the step that ends the stall too: it keeps its own length
                if events is second and step <= high:
                    truth["lost_progress"] += e["seconds"]
                else:
                    truth["goodput"] += e["seconds"]
    return truth


def _served(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("job_name") != JOB:
                continue
            if s.name == "gpumon_training_goodput_seconds_total":
                out["goodput"] = s.value
            elif s.name == "gpumon_training_badput_seconds_total":
                out[s.labels["cause"]] = s.value
            elif s.name == "gpumon_training_steps_redone_total":
                out["steps_redone"] = s.value
    return out


def test_every_bucket_equals_what_the_loop_injected(daemon, tmp_path: Path) -> None:
    # a short --rank-ttl: the dead rank is dropped before its successor comes, as after a real requeue; a
    # finished rank stays as long (at most 30 s), so gpumon diagnose below runs the moment the run ends
    d = daemon("--simulate", "1xH100-SXM", "--interval", "500ms", "--rank-ttl", "3s", "--counter-hold", "1s")
    log1, log2 = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first, popen = _start(
        d.url, log1, "--steps", "40", "--load", "1.0", "--checkpoint-at", "20", "--evaluate-at", "30",
        "--hang-after",
    )  # fmt: skip
    try:
        _wait_for(log1, "hang")
        time.sleep(
            0.5
        )  # a few reports: the daemon has seen step 40 (what a process never reported is unknown)
        first.send_signal(signal.SIGKILL)  # no final report: the rank died
        first.wait(10)
        time.sleep(4.0)  # the scheduler notices and starts the job again
        # meanwhile the rank is gone, but its ledger is still exported, frozen; no restart yet, so no
        # restart series (it is born at 0 when the gap lands, then takes its value)
        assert d.get(f"/v1/jobs/{JOB}").status_code == 404
        gap = _served(d.get("/metrics").text)
        assert gap["goodput"] > 0 and "restart" not in gap
        second, _ = _start(
            d.url,
            log2,
            "--steps",
            "50",
            "--resume",
            "20",
            "--load",
            "0.5",
            "--stall-at",
            "45",
            "--stall",
            "12",
        )
        # scraped while it runs, as Prometheus would: a cause's first seconds show after renders at 0
        deadline = time.monotonic() + 120
        while second.poll() is None:
            assert time.monotonic() < deadline, "the second process did not finish"
            d.get("/metrics")
            time.sleep(0.25)
        assert second.returncode == 0
        # at once, while the finished rank is listed (--rank-ttl); checked against the ledger below
        diagnosed = subprocess.run(
            [sys.executable, "-m", "gpumon", "diagnose", "--job", JOB, "--url", d.url],
            capture_output=True, text=True, timeout=30, cwd=ROOT,
        )  # fmt: skip
        job = d.get(f"/v1/jobs/{JOB}").json()
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
    end = time.time()
    truth = _truth(_events(log1), _events(log2), popen)
    served = _served(d.get("/metrics").text)
    wall = end - popen
    # a cause never seen has no series (zerofirst.py): 0
    off = {
        bucket: (served.get(bucket), injected)
        for bucket, injected in truth.items()
        if abs(served.get(bucket, 0.0) - injected) > _tolerance(injected)
    }
    assert not off, f"(served, injected) off by more than their tolerance: {off}"
    assert "slow_steps" not in served  # no baseline
    assert served["steps_redone"] == 20  # steps 21-40, the first of them in the restart's time
    accounted = sum(v for k, v in served.items() if k != "steps_redone")
    assert accounted == pytest.approx(sum(truth.values()), abs=0.02 * wall)

    ledger = job["goodput"]
    assert ledger["restarts"] == 1 and ledger["steps_redone"] == 20
    assert ledger["goodput_seconds"] == pytest.approx(served["goodput"], abs=0.5)
    assert ledger["summary"].startswith(f"goodput {100 * ledger['goodput_ratio']:.0f} % over ")
    assert "stall" in ledger["summary"] and "(1 restart, 20 steps redone)" in ledger["summary"]
    assert diagnosed.returncode == 0, diagnosed.stderr
    assert ledger["summary"] in diagnosed.stdout
