"""Fixtures of the SDK tests: a recording stand-in daemon, and Reporters closed at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_transport import RecordingServer

from gpumon.client import Reporter

Server = Callable[..., RecordingServer]


@pytest.fixture
def server() -> Iterator[Server]:
    started: list[RecordingServer] = []

    def start(port: int = 0, unix_path: str | None = None) -> RecordingServer:
        started.append(RecordingServer(port, unix_path))
        return started[-1]

    yield start
    for srv in started:
        srv.sleep = 0.0
        srv.stop()


@pytest.fixture
def reporters() -> Iterator[Callable[..., Reporter]]:
    """Reporters closed (briefly) at teardown; explicit ranks, so the test runner's environment is ignored."""
    made: list[Reporter] = []

    def make(**kwargs: Any) -> Reporter:
        kwargs.setdefault("job", "test-job")
        kwargs.setdefault("rank", 0)
        kwargs.setdefault("world_size", 1)
        kwargs.setdefault("interval", 0.05)
        made.append(Reporter(**kwargs))
        return made[-1]

    yield make
    for r in made:
        r.close(timeout=0.5)
