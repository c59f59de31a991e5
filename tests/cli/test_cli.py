"""The gpumon command as a user runs it: a real subprocess, its exit code, stdout and stderr."""

from __future__ import annotations

import json
import socket

import pytest
from support.helpers import NO_DRIVER_HERE, run_gpumon

from gpumon import __version__


def one_line_error(result, code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("command", [[], ["serve"], ["snapshot"], ["doctor"]])
def test_help_everywhere(command) -> None:
    result = run_gpumon(*command, "--help")
    assert result.returncode == 0 and "usage: gpumon" in result.stdout


def test_version() -> None:
    assert run_gpumon("--version").stdout.strip() == f"gpumon {__version__}"


def test_no_command_is_a_one_line_error() -> None:
    assert "choose a command: serve, snapshot, doctor" in one_line_error(run_gpumon())


def test_unknown_flag_points_at_the_commands_help() -> None:
    line = one_line_error(run_gpumon("serve", "--bogus"))
    assert line == "gpumon serve: error: unrecognized arguments: --bogus (see gpumon serve --help)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--interval", "soon"], "interval: expected a duration"),
        (["snapshot", "--simulate", "8xH999"], "unknown GPU model"),
        (
            ["serve", "--config", "/nonexistent/gpumon.toml"],
            "cannot read config file /nonexistent/gpumon.toml",
        ),
        (["serve", "--backend", "cuda"], "invalid choice"),
        (["doctor", "--sim-fault", "lost:1"], "needs simulated GPUs"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message) -> None:
    assert message in one_line_error(run_gpumon(*args))


def test_bad_env_is_reported_like_a_bad_flag() -> None:
    line = one_line_error(run_gpumon("snapshot", env={"GPUMON_BACKEND": "cuda"}))
    assert "backend: expected one of auto, nvml, sim" in line


@NO_DRIVER_HERE
@pytest.mark.parametrize("command", ["serve", "snapshot"])
def test_without_a_driver_auto_explains_how_to_simulate(command) -> None:
    line = (
        one_line_error(run_gpumon(command, "--listen", "127.0.0.1:0"), code=1)
        if command == "serve"
        else (one_line_error(run_gpumon(command), code=1))
    )
    assert "no usable NVIDIA driver" in line
    assert f"gpumon {command} --simulate 8xH100-SXM" in line and "--simulate-if-no-gpu" in line


@NO_DRIVER_HERE
def test_simulate_if_no_gpu_falls_back_loudly() -> None:
    result = run_gpumon("snapshot", "--simulate-if-no-gpu", "2xL4")
    assert result.returncode == 0, result.stderr
    assert "serving SIMULATED GPUs (2xL4)" in result.stderr
    assert "SIMULATED" in result.stdout and result.stdout.count("NVIDIA L4") == 2


def test_busy_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = one_line_error(
            run_gpumon("serve", "--simulate", "1xL4", "--listen", f"127.0.0.1:{port}"), code=1
        )
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--listen" in line


def test_snapshot_table() -> None:
    result = run_gpumon("snapshot", "--simulate", "4xH100-SXM,1xA100", "--sim-unreported-jobs")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("backend sim (SIMULATED GPUs) · driver 570.133.20 · CUDA 12.8 · 5 GPU(s)")
    assert lines[2].split()[:2] == ["GPU", "NAME"]
    rows = [ln for ln in lines if ln[:1].isdigit()]
    assert len(rows) == 5 and "NVIDIA A100-SXM4-80GB" in rows[4]
    # one unit per column: rates from two reads of the counters (the A100 has no PCIe byte counters and
    # gives the driver's sampled rate instead), never a total since boot beside a rate
    assert "PCIE RX/TX MB/s" in lines[2] and "NVLINK RX/TX GB/s" in lines[2] and "GiB " not in rows[0][60:]
    at = lines[2].index("PCIE RX/TX MB/s")
    pcie = [row[at:].split()[0].split("/") for row in rows]
    assert all(100 < float(rx) < 100_000 for rx, _ in pcie), pcie  # MB/s, not GiB since boot
    assert any(ln.startswith("host:") for ln in lines)
    assert result.stderr == ""  # capability notes are info-level: quiet unless asked


def test_snapshot_json_is_the_v1_gpus_document() -> None:
    result = run_gpumon("snapshot", "--json", "--simulate", "2xH200", "--seed", "4")
    doc = json.loads(result.stdout)
    assert doc["simulated"] is True and len(doc["gpus"]) == 2
    gpu = doc["gpus"][0]
    assert gpu["name"] == "NVIDIA H200" and gpu["up"] is True
    assert gpu["reading"]["memory_total_bytes"] == 143771 * 2**20
    assert gpu["capabilities"]["fan"] == "not_supported"


@pytest.mark.slow
def test_snapshot_shows_a_gpu_that_stops_answering_as_down_with_its_reason() -> None:
    # a hang after identification: the GPU has its row, and the row says why it is down
    result = run_gpumon(
        "snapshot", "--simulate", "2xH100-SXM", "--sim-fault", "hang:1:nvmlDeviceGetUtilizationRates"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    row = next(ln for ln in lines if ln.startswith("1 ")).split()
    assert row[5:7] == ["DOWN", "nvmlDeviceGetUtilizationRates"], row
    # the reason is left out of the columns' widths: the memory column is as wide as its widest value
    header = next(ln for ln in lines if ln.startswith("GPU "))
    mem = next(ln for ln in lines if ln.startswith("0 ")).split()[6]
    width = max(len("MEM GiB"), len(mem))
    assert header.index("POWER W") == header.index("MEM GiB") + width + 2, header


def test_snapshot_of_a_gpu_lost_before_identification_counts_it_without_a_row() -> None:
    doc = json.loads(
        run_gpumon("snapshot", "--json", "--simulate", "2xH100-SXM", "--sim-fault", "lost:1").stdout
    )
    assert doc["device_count"] == 2 and [g["index"] for g in doc["gpus"]] == [0]


def test_doctor_reports_capabilities_and_advice() -> None:
    result = run_gpumon("doctor", "--simulate", "1xH100-SXM,1xA100,1xRTX-A6000")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "backend:        sim (SIMULATED GPUs)" in out
    assert "3 counted by NVML, 3 identified" in out
    fan = next(ln for ln in out.splitlines() if ln.startswith("fan "))
    assert fan.split()[1:] == ["-", "-", "yes"]
    pcie = next(ln for ln in out.splitlines() if ln.startswith("pcie_bytes "))
    assert pcie.split()[1:] == ["yes", "-", "-"]
    words = " ".join(out.split())  # advice is wrapped at 100 columns
    assert (
        "falls back to nvmlDeviceGetPcieThroughput" in words
        and "ECC counters are unavailable on GPU 2" in words
    )


def test_doctor_json() -> None:
    doc = json.loads(run_gpumon("doctor", "--json", "--simulate", "2xL4").stdout)
    assert doc["simulated"] is True and doc["identified"] == 2
    assert doc["gpus"][0]["capabilities"]["memory_temperature"] == "not_supported"
    assert any("simulated" in a for a in doc["advice"])


@pytest.mark.slow
def test_doctor_reports_events_gpm_dcgm_and_mig() -> None:
    result = run_gpumon("doctor", "--simulate", "1xH100-SXM,1xL4")
    assert result.returncode == 0, result.stderr
    lines = {
        ln.split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in result.stdout.splitlines() if ":" in ln
    }
    assert lines["events"] == "watching 2 of 2 GPU(s)"
    assert lines["profiling"] == "NVML GPM on GPU(s) 0"
    assert lines["mig"] == "GPU 0 disabled; GPU 1 not supported"
    gpm = next(ln for ln in result.stdout.splitlines() if ln.startswith("gpm "))
    assert gpm.split()[1:] == ["yes", "-"]
    off = json.loads(
        run_gpumon("doctor", "--json", "--simulate", "1xH100-SXM", "--no-events", "--profiling", "off").stdout
    )
    assert off["telemetry"]["events"] == "off (--no-events)"
    assert off["telemetry"]["profiling"] == "off (--profiling off)"
    assert "gpm" not in off["gpus"][0]["capabilities"]


def test_a_config_file_with_wrong_types_is_one_line_not_a_traceback(tmp_path) -> None:
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text("interval = [1]\n")
    assert "interval: expected a duration" in one_line_error(run_gpumon("serve", "--config", str(cfg)))


def test_no_processes_and_no_profiling_leave_those_readings_out() -> None:
    args = ("snapshot", "--json", "--simulate", "1xH100-SXM", "--sim-unreported-jobs")
    on = json.loads(run_gpumon(*args).stdout)["gpus"][0]["reading"]
    off = json.loads(run_gpumon(*args, "--no-processes", "--profiling", "off").stdout)["gpus"][0]["reading"]
    assert on["processes"] is not None and len(on["processes"]) == 1
    assert off["processes"] is None and off["profiling"] is None


@pytest.mark.slow  # 5 s each: the CLI's own deadline
@pytest.mark.parametrize("scheme", ["tcp", "unix"])
def test_cli_commands_give_up_on_a_daemon_that_trickles_its_answer(scheme: str, tmp_path) -> None:
    """Found by review: the CLI's 5 s timeout bounded each read, so a process on the daemon's port (or
    socket) answering a byte a second held `gpumon diagnose` for good. Now the whole request has 5 s."""
    import time

    from support.trickle import trickling

    reply = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 100
    with trickling("unix" if scheme == "unix" else "http", tmp_path, reply, every=0.5) as url:
        start = time.monotonic()
        out = run_gpumon("diagnose", "--job", "x", "--url", url, timeout=30)
        took = time.monotonic() - start
    assert out.returncode != 0 and "cannot reach the gpumon daemon" in out.stderr, out.stderr
    assert "timed out" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert took < 12, f"{took:.1f} s against the CLI's 5 s"


# ---- the rough edges a newcomer met (issue 20) ----------------------------------------------------------


@pytest.mark.parametrize(
    "command", [["snapshot", "--simulate", "8xH100-SXM"], ["estimate", "--model", "llama2-7b"], ["doctor"]]
)
def test_a_closed_pipe_ends_quietly(command: list[str]) -> None:
    """`gpumon snapshot | head -1`: the reader goes away; the command ends as SIGPIPE would end it."""
    import subprocess
    import sys

    from support.helpers import ROOT

    args = [*command, "--simulate", "1xH100-SXM"] if command == ["doctor"] else command
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumon", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before it writes a byte
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141 and err == ""


@pytest.mark.parametrize(
    ("command", "has", "lacks"),
    [
        ("serve", ["--simulate", "--collect", "--compat", "--owner-labels", "--listen"], []),
        ("snapshot", ["--simulate", "--sim-fault", "--processes"], ["--collect", "--compat", "--listen"]),
        ("doctor", ["--simulate", "--profiling"], ["--collect", "--owner-labels", "--web-config"]),
        ("estimate", ["--model"], ["--simulate", "--sim-fault", "--backend", "--collect"]),
        ("diagnose", ["--job"], ["--simulate", "--backend"]),
    ],
)
def test_each_commands_help_lists_only_its_own_options(
    command: str, has: list[str], lacks: list[str]
) -> None:
    out = run_gpumon(command, "--help").stdout
    assert all(flag in out for flag in has), out
    assert not [flag for flag in lacks if flag in out]


@pytest.mark.parametrize(
    ("command", "level"), [("serve", "info"), ("snapshot", "warning"), ("estimate", "warning")]
)
def test_the_log_level_help_gives_the_commands_own_default(command: str, level: str) -> None:
    assert f"default: {level}" in " ".join(run_gpumon(command, "--help").stdout.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--listen", "127.0.0.1:99999"], "port 99999 is out of range (0-65535)"),
        (["serve", "--interval", "-1s"], "interval: must be more than 0 and at most 1h, got '-1s'"),
        (
            ["estimate", "--model", "llama2-7b", "--simulate", "8xH100-SXM"],
            "unrecognized arguments: --simulate",
        ),
    ],
)
def test_messages_say_what_is_wrong(args: list[str], message: str) -> None:
    assert message in one_line_error(run_gpumon(*args))


@NO_DRIVER_HERE
def test_doctor_without_a_driver_diagnoses_why() -> None:
    """This machine has no driver: no library, no kernel module, no device nodes."""
    out = run_gpumon("doctor")
    assert out.returncode == 3 and out.stderr == "", out.stderr
    assert out.stdout.startswith("no usable NVIDIA driver: NVML could not start")
    for line in (
        "[NO] NVML library:",
        "[NO] kernel module:",
        "[NO] device nodes:",
        "gpumon doctor --simulate",
    ):
        assert line in out.stdout
    doc = json.loads(run_gpumon("doctor", "--json").stdout)
    assert doc["driver"] is None and [c["check"] for c in doc["checks"]][:3] == [
        "NVML library", "kernel module", "device nodes"
    ]  # fmt: skip


def test_the_driver_checks_name_each_cause(tmp_path) -> None:
    from gpumon.gpu import nodriver

    dev, proc, root = tmp_path / "dev", tmp_path / "proc", tmp_path / "root"
    for d in (dev, proc / "driver" / "nvidia", root):
        d.mkdir(parents=True)
    (proc / "driver" / "nvidia" / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20\n"
    )
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"):
        (dev / name).touch()
    (root / ".dockerenv").touch()

    def check(**kw: object) -> dict[str, nodriver.Finding]:
        found = nodriver.explain(dev=str(dev), proc=str(proc), root=str(root), load=lambda _: None, **kw)
        return {f.check: f for f in found}

    ok = check(env={"NVIDIA_VISIBLE_DEVICES": "all"}, access=lambda p, m: True)
    assert all(f.ok for f in ok.values()) and "570.133.20" in ok["kernel module"].seen
    assert ok["device nodes"].seen.endswith("and 2 GPU node(s), read-write")
    denied = check(env={"NVIDIA_VISIBLE_DEVICES": "void"}, access=lambda p, m: not p.endswith("nvidiactl"))
    assert not denied["device nodes"].ok and "nvidiactl" in denied["device nodes"].seen
    assert "group" in (denied["device nodes"].advice or "")
    assert not denied["container"].ok and "without GPUs" in (denied["container"].advice or "")

    def missing(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    (proc / "driver" / "nvidia" / "version").unlink()
    broken = nodriver.explain(dev=str(dev), proc=str(proc), root=str(root), env={}, load=missing)
    assert [f.check for f in broken if not f.ok] == ["NVML library", "kernel module", "container"]
    text = nodriver.render("NVML could not start", broken)
    assert "[NO] NVML library:" in text and "modprobe nvidia" in text and "--simulate 8xH100-SXM" in text
