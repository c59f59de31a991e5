"""Heavy JSON documents as a shared read (gpumon/web/shared.py), and what that protects: the sampler
(issue 30 item 4)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import httpx
import pytest
from support.helpers import start_daemon
from support.reports import now_report

from gpumon.client import protocol as P
from gpumon.web.peer import Abandoned
from gpumon.web.shared import SharedDocuments


class State:
    def __init__(self) -> None:
        self.version = 0
        self.now = 10.0
        self.builds = 0
        self.inside = 0
        self.most_inside = 0

    def build(self) -> tuple[int, bytes]:
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        time.sleep(0.02)
        self.builds += 1
        self.inside -= 1
        return 200, str(self.version).encode()


def _docs(s: State) -> SharedDocuments:
    return SharedDocuments(lambda: (s.version,), max_age=1.0, clock=lambda: s.now)


def test_concurrent_readers_share_one_build_and_builds_never_overlap() -> None:
    s = State()
    docs = _docs(s)

    async def scenario() -> None:
        got = await asyncio.gather(*(docs.get("jobs", s.build) for _ in range(16)))
        assert set(got) == {(200, b"0")} and s.builds == 1
        await asyncio.gather(*(docs.get(("job", i), s.build) for i in range(8)))
        assert s.builds == 9 and s.most_inside == 1, "one build at a time, whatever the key"
        s.version = 1  # something it reads changed: the next reader gets a new build
        assert await docs.get("jobs", s.build) == (200, b"1") and s.builds == 10
        s.now += 1.5  # older than the sample interval
        await docs.get("jobs", s.build)
        assert s.builds == 11

    asyncio.run(scenario())


def test_a_reader_that_left_gets_nothing_built() -> None:
    s = State()
    docs = _docs(s)

    async def scenario() -> None:
        with pytest.raises(Abandoned):
            await docs.get("jobs", s.build, lambda: True)
        assert s.builds == 0

    asyncio.run(scenario())


def _gauge(text: str, name: str) -> list[float]:
    return [float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)]


@pytest.mark.slow
def test_job_documents_in_a_storm_do_not_make_healthy_gpus_look_down() -> None:
    """The break: sixteen loops of GET /v1/jobs?detail=true over 256 ranks (1.15 MB, ~100 ms each) starved
    the sampler of the interpreter lock: deadline errors, gpumon_gpu_up 5 of 8, a false critical page."""
    d = start_daemon(
        "--simulate", "8xH100-SXM", "--max-jobs", "32", "--max-ranks", "256", "--interval", "200ms"
    )  # fmt: skip
    try:
        for job in range(32):
            for rank in range(8):
                body = now_report(
                    100, job=f"job{job}", rank=rank, world_size=8, devices=[str(rank)], pid=1000 + rank
                )
                assert d.client.post(P.PATH, content=json.dumps(body).encode()).status_code == 204
        size = len(d.get("/v1/jobs", params={"detail": "true"}).content)
        assert size > 500_000, size
        stop = threading.Event()
        answered = [0]

        def storm() -> None:
            with httpx.Client(base_url=d.url, timeout=30) as c:
                while not stop.is_set():
                    c.get("/v1/jobs", params={"detail": "true"})
                    answered[0] += 1

        threads = [threading.Thread(target=storm) for _ in range(16)]
        for t in threads:
            t.start()
        up_seen: list[float] = []
        end = time.monotonic() + 15
        while time.monotonic() < end:
            text = d.get("/metrics").text
            up_seen.append(sum(_gauge(text, "gpumon_gpu_up")))
            time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join()
        text = d.get("/metrics").text
        late = re.findall(r'^gpumon_errors_total\{[^}]*error="deadline_exceeded"[^}]*\} (\S+)$', text, re.M)
        assert answered[0] > 16, answered
        assert min(up_seen) == 8, f"GPUs up during the storm: {up_seen}"
        assert not late, late
    finally:
        d.stop()
