from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from support.helpers import Daemon, ManualClock, start_daemon

from gpumon.gpu.nvml import NvmlBackend
from gpumon.gpu.sampler import Sampler
from gpumon.gpu.sim import SimNvml
from gpumon.metrics.registry import DETAILS


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

    def make(nvml: SimNvml, details: frozenset[str] = frozenset(DETAILS), **kw: object) -> Sampler:
        """A sampler that reads everything any opt-in detail needs (``details`` narrows it)."""
        sampler = Sampler(NvmlBackend(nvml, details=details), **kw)  # type: ignore[arg-type]
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
        d = start_daemon(*args, ready=ready)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.stop()
