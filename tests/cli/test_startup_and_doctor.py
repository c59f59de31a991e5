"""What a new user meets first (issue 32): the daemon's start-up log, doctor on a node without a driver, and
the exit statuses docs/configuration.md promises, each tried on the real command in a subprocess."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import httpx
import pytest
from support.helpers import NO_DRIVER_HERE, ROOT, Daemon, free_port, gpumon_cmd, run_gpumon
from support.poll import poll

from gpumon.gpu import nodriver
from gpumon.gpu.sampler import gpu_ranges

CAPTURE = ROOT / "tests" / "fixtures" / "captures" / "h200-load.json"
# any INFO line about what a GPU cannot do (the per-GPU notices an 8-GPU node used to log 16 of)
CAPABILITY = re.compile(
    r" INFO gpumon[\w.]*: .*(not supported|no video encoders|not exported|series are absent|NOT_SUPPORTED)"
)


def _settled_log(d: Daemon, seen: Callable[[list[str]], bool], sweeps: float = 1.0) -> list[str]:
    """The daemon's log once ``seen`` holds (the first sweeps are in), and a few more sweeps after it, so that
    a notice repeated per GPU, or by a later sweep, has had its chance to appear."""
    poll(lambda: seen(list(d.log)), 15, "the start-up notices", every=0.05, detail=lambda: "\n".join(d.log))
    time.sleep(sweeps)  # time passing on purpose: a repeat would show in it
    assert d.stop() == 0
    return list(d.log)


def _capability_lines(log: list[str]) -> list[str]:
    return [line for line in log if CAPABILITY.search(line)]


# ---- start-up log -----------------------------------------------------------------------------------------


def test_serve_sums_up_what_eight_gpus_lack_in_one_info_line(daemon: Callable[..., Daemon]) -> None:
    """8 H100s lack the same few (fans, ...): one line naming GPUs 0-7, not one per GPU and quantity."""
    d = daemon("--simulate", "8xH100-SXM", "--interval", "250ms")
    log = _settled_log(d, lambda log: bool(_capability_lines(log)))
    lines = _capability_lines(log)
    assert len(lines) == 1, "\n".join(lines)
    (line,) = lines
    assert "GPUs 0-7: " in line and "fan" in line and "not supported" in line, line


def test_serve_groups_gpus_by_what_they_lack(daemon: Callable[..., Daemon]) -> None:
    """Two models, two lacks: a line per group, each naming its GPUs as a range."""
    d = daemon("--simulate", "2xH100-SXM,2xL4", "--interval", "250ms")
    log = _settled_log(d, lambda log: len(_capability_lines(log)) >= 2)
    lines = _capability_lines(log)
    assert len(lines) == 2, "\n".join(lines)
    h100, l4 = sorted(lines, key=lambda line: line.index("GPUs"))
    assert "GPUs 0-1: " in h100 and "fan" in h100 and "gpm" not in h100, h100
    assert "GPUs 2-3: " in l4 and "fan" in l4 and "gpm" in l4, l4


def test_a_replayed_daemon_warns_once_and_sums_up_capabilities_once(daemon: Callable[..., Daemon]) -> None:
    d = daemon("--replay", str(CAPTURE), "--interval", "250ms")
    log = _settled_log(d, lambda log: bool(_capability_lines(log)))
    warnings = [line for line in log if " WARNING " in line and "REPLAY" in line]
    assert len(warnings) == 1, "\n".join(warnings)
    assert str(CAPTURE) in warnings[0] and 'backend="replay"' in warnings[0]
    lines = _capability_lines(log)
    assert len(lines) == 1, "\n".join(lines)
    assert "GPU 0: " in lines[0] and "fan" in lines[0] and "where its capture has no answer" in lines[0]


def test_the_per_gpu_detail_is_still_there_at_debug(daemon: Callable[..., Daemon]) -> None:
    d = daemon("--simulate", "2xH100-SXM", "--interval", "250ms", "--log-level", "debug")
    log = _settled_log(d, lambda log: bool(_capability_lines(log)), sweeps=0.5)
    detail = [line for line in log if " DEBUG gpumon.nvml: GPU " in line and "is not supported via" in line]
    assert {line.split(" DEBUG gpumon.nvml: ")[1][:5] for line in detail} == {"GPU 0", "GPU 1"}, detail


def test_the_sampler_announces_each_absence_once_grouped_by_gpus_that_share_it(
    sims, samplers, caplog
) -> None:
    """In process: the summary at the first sweep, then for what a later sweep learns, and never again."""
    sim = sims("3xRTX-A6000", static=True)
    sampler = samplers(sim)

    def lines() -> list[str]:
        with caplog.at_level(logging.INFO, logger="gpumon"):
            caplog.clear()
            sampler.sweep()
        return sorted(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)

    (first,) = lines()
    assert first.startswith("GPUs 0-2: ") and "ecc" in first and "fan" not in first, first
    assert first.endswith(
        "not supported; their series are absent (gpumon doctor shows each GPU's capabilities)"
    )
    assert lines() == []
    sim.faults.add("unsupported:1:nvmlDeviceGetFanSpeed")
    sim.faults.add("error:2:nvmlDeviceGetTemperature=NoPermission")
    assert lines() == [
        "GPU 1: fan not supported; their series are absent (gpumon doctor shows each GPU's capabilities)",
        "GPU 2: temperature denied (no permission); their series are absent (run gpumon doctor for advice)",
    ]
    assert lines() == [] and lines() == []


def test_gpu_ranges() -> None:
    assert gpu_ranges([3]) == "GPU 3"
    assert gpu_ranges([7, 6, 5, 4, 3, 2, 1, 0]) == "GPUs 0-7"
    assert gpu_ranges([0, 1, 2, 5, 8, 7]) == "GPUs 0-2, 5, 7-8"


# ---- doctor without a driver: NVIDIA_VISIBLE_DEVICES -------------------------------------------------------


@NO_DRIVER_HERE
def test_doctor_says_nvidia_visible_devices_is_not_set_rather_than_unset() -> None:
    """A pod (KUBERNETES_SERVICE_HOST) without the variable: "not set", never a value "unset" it lacks."""
    env = {k: v for k, v in os.environ.items() if k != "NVIDIA_VISIBLE_DEVICES"}
    env["KUBERNETES_SERVICE_HOST"] = "10.96.0.1"

    def doctor(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            gpumon_cmd("doctor", *args), capture_output=True, text=True, timeout=60, env=env, cwd=ROOT
        )

    text = doctor()
    assert text.returncode == 3, text.stderr
    (line,) = [ln for ln in text.stdout.splitlines() if "container:" in ln]
    assert "NVIDIA_VISIBLE_DEVICES is not set" in line and "=unset" not in text.stdout, line
    checks = {c["check"]: c for c in json.loads(doctor("--json").stdout)["checks"]}
    assert checks["container"]["seen"] == "running in a Kubernetes pod; NVIDIA_VISIBLE_DEVICES is not set"


@pytest.mark.parametrize(
    ("env", "ok", "seen"),
    [
        ({}, False, "; NVIDIA_VISIBLE_DEVICES is not set"),
        ({"NVIDIA_VISIBLE_DEVICES": ""}, False, " with NVIDIA_VISIBLE_DEVICES=''"),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, False, " with NVIDIA_VISIBLE_DEVICES=void"),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, False, " with NVIDIA_VISIBLE_DEVICES=none"),
        # a value the runtime does not know is shown as it is, never confused with an absent variable
        ({"NVIDIA_VISIBLE_DEVICES": "unset"}, True, " with NVIDIA_VISIBLE_DEVICES=unset"),
        ({"NVIDIA_VISIBLE_DEVICES": "0,1"}, True, " with NVIDIA_VISIBLE_DEVICES=0,1"),
        # a newline would forge a report line and an escape drive the terminal: escaped, on one line
        ({"NVIDIA_VISIBLE_DEVICES": "0\n [OK] x"}, True, " with NVIDIA_VISIBLE_DEVICES=$'0\\n [OK] x'"),
        ({"NVIDIA_VISIBLE_DEVICES": "\x1b[2J"}, True, " with NVIDIA_VISIBLE_DEVICES=$'\\x1b[2J'"),
        ({"NVIDIA_VISIBLE_DEVICES": "7" * 300}, True, " with NVIDIA_VISIBLE_DEVICES=" + "7" * 200 + "..."),
    ],
)
def test_the_container_check_shows_the_variable_as_the_runtime_sees_it(
    tmp_path, env: dict[str, str], ok: bool, seen: str
) -> None:
    (tmp_path / ".dockerenv").touch()
    found = nodriver._container(str(tmp_path), env)
    assert found is not None and found.ok is ok
    assert found.seen == f"running in a container{seen}"


# ---- exit statuses ----------------------------------------------------------------------------------------

# what docs/configuration.md's "Exit status" table promises, and what the cases below check
DOCUMENTED = {0, 1, 2, 3, 70, 130, 141}


def _documented_codes() -> set[int]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("\n## Exit status\n", 1)[1].split("\n## ", 1)[0]
    return {int(m) for m in re.findall(r"^\| `(\d+)` \|", section, flags=re.M)}


def test_configuration_md_documents_exactly_the_exit_statuses_checked_here() -> None:
    assert _documented_codes() == DOCUMENTED


@pytest.mark.parametrize(
    ("args", "env", "code"),
    [
        (["--version"], {}, 0),
        (["doctor", "--simulate", "1xL4", "--no-events"], {}, 0),
        ([], {}, 2),  # no command
        (["doctor", "--bogus"], {}, 2),
        (["snapshot", "--backend", "gpu"], {}, 2),
        (["snapshot"], {"GPUMON_INTERVAL": "abc"}, 2),
        (["serve", "--config", "/nonexistent/gpumon.toml"], {}, 2),
        (["doctor", "--replay", "/nonexistent/capture.json"], {}, 2),
        (["diagnose", "--url", "http://127.0.0.1:{port}"], {}, 1),  # no daemon there
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_exit_status(args: list[str], env: dict[str, str], code: int) -> None:
    args = [a.format(port=free_port()) for a in args]
    done = run_gpumon(*args, env=env)
    assert done.returncode == code, done.stderr
    assert code in DOCUMENTED and "Traceback" not in done.stderr
    if code:
        assert done.stderr.count("\n") == 1, done.stderr  # one line saying what is wrong


@NO_DRIVER_HERE
def test_without_a_driver_doctor_exits_3_with_its_diagnosis_and_the_others_1() -> None:
    doctor = run_gpumon("doctor", "--json")
    assert doctor.returncode == 3 and doctor.stderr == "", doctor.stderr
    assert json.loads(doctor.stdout)["driver"] is None  # stdout is the diagnosis, usable by a script
    for command in (["snapshot"], ["serve", "--listen", "127.0.0.1:0"]):
        done = run_gpumon(*command)
        assert done.returncode == 1 and "no usable NVIDIA driver" in done.stderr, done.stderr


def test_interrupted_exits_130_and_a_closed_stdout_141(tmp_path) -> None:
    # thirty sweeps a second apart: long enough to be interrupted
    capture = ["--capture", str(tmp_path / "capture.json"), "--capture-sweeps", "30"]
    proc = subprocess.Popen(
        gpumon_cmd("doctor", "--simulate", "1xL4", "--no-events", *capture),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        # a shell's background job inherits SIGINT ignored; a user's Ctrl-C finds it handled
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())  # nothing half written
    closed = subprocess.Popen(
        gpumon_cmd("estimate", "--model", "llama2-7b"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert closed.stdout is not None
    closed.stdout.close()
    assert closed.wait(60) == 141


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def test_ctrl_c_on_a_serving_daemon_is_a_clean_stop_exit_0() -> None:
    proc = subprocess.Popen(
        gpumon_cmd("serve", "--simulate", "1xL4", "--listen", "127.0.0.1:0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    log = []
    for line in proc.stdout:
        log.append(line)
        if "listening on" in line:
            break
    url = re.search(r"http://[\d.:]+", log[-1])
    assert url is not None, log
    poll(lambda: _answers(url.group(0) + "/healthz"), 30, "the daemon to serve")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    log.append(out)
    assert proc.returncode == 0, "".join(log)
    assert "gpumon stopped" in out and "Traceback" not in out, out


def test_stdout_that_cannot_be_written_is_a_runtime_failure_not_a_bug() -> None:
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            gpumon_cmd("estimate", "--model", "llama2-7b"),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "No space left on device" in done.stderr, done.stderr


def test_an_internal_error_exits_70_with_one_line() -> None:
    """A bug, not the user's doing: gpumon's own main with a command that raises."""
    code = textwrap.dedent(
        """
        import sys
        import gpumon.cli.estimate as estimate
        from gpumon.cli import main

        def broken(settings, args):
            raise RuntimeError("a bug")

        estimate.run = broken
        sys.exit(main(["estimate", "--model", "llama2-7b"]))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 70 and done.stderr.startswith(
        "gpumon estimate: internal error: RuntimeError"
    ), done.stderr
