"""``gpumon doctor --capture`` and ``--replay`` as users run them: the file they get, and a one-line error
with exit 2 for every bad path or file, never a traceback."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from support.helpers import ROOT, run_gpumon

from gpumon.cli import main
from gpumon.gpu.capture import load

DEEP = '{"format": "gpumon-nvml-capture", "version": 1, "calls": [{"op": "x", "args": [%s]}]}' % (
    "[" * 40 + "]" * 40
)
DEEP = '{"format": "gpumon-nvml-capture", "version": 1, "calls": [{"op": "x", "args": [%s]}]}' % (
    "[" * 40 + "]" * 40
)
H200 = ROOT / "tests" / "fixtures" / "captures" / "h200-idle.json"


@pytest.mark.slow
def test_doctor_capture_writes_a_masked_capture_that_replays(tmp_path: Path) -> None:
    out = tmp_path / "node.json"
    done = run_gpumon("doctor", "--simulate", "2xH100-SXM", "--capture", str(out), "--capture-sweeps", "2")
    assert done.returncode == 0, done.stderr
    assert "written to" in done.stderr and "serials and UUIDs masked" in done.stderr
    capture = load(str(out))
    assert capture.meta["source"] == "sim" and capture.meta["masked"] is True
    assert capture.meta["sweeps"] == 2 and capture.meta["gpumon"]
    text = out.read_text()
    real = json.loads(run_gpumon("snapshot", "--simulate", "2xH100-SXM", "--json").stdout)
    for gpu in real["gpus"]:  # the simulator's ids, which the capture must not hold
        assert gpu["uuid"] not in text and gpu["serial"] not in text
    ops = {c["op"] for c in capture.calls}
    assert {"nvmlInit", "nvmlDeviceGetFieldValues", "nvmlGpmMetricsGet", "nvmlDeviceRegisterEvents"} <= ops
    assert all("latency_us" in c for c in capture.calls if not c.get("missing"))
    replay = json.loads(run_gpumon("snapshot", "--replay", str(out), "--json").stdout)
    assert replay["replayed"] and [g["name"] for g in replay["gpus"]] == [g["name"] for g in real["gpus"]]


@pytest.mark.slow
def test_no_mask_keeps_the_ids(tmp_path: Path) -> None:
    out = tmp_path / "node.json"
    done = run_gpumon(
        "doctor", "--simulate", "1xL4", "--capture", str(out), "--capture-sweeps", "1", "--no-mask"
    )
    assert done.returncode == 0 and "NOT masked" in done.stderr
    real = json.loads(run_gpumon("snapshot", "--simulate", "1xL4", "--json").stdout)
    assert real["gpus"][0]["uuid"] in out.read_text()
    assert load(str(out)).meta["masked"] is False


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_a_capture_path_that_cannot_be_written_is_refused_before_sampling(capsys, tmp_path: Path) -> None:
    err = _error(capsys, "doctor", "--simulate", "1xL4", "--capture", str(tmp_path / "no" / "such.json"))
    assert "no such directory" in err
    err = _error(capsys, "doctor", "--simulate", "1xL4", "--capture", str(tmp_path))
    assert "is a directory" in err
    err = _error(
        capsys, "doctor", "--simulate", "1xL4", "--capture", str(tmp_path / "x.json"), "--capture-sweeps", "0"
    )
    assert "--capture-sweeps" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file"),
        ("{not json", "not JSON"),
        ('{"format": "something else"}', "not a gpumon NVML capture"),
        ('{"format": "gpumon-nvml-capture", "version": 99, "calls": []}', "version 99"),
        ('{"format": "gpumon-nvml-capture", "version": 1, "calls": {}}', '"calls" must be a list'),
        ('{"format": "gpumon-nvml-capture", "version": 1, "calls": [{"args": []}]}', "has no op"),
        (
            '{"format": "gpumon-nvml-capture", "version": 1, "calls": [{"op": "x", "args": 1}]}',
            "must be a list",
        ),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),  # nested past the parser's recursion limit
        (DEEP, "nests deeper"),
    ],
)
def test_a_bad_replay_file_is_one_line(capsys, tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "capture.json"
    if content is not None:
        path.write_text(content)
    err = _error(capsys, "snapshot", "--replay", str(path))
    assert message in err and "--replay" in err


def test_replay_refuses_devices_directories_and_other_sources(capsys, tmp_path: Path) -> None:
    assert "not a regular file" in _error(capsys, "snapshot", "--replay", "/dev/zero")
    assert "is a directory" in _error(capsys, "snapshot", "--replay", str(tmp_path))
    err = _error(capsys, "snapshot", "--replay", str(H200), "--simulate", "1xL4")
    assert "--replay is a GPU source of its own" in err
    assert "GPU source" in _error(capsys, "serve", "--replay", str(H200), "--backend", "nvml")


def test_capture_refuses_what_it_would_wrongly_replace_or_ignore(capsys, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in _error(capsys, "doctor", "--simulate", "1xL4", "--capture", str(fifo))
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # left as it was
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    assert "not a regular file" in _error(capsys, "doctor", "--simulate", "1xL4", "--capture", str(link))
    assert "give a file" in _error(capsys, "doctor", "--simulate", "1xL4", "--capture", "")
    assert "only applies with --capture" in _error(
        capsys, "doctor", "--simulate", "1xL4", "--capture-sweeps", "3"
    )
    assert "only applies with --capture" in _error(capsys, "doctor", "--simulate", "1xL4", "--no-mask")
    err = _error(capsys, "doctor", "--replay", str(H200), "--capture", str(tmp_path / "again.json"))
    assert "a replay is a capture already" in err
    assert "give the capture file" in _error(capsys, "snapshot", "--replay", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.json"]  # no temporary file left


def test_a_capture_longer_than_ten_minutes_is_refused(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GPUMON_INTERVAL", "60s")
    out = str(tmp_path / "long.json")
    err = _error(capsys, "doctor", "--simulate", "1xL4", "--capture", out, "--capture-sweeps", "11")
    assert "a capture is a few sweeps" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_capture_replaces_an_old_one_as_an_ordinary_file(tmp_path: Path) -> None:
    out = tmp_path / "node.json"
    out.write_text("old")
    done = run_gpumon("doctor", "--simulate", "1xL4", "--capture", str(out), "--capture-sweeps", "1")
    assert done.returncode == 0, done.stderr
    assert load(str(out)).meta["source"] == "sim"
    assert stat.S_IMODE(out.stat().st_mode) & 0o044  # readable as files are, not mkstemp's 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.json"]
