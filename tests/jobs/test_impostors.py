"""A hostile local process against a rank reporting over the unix socket (issue 30 item 5): the kernel says
who sent each report (SO_PEERCRED), so the live process's incarnation and seq, which GET /v1/jobs shows
anyone, are not enough to speak for it or take it over while it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from support.helpers import ROOT
from support.reports import report

from gpumon.client import protocol as P

pytestmark = pytest.mark.slow

VICTIM = """
import sys, time
from gpumon.client import Reporter
r = Reporter(job="victim", rank=0, world_size=1, url=sys.argv[1], interval=0.1, enabled=True)
print("ready", flush=True)
while True:
    r.step(tokens=1000, samples=1)
    time.sleep(0.01)
"""


@pytest.fixture
def node(daemon) -> Iterator[tuple[object, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "ingest.sock")
        yield daemon("--simulate", "1xH100-SXM", "--ingest-socket", path, "--interval", "200ms"), path


@pytest.fixture
def victim(node) -> Iterator[subprocess.Popen[str]]:
    _, path = node
    proc = subprocess.Popen(
        [sys.executable, "-c", VICTIM, f"unix://{path}"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


def _unix(path: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://gpumon", timeout=10)


def _rank(d) -> dict:
    """The victim's rank as anyone can read it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        jobs = d.get("/v1/jobs", params={"detail": "true"}).json()["jobs"]
        if jobs and jobs[0]["detail"]["ranks"][0]["totals"]["tokens"] > 0:
            return jobs[0]["detail"]["ranks"][0]
        time.sleep(0.05)
    raise AssertionError("the victim never reported")


def _forged(rank: dict, **changes: object) -> bytes:
    """A report as an attacker would write it: the victim's incarnation, a seq past the victim's (it sends
    ten a second; the daemon takes a jump of up to 1,000), and 2^53 tokens."""
    now = time.time()
    body = report(
        10, job="victim", incarnation=rank["incarnation"], seq=900, t=now, started=now - 30, pid=os.getpid()
    )
    # every cumulative figure above the victim's, so that none reads as going back
    body["totals"].update(steps=10**6, tokens=2**53, samples=10**6)
    body["step_seconds"] = {"counts": [10**4] * (len(P.BUCKETS) + 1), "sum": 1e5}
    body["anchor"] = None
    body.update(changes)
    return json.dumps(body).encode()


def _tokens(d, job: str = "victim") -> float:
    return d.get(f"/v1/jobs/{job}").json()["ranks"][0]["totals"]["tokens"]


def test_another_process_cannot_speak_for_a_live_incarnation(node, victim) -> None:
    d, path = node
    rank = _rank(d)
    assert rank["pid"] == victim.pid
    with _unix(path) as c:
        mine = c.post(P.PATH, content=_forged(rank))
        assert mine.status_code == 403 and "incarnation" in mine.json()["detail"], mine.text
        theirs = c.post(P.PATH, content=_forged(rank, pid=victim.pid))  # and claiming to be the victim
        assert theirs.status_code == 403 and f"sender is pid {os.getpid()}" in theirs.json()["detail"]
    tcp = d.client.post(P.PATH, content=_forged(rank))  # loopback TCP: no kernel word, and still refused
    assert tcp.status_code == 403 and "a TCP connection" in tcp.json()["detail"], tcp.text
    before = _tokens(d)
    time.sleep(1.0)
    after = _tokens(d)
    assert before < after < 1e9, "the victim goes on counting, and no forged total landed"


def test_a_new_incarnation_cannot_take_over_a_rank_whose_process_runs(node, victim) -> None:
    d, path = node
    rank = _rank(d)
    now = time.time()
    fresh = report(10, job="victim", incarnation="takeover", t=now, started=now, pid=os.getpid())
    with _unix(path) as c:
        r = c.post(P.PATH, content=json.dumps(fresh).encode())
        assert r.status_code == 409 and f"pid {victim.pid}, which is still running" in r.text, r.text
        assert _rank(d)["incarnation"] == rank["incarnation"]
        victim.kill()
        victim.wait()
        # once it has exited, a restart is what it is: the rank continues, its counters carried
        fresh["time"] = fresh["started"] = time.time()
        fresh["seq"] = 1
        r = c.post(P.PATH, content=json.dumps(fresh).encode())
        assert r.status_code == 204, r.text
    doc = d.get("/v1/jobs/victim").json()["ranks"][0]
    assert doc["incarnation"] == "takeover" and doc["totals"]["tokens"] >= rank["totals"]["tokens"]


def test_impossible_growth_and_starts_before_boot_are_refused(node) -> None:
    d, path = node
    now = time.time()
    with _unix(path) as c:
        first = report(10, job="phys", t=now, started=now - 10, pid=os.getpid())
        assert c.post(P.PATH, content=json.dumps(first).encode()).status_code == 204
        jump = report(11, job="phys", t=now + 1, started=now - 10, pid=os.getpid())
        jump["totals"]["tokens"] = 2**53
        r = c.post(P.PATH, content=json.dumps(jump).encode())
        assert r.status_code == 422 and r.json()["detail"].startswith("totals.tokens: grew by"), r.text
        boot = psutil.boot_time()
        old = report(10, job="old", t=now, started=boot - 3600, pid=os.getpid())
        r = c.post(P.PATH, content=json.dumps(old).encode())
        assert r.status_code == 422 and "before this node booted" in r.text, r.text
    assert [j["job"] for j in d.get("/v1/jobs").json()["jobs"]] == ["phys"]
    assert _tokens(d, "phys") == 10_000
