"""End to end: a real PyTorch training script reports through the SDK to a real daemon with simulated GPUs,
and what /metrics and /v1/jobs expose matches what the script measured itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import ROOT, require_module

pytestmark = pytest.mark.slow  # real PyTorch training

H100_FP32 = 67e12  # the simulated GPU 0 is an H100 SXM; the script trains in fp32


def value(text: str, name: str, job: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels.get("job_name") == job:
                return s.value
    raise AssertionError(f"{name} for {job} not served")


def test_train_tiny_as_the_readme_runs_it_writes_no_file_and_no_numpy_warning(tmp_path) -> None:
    """A fresh CPU-torch install has no NumPy: torch warns on import, which the example silences. Without
    --out it prints its figures and leaves the working tree as it was. No daemon: the SDK never blocks."""
    require_module("torch")
    example = str(ROOT / "examples" / "train_tiny.py")
    no_numpy = (
        "import runpy, sys; sys.modules['numpy'] = None; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    cmd = [
        sys.executable,
        "-c",
        no_numpy,
        example,
        "--steps",
        "3",
        "--batch",
        "2",
        "--seq",
        "8",
        "--url",
        "http://127.0.0.1:9",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["steps"] == 3
    assert "NumPy" not in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_train_tiny_against_the_daemon_matches_the_script_within_one_percent(daemon, tmp_path) -> None:
    require_module("torch")
    d = daemon("--simulate", "2xH100-SXM", "--interval", "500ms", "--rate-window", "10m")
    out = tmp_path / "results.json"
    cmd = [
        sys.executable, str(ROOT / "examples" / "train_tiny.py"),
        "--steps", "60", "--batch", "4", "--seq", "16", "--job", "tiny-e2e", "--url", d.url,
        "--device", "0", "--peak-flops", str(H100_FP32), "--report-interval", "0.2", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    mine = json.loads(out.read_text())

    metrics = d.get("/metrics").text
    assert value(metrics, "gpumon_training_steps_total", "tiny-e2e") == mine["steps"] == 60
    assert value(metrics, "gpumon_training_tokens_total", "tiny-e2e") == mine["tokens"]
    # the run is over: its rank no longer counts in the job's throughput, MFU or GPUs on /metrics ...
    for gone in ("job_tokens_per_second", "job_mfu_ratio", "job_peak_flops_per_second", "rank_gpu_info"):
        with pytest.raises(AssertionError, match="not served"):
            value(metrics, f"gpumon_training_{gone}", "tiny-e2e")

    # ... and /v1/jobs keeps its last window, as the script measured it
    job = d.get("/v1/jobs/tiny-e2e").json()
    (rank,) = job["ranks"]
    assert rank["rates"]["tokens_per_second"] == pytest.approx(mine["tokens_per_second"], rel=0.01)
    assert rank["mfu"] == pytest.approx(mine["mfu"], rel=0.01)
    assert rank["peak_flops_per_second"] == H100_FP32
    assert rank["final"] is True and rank["gone"] == "finished"
    assert rank["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert rank["flops_per_token"] == mine["flops_per_token"]
    assert set(rank["rates"]["phase_ratios"]) >= {"data_wait", "forward_backward", "optimizer"}
    assert job["diagnosis"]["bottleneck"] and job["diagnosis"]["evidence"]


def test_a_first_loop_on_a_simulated_gpu_gets_the_verdict_its_phases_call_for(daemon, tmp_path) -> None:
    """Two real training loops on two simulated GPUs of an otherwise idle node: one waits on a slow input
    pipeline, the other computes. Each GPU follows its own loop's phases, and each job gets its verdict."""
    require_module("torch")
    d = daemon("--simulate", "3xH100-SXM", "--interval", "250ms", "--rate-window", "8s")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def loop(job: str, device: str, *extra: str) -> subprocess.Popen[str]:
        cmd = [
            sys.executable, str(ROOT / "examples" / "train_tiny.py"), "--steps", "100000", "--job", job,
            "--url", d.url, "--device", device, "--report-interval", "0.25", "--out", str(tmp_path / job),
            *extra,
        ]  # fmt: skip
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    slow, fast = loop("waits-on-data", "0", "--data-delay", "0.2"), loop("computes", "1")
    try:
        deadline = time.monotonic() + 90
        wanted = {"waits-on-data": "input", "computes": "compute"}
        verdicts: list[dict[str, str]] = []
        # the verdicts the phases call for, and holding: five polls in a row, a second apart
        while time.monotonic() < deadline and verdicts[-5:] != [wanted] * 5:
            time.sleep(1.0)
            jobs = {j["job"]: j for j in d.get("/v1/jobs").json()["jobs"]}
            verdicts.append({name: jobs[name]["bottleneck"] for name in wanted if name in jobs})
        assert verdicts[-5:] == [wanted] * 5, verdicts
        gpus = d.get("/v1/gpus").json()["gpus"]
        pids = [[p["pid"] for p in g["reading"]["processes"] or []] for g in gpus]
        assert pids == [[slow.pid], [fast.pid], []]  # who uses each GPU: the loops' real pids; GPU 2 is idle
        assert gpus[2]["reading"]["utilization_ratio"] == 0
    finally:
        for p in (slow, fast):
            p.kill()
            p.wait()
    time.sleep(0.5)
    gone = d.get("/v1/gpus").json()["gpus"]  # the processes died: their GPUs idle again within a sweep or two
    deadline = time.monotonic() + 10
    while any(g["reading"]["processes"] for g in gone) and time.monotonic() < deadline:
        time.sleep(0.5)
        gone = d.get("/v1/gpus").json()["gpus"]
    assert not any(g["reading"]["processes"] for g in gone)
