"""Helpers shared by tests (fixtures are in conftest.py)."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import httpx
import pynvml
import pytest

from gpumon.gpu.sim import SimNvml
from gpumon.gpu.sim.catalog import MiB
from support.poll import IN_CI

ROOT = Path(__file__).resolve().parents[2]


class ManualClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def nvml_present() -> bool:
    """Whether an NVIDIA driver answers here: the tests of a node without one skip on a GPU machine."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()  # pragma: no cover (a GPU machine)
    return True  # pragma: no cover


# the tests of what a node without a driver does cannot run where there is one
NO_DRIVER_HERE = pytest.mark.skipif(nvml_present(), reason="an NVIDIA driver is present here")


def require_tool(name: str, install: str = "apt-get install prometheus prometheus-alertmanager") -> str:
    """Path of an external tool the test needs. In CI its absence fails the test rather than skipping it."""
    path = shutil.which(name)
    if path:
        return path
    if IN_CI:
        pytest.fail(f"{name} is required in CI (.ci/run installs it) but was not found on PATH")
    pytest.skip(f"{name} not installed ({install})")


def require_module(module: str) -> ModuleType:
    """Import ``module`` (a framework the test runs for real) or skip; in CI its absence fails the test."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"{module} is required in CI (.ci/run installs it): {exc}")
        pytest.skip(f"{module} not installed: {exc}")


class Daemon:
    def __init__(self, proc: subprocess.Popen[str], url: str, log: list[str]) -> None:
        self.proc = proc
        self.url = url
        self.log = log
        self.client = httpx.Client(base_url=url, timeout=10.0)

    def get(self, path: str, **kw: object) -> httpx.Response:
        return self.client.get(path, **kw)  # type: ignore[arg-type]

    def wait_ready(self, timeout: float = 15.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if self.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError("daemon not ready:\n" + "\n".join(self.log))

    def stop(self) -> int:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        return self.proc.returncode


def start_daemon(
    *args: str, ready: bool = True, log_file: Path | None = None, tree: Path = ROOT, nofile: int | None = None
) -> Daemon:
    """``gpumon serve`` as a real subprocess on an ephemeral loopback port (its output also in log_file);
    ``tree``: the checkout whose gpumon runs (python -m imports from its working directory first);
    ``nofile``: its file descriptor limit, soft and hard (as a systemd unit's LimitNOFILE= sets it)."""

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen(
        gpumon_cmd("serve", "--listen", "127.0.0.1:0", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tree,
        preexec_fn=limit if nofile is not None else None,
    )
    log: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        with log_file.open("w") if log_file else contextlib.nullcontext() as fh:
            for line in proc.stdout:
                log.append(line.rstrip())
                if fh is not None:
                    fh.write(line)
                    fh.flush()
                m = re.search(r"listening on (https?://[\d.]+:\d+)/metrics", line)
                if m and not url:
                    url.append(m.group(1))
                    found.set()
        found.set()

    threading.Thread(target=pump, daemon=True).start()
    if not found.wait(30) or not url:
        proc.kill()
        raise AssertionError("daemon did not start:\n" + "\n".join(log))
    d = Daemon(proc, url[0], log)
    if ready:
        d.wait_ready()
    return d


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gpumon_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpumon", *args]


def run_gpumon(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        gpumon_cmd(*args), capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT
    )


def set_state(sim: SimNvml, index: int = 0) -> None:
    """Distinctive values in every quantity of one static simulated GPU."""
    s = sim.gpus[index].state
    s.util, s.mem_util = 0.97, 0.41
    s.memory_used = 60_000 * MiB
    s.power_w, s.power_limit_w, s.energy_j = 650.5, 700.0, 123_456.789
    s.temp_c, s.mem_temp_c = 71.0, 78.0
    s.sm_clock_mhz, s.mem_clock_mhz = 1755.0, 2619.0
    s.reasons = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonSwThermalSlowdown
    s.throttle_ns = {74: 2_500_000_000, 76: 0, 269: 1_000_000_000, 270: 0, 271: 0}
    s.pcie_tx_bytes, s.pcie_rx_bytes = 1_000_000.0, 9_000_000.0
    s.pcie_tx_rate, s.pcie_rx_rate = 2_000_000.0, 7_000_000.0
    s.pcie_gen, s.pcie_width, s.replays = sim.gpus[index].model.pcie_generation, 16, 3
    s.nvlink_tx = [1024.0 * (link + 1) for link in range(len(s.nvlink_tx))]
    s.nvlink_rx = [2048.0 * (link + 1) for link in range(len(s.nvlink_rx))]
    if len(s.link_up) == 18:
        s.link_up[17] = False
    s.ecc_volatile, s.ecc_aggregate = [4, 1], [40, 2]
    s.remap = [5, 1, 1, 0]
    s.pstate = 0
