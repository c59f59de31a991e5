"""The node page under attack, in a real headless chromium: every string a real daemon answers replaced with
markup, and every way a refresh can fail.

A small server stands in for the daemon: it serves the real page (gpumon.web.page, its CSP included) and
documents a real daemon answered, changed as each test needs, and notes every request the page makes.
Process names, owners, XID text and host figures cannot be chosen on a simulated node, and the error states
cannot be held there for long enough.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest
from support.browser import chromium, problems, refreshes, status, texts, wait_for
from support.helpers import start_daemon
from support.reports import now_report

from gpumon.cli.snapshot import render
from gpumon.client import protocol as P
from gpumon.gpu.snapshot import Snapshot
from gpumon.gpu.types import DriverInfo
from gpumon.host import HostReading
from gpumon.web import page

pytestmark = pytest.mark.slow

PAYLOAD = (
    '<img src=x onerror="window.__pwned=1;alert(1)">"\'><script>window.__pwned=2;alert(2)</script>'
    '<a href="javascript:alert(3)">&amp;</a>'
)
JSON = "application/json"
DROP = object()  # close the connection without an answer
GIB = 2**30


class FakeNode:
    """Serves the page and, for each path (decoded), a status and a JSON body (or raw bytes, or DROP).
    Each /v1/gpus answer gets the next sweep number, as a live daemon's does, unless ``frozen``.
    ``requests``: each request's path and query, as sent."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, Any]] = {}
        self.requests: list[str] = []
        self.frozen = False
        self.sweep = 0
        node = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                node.requests.append(self.path)
                path = unquote(urlsplit(self.path).path)
                if path == "/":
                    html = {"Content-Type": "text/html; charset=utf-8", **page.headers()}
                    self.reply(200, page.render("sim", jobs=True, node="fake").encode(), html)
                    return
                code, body = node.answers.get(path, (404, {"detail": "not here"}))
                if body is DROP:
                    self.close_connection = True
                    return
                if path == "/v1/gpus" and code == 200 and isinstance(body, dict) and not node.frozen:
                    node.sweep += 1
                    body = {**body, "sweep": node.sweep, "timestamp": time.time()}
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.reply(code, raw, {"Content-Type": JSON})

            def reply(self, status: int, raw: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def serve(self, gpus: dict[str, Any], jobs: dict[str, Any], details: dict[str, Any]) -> None:
        """/v1/jobs as the page asks for it (?detail=true): each job's detail document in its entry; and
        each at /v1/jobs/{job}, where the daemon also serves it."""
        self.answers["/v1/gpus"] = (200, gpus)
        self.answers.update({"/v1/jobs/" + name: (200, doc) for name, doc in details.items()})
        listed = [{**j, "detail": details[j["job"]]} if j["job"] in details else j for j in jobs["jobs"]]
        self.answers["/v1/jobs"] = (200, {**jobs, "jobs": listed})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    """What a daemon with 8 simulated H100s and two reporting jobs answers."""
    d = start_daemon("--simulate", "8xH100-SXM", "--interval", "200ms")
    try:
        uuids = [g["uuid"] for g in d.get("/v1/gpus").json()["gpus"]]
        for i, name in enumerate(("alpha", "beta")):
            body = now_report(50, job=name, devices=[uuids[i]], step_seconds=0.2)
            d.client.post(P.PATH, content=json.dumps(body).encode(), headers={"Content-Type": JSON})
        details = {n: d.get(f"/v1/jobs/{n}").raise_for_status().json() for n in ("alpha", "beta")}
        return {"gpus": d.get("/v1/gpus").json(), "jobs": d.get("/v1/jobs").json(), "details": details}
    finally:
        d.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def fake(browser: Any) -> Iterator[FakeNode]:
    browser.get("about:blank")
    browser.get_log("browser")
    node = FakeNode()
    yield node
    browser.get("about:blank")  # stop the page's polling before its server goes
    node.close()


def hostile(value: Any) -> Any:
    """Every string markup (kept unique: the page joins GPUs to jobs by uuid)."""
    if isinstance(value, str):
        return PAYLOAD + value
    if isinstance(value, dict):
        return {k: hostile(v) for k, v in value.items()}
    if isinstance(value, list):
        return [hostile(v) for v in value]
    return value


def everything_drawn(real: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The real documents with every part of the page in use: an XID, MIG, a lost GPU, owners, NVML errors,
    the event watcher down, findings, a job without a baseline key and one with a baseline."""
    gpus, details = copy.deepcopy(real["gpus"]), copy.deepcopy(real["details"])
    g = gpus["gpus"]
    g[0]["xids"] = [
        {"code": 79, "description": "fell off the bus", "severity": "critical", "cause": "hardware",
         "action": "drain the node", "count": 2, "last": time.time()}
    ]  # fmt: skip
    g[1]["reading"]["mig"] = [
        {"uuid": "MIG-1", "gpu_instance_id": 1, "compute_instance_id": 0, "profile": "3g.40gb",
         "memory_total_bytes": 4e10, "memory_used_bytes": 1e10, "profiling": None}
    ]  # fmt: skip
    g[2].update(up=False, reading=None, down_reason="GpuIsLost")
    for gpu, pid, owner in (
        (g[3], 4242, {"namespace": "ml-train", "pod": "trainer-0", "container": "main", "slurm_job_id": ""}),
        (g[4], 4343, {"namespace": "", "pod": "", "container": "", "slurm_job_id": "4242"}),
    ):
        process = {"pid": pid, "name": "python", "user": "alice", "container_id": "c0ffee", "pod_uid": ""}
        process.update(owner)
        gpu["owner"] = {"owner": owner, "processes": [process]}
        gpu["reading"]["processes"] = [
            {"pid": pid, "used_memory_bytes": 1e10, "gpu_instance_id": None, "compute_instance_id": None,
             "sm_utilization_ratio": None, "memory_utilization_ratio": None, "last_seen": None}
        ]  # fmt: skip
    gpus["events"] = {"running": False, "reason": "the watcher stopped", "recent": []}
    error = {"gpu": 4, "uuid": g[4]["uuid"], "op": "nvmlDeviceGetPowerUsage", "error": "Timeout", "count": 3}
    gpus["errors"] = [error]
    details["alpha"]["diagnosis"]["findings"] = ["memory_capacity"]
    details["alpha"]["baseline"].update(key=None, why_no_key="the ranks report different dtypes")
    details["beta"]["baseline"]["baseline"] = {"name": "beta-baseline", "note": "after the NCCL upgrade"}
    details["beta"]["baseline"]["ratios"] = {
        "tokens_per_second_per_gpu": 0.5, "step_time_seconds": 2.0, "mfu": 0.5, "tokens_per_joule": None
    }  # fmt: skip
    return gpus, real["jobs"], details


def test_markup_in_every_string_the_api_returns_is_shown_as_text(browser, fake, real) -> None:
    gpus, jobs, details = (hostile(doc) for doc in everything_drawn(real))
    fake.serve(gpus, jobs, {hostile(name): doc for name, doc in details.items()})
    browser.get(fake.url + "/?refresh=0.5")
    wait_for("both jobs' details", lambda: sum("signals" in t for t in texts(browser, "#job-rows > tr")) == 2)
    browser.execute_script("document.querySelectorAll('#job-rows .job-name').forEach((b) => b.click())")
    assert len(texts(browser, "#job-rows > tr.job-detail")) == 2  # their ranks and advice, opened at once
    seen = refreshes(browser)
    wait_for("a redraw", lambda: refreshes(browser) > seen)

    from selenium.common.exceptions import NoAlertPresentException  # the browser fixture made sure of it

    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    assert browser.execute_script("return window.__pwned") is None
    injected = "img, iframe, object, embed, svg, #gpus script, #jobs script, a[href^='javascript']"
    assert browser.execute_script(f"return document.querySelectorAll({json.dumps(injected)}).length") == 0
    assert browser.execute_script("return document.scripts.length") == len(page.SCRIPTS)
    text = browser.find_element("tag name", "body").text
    for shown in (  # the characters themselves, "&amp;" included
        PAYLOAD + "alpha",  # a job's name
        f"pod {PAYLOAD}ml-train/{PAYLOAD}trainer-0 ({PAYLOAD}main)",  # an owner
        f"pid 4242 {PAYLOAD}python ({PAYLOAD}alice)",  # a process and its user
        f"Slurm job {PAYLOAD}4242",
        f"down: {PAYLOAD}GpuIsLost",
        f"not comparable: {PAYLOAD}the ranks report different dtypes",
        f"vs {PAYLOAD}beta-baseline",
        f"MIG: {PAYLOAD}3g.40gb",
        f"Advice: {PAYLOAD}",  # the opened details: a job's advice, a rank's kind and GPU
        f"{PAYLOAD}train · pid ",
        f" · GPU 0 {PAYLOAD}NVIDIA H100 80GB HBM3",
    ):
        assert shown in text, shown
    assert "XID 79 \N{MULTIPLICATION SIGN}2" in text and "XID watcher off" in text
    assert "3 NVML error(s)" in text
    links = [a.get_attribute("href") for a in browser.find_elements("css selector", "#job-rows a")]
    # the opened details' JSON links: each name one path segment under /v1/jobs/ (encodeURIComponent leaves
    # !*'() as they are)
    assert links == [fake.url + "/v1/jobs/" + quote(PAYLOAD + n, safe="!*'()") for n in ("alpha", "beta")]
    assert problems(browser) == []


def test_a_failed_refresh_says_what_failed_and_keeps_the_last_data(browser, fake, real) -> None:
    fake.serve(real["gpus"], real["jobs"], real["details"])
    fake.answers["/v1/gpus"] = (503, {"detail": "not ready: waiting for the first sample"})
    browser.get(fake.url + "/?refresh=0.5")
    wait_for("the 503", lambda: "GPUs: 503: not ready: waiting for the first sample" in status(browser))
    assert "no data yet" in status(browser) and texts(browser, "#gpu-rows > tr") == []
    assert len(texts(browser, "#job-rows .job-name")) == 2  # the jobs answered

    fake.answers["/v1/gpus"] = (200, real["gpus"])
    wait_for("live", lambda: status(browser).startswith("live"))
    drawn = texts(browser, "#gpu-rows > tr")
    assert len(drawn) == 8

    for answer, said in (
        ((401, b"unauthorized: this gpumon requires basic auth\n"), "401 unauthorized: reload the page"),
        ((200, DROP), "GPUs: daemon unreachable"),
        ((200, {"gpus": 5}), "the answer is not a gpumon snapshot"),
        ((200, b"<html>a proxy's page</html>"), "the answer is not JSON"),
        ((429, b"too many requests\n"), "429: the web config's rate limit"),
    ):
        fake.answers["/v1/gpus"] = answer
        wait_for(said, lambda said=said: said in status(browser) and "showing data from" in status(browser))
        assert browser.find_element("id", "gpus").get_attribute("class") == "stale"
        assert len(texts(browser, "#gpu-rows > tr")) == 8  # the last data stays

    fake.answers["/v1/gpus"] = (200, real["gpus"])
    fake.answers["/v1/jobs"] = (500, {"detail": "boom"})
    wait_for("the jobs' error", lambda: "jobs: HTTP 500: boom" in status(browser))
    assert browser.find_element("id", "jobs").get_attribute("class") == "stale"
    assert len(texts(browser, "#job-rows .job-name")) == 2

    fake.serve(real["gpus"], real["jobs"], real["details"])
    jobs = fake.answers["/v1/jobs"][1]
    ended = [j for j in jobs["jobs"] if j["job"] != "beta"]
    fake.answers["/v1/jobs"] = (200, {**jobs, "jobs": ended})
    wait_for("beta gone", lambda: texts(browser, "#job-rows .job-name") == ["alpha"])
    assert status(browser).startswith("live")
    assert browser.find_element("id", "jobs").get_attribute("class") == ""

    fake.frozen = True  # the daemon answers, but its sampler has stopped
    wait_for("the stall", lambda: "no new sample for" in status(browser), timeout=10)
    assert problems(browser, allow_network=True) == []


def test_the_host_memory_is_what_is_available_as_gpumon_snapshot_says_it(browser, fake, real) -> None:
    """Found trying the page as a new user would (issue 32): the page showed host memory used, unlabelled,
    where `gpumon snapshot` shows it available. Both show available now, and say so."""
    gpus = copy.deepcopy(real["gpus"])
    gpus["host"].update(memory_total_bytes=64 * GIB, memory_available_bytes=48.4 * GIB)
    fake.serve(gpus, real["jobs"], real["details"])
    browser.get(fake.url + "/?refresh=0.5")
    facts = wait_for("the node's facts", lambda: browser.find_element("id", "node-facts").text)
    assert " · memory 48.4 / 64.0 GiB available · " in facts, facts

    host = HostReading(**gpus["host"])
    snap = Snapshot(1.0, 1, 1.0, "sim", DriverInfo("570", "12.8", "12"), 0, (), host, (), {})
    (line,) = (x for x in render(snap).splitlines() if x.startswith("host: "))
    assert " · memory 48.4/64.0 GiB available · " in line, line
    assert problems(browser) == []


def test_a_refresh_is_two_requests_however_many_jobs_and_opening_a_job_is_none(browser, fake, real) -> None:
    """What docs/deploy.md says of the rate limit: each job's detail comes in the one jobs request."""
    fake.serve(real["gpus"], real["jobs"], real["details"])
    browser.get(fake.url + "/?refresh=300")  # one refresh, at load
    wait_for("both jobs", lambda: len(texts(browser, "#job-rows .job-name")) == 2)
    browser.execute_script("document.querySelectorAll('#job-rows .job-name').forEach((b) => b.click())")
    wait_for("both jobs' details", lambda: len(texts(browser, "#job-rows > tr.job-detail")) == 2)
    time.sleep(1)  # room for a request that should not come
    assert refreshes(browser) == 1
    # the page asks for both at once: they may arrive in either order
    assert fake.requests[0] == "/?refresh=300"
    assert sorted(fake.requests[1:]) == ["/v1/gpus", "/v1/jobs?detail=true"]
    assert problems(browser) == []


def test_a_job_that_ends_with_its_details_open_comes_back_closed(browser, fake, real) -> None:
    """Found by the review of issue 32: the open jobs were never forgotten, so a new job reusing an ended
    one's name appeared with its details already open."""
    fake.serve(real["gpus"], real["jobs"], real["details"])
    browser.get(fake.url + "/?refresh=0.5")
    wait_for("both jobs", lambda: len(texts(browser, "#job-rows .job-name")) == 2)
    browser.execute_script("document.querySelectorAll('#job-rows .job-name').forEach((b) => b.click())")
    wait_for("both jobs' details", lambda: len(texts(browser, "#job-rows > tr.job-detail")) == 2)
    jobs = fake.answers["/v1/jobs"][1]
    fake.answers["/v1/jobs"] = (200, {**jobs, "jobs": [j for j in jobs["jobs"] if j["job"] != "beta"]})
    wait_for("beta gone", lambda: texts(browser, "#job-rows .job-name") == ["alpha"])
    fake.answers["/v1/jobs"] = (200, jobs)
    wait_for("beta back", lambda: len(texts(browser, "#job-rows .job-name")) == 2)
    rows = "return Array.from(document.querySelectorAll('#job-rows > tr'), (r) => r.className)"
    assert browser.execute_script(rows) == ["", "job-detail", ""]  # alpha still open, beta closed
    assert problems(browser) == []
