from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Callable, Iterator

import pytest
from helpers import ROOT, Daemon, ManualClock, gpumon_cmd

from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def sims() -> Iterator[Callable[..., SimNvml]]:
    """Make simulated NVMLs; every hung call is released at teardown so no thread outlives its test."""
    made: list[SimNvml] = []

    def make(spec: str = "2xH100-SXM", **kw: object) -> SimNvml:
        sim = SimNvml(spec, **kw)  # type: ignore[arg-type]
        made.append(sim)
        return sim

    yield make
    for sim in made:
        sim.faults.clear()


@pytest.fixture
def samplers() -> Iterator[Callable[..., Sampler]]:
    made: list[Sampler] = []

    def make(nvml: SimNvml, **kw: object) -> Sampler:
        sampler = Sampler(NvmlBackend(nvml), **kw)  # type: ignore[arg-type]
        sampler.open()
        made.append(sampler)
        return sampler

    yield make
    for s in made:
        s.stop()


@pytest.fixture
def daemon() -> Iterator[Callable[..., Daemon]]:
    """Start ``gpumon serve`` as a real subprocess on an ephemeral loopback port."""
    started: list[Daemon] = []

    def start(*args: str, ready: bool = True) -> Daemon:
        proc = subprocess.Popen(
            gpumon_cmd("serve", "--listen", "127.0.0.1:0", *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        log: list[str] = []
        found = threading.Event()
        url: list[str] = []

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.append(line.rstrip())
                m = re.search(r"listening on (http://[\d.]+:\d+)/metrics", line)
                if m and not url:
                    url.append(m.group(1))
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(20) or not url:
            proc.kill()
            raise AssertionError("daemon did not start:\n" + "\n".join(log))
        d = Daemon(proc, url[0], log)
        started.append(d)
        if ready:
            d.wait_ready()
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.stop()
