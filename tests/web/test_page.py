"""The node page at /: served self-contained under a strict CSP and behind the web config's basic auth, and,
in a real headless chromium against a real daemon, drawing the GPUs and jobs, refreshing itself, escaping a
hostile job name and loading with the browser's credentials."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote

import bcrypt
import pytest
from support.browser import chromium, problems, refreshes, status, texts, wait_for
from support.helpers import ROOT, Daemon, start_daemon
from support.reports import now_report

from gpumon.client import protocol as P
from gpumon.web import page

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# the job-name alphabet allows no markup, so the most hostile name is one that is also a path: slashes, dot
# segments, a scheme, an authority; its JSON link and its detail request must keep it one path segment
HOSTILE_JOB = "javascript:alert/../../..//metrics@evil.example:80+=_-"
assert re.fullmatch(P.NAME_PATTERN, HOSTILE_JOB)
X = "\N{MULTIPLICATION SIGN}"
HOSTILE_NODE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
PASSWORD = "pass word:with colon"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()  # cost 4: tests need no slow hashes
BASELINE = """version = 1
[[baseline]]
name = "demo-on-2xh100"
workload = "demo"
gpu_model = "NVIDIA H100 80GB HBM3"
gpus = 2
dtype = "bf16"
flops_convention = "palm"
tokens_per_second_per_gpu = 1000000.0
step_time_seconds = 0.1
mfu = 0.9
"""


class Document(HTMLParser):
    """The served page's elements with their attributes, and the text of its inline script and style."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.inline: dict[str, list[str]] = {"script": [], "style": []}
        self._open: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._open = tag if tag in self.inline else None
        if self._open:
            self.inline[tag].append("")

    def handle_endtag(self, tag: str) -> None:
        self._open = None

    def handle_data(self, data: str) -> None:
        if self._open:
            self.inline[self._open][-1] += data


def post(d: Daemon, body: dict[str, Any]) -> None:
    r = d.client.post(P.PATH, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 204, r.text


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# --- served: fast, no browser ---


@pytest.fixture(scope="module")
def plain() -> Iterator[Daemon]:
    d = start_daemon("--simulate", "2xH100-SXM", "--interval", "200ms")
    yield d
    d.stop()


def test_the_page_loads_nothing_from_anywhere_else(plain: Daemon) -> None:
    r = plain.get("/")
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    doc = Document(r.text)
    urls = [v or "" for _, attrs in doc.tags for k, v in attrs.items() if k in ("src", "href", "action")]
    assert urls and all((u.startswith("/") and not u.startswith("//")) or u == "data:," for u in urls), urls
    attributes = {a for _, attrs in doc.tags for a in attrs}
    assert "src" not in attributes  # no script, image or frame by address
    assert not [a for a in attributes if a.startswith("on") or a == "style"]  # nothing inline the CSP refuses
    assert not re.search(r"https?:|//|url\(|@import", "".join(doc.inline["style"]))
    tags = [t for t, _ in doc.tags]
    assert tags.count("script") == len(page.SCRIPTS) and tags.count("style") == 1


def test_the_csp_allows_exactly_the_inline_scripts_and_style(plain: Daemon) -> None:
    r = plain.get("/")
    doc = Document(r.text)
    policy = dict(d.strip().split(" ", 1) for d in r.headers["content-security-policy"].split(";"))
    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == " ".join(sha256(script) for script in doc.inline["script"])
    assert policy["style-src"] == sha256(doc.inline["style"][0])
    assert policy["connect-src"] == "'self'" and policy["img-src"] == "'self' data:"
    assert policy["base-uri"] == policy["frame-ancestors"] == policy["form-action"] == "'none'"
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["cache-control"] == "no-store"
    assert "Simulated GPUs" in r.text and 'data-jobs="on"' in r.text
    assert 'href="/metrics"' in r.text and 'href="/v1/jobs"' in r.text and 'href="/readyz"' in r.text


@pytest.mark.parametrize("name", page.SCRIPTS)
def test_the_scripts_write_no_markup_and_stay_ascii(name: str) -> None:
    script = page.asset(name)
    # every value reaches the page as text: no API that parses a string as HTML or runs it as code
    for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(",
                   "setAttribute", "createContextualFragment", "DOMParser", "srcdoc"):  # fmt: skip
        assert banned not in script, banned
    assert script.isascii()  # the hashes cannot depend on how the page is decoded
    assert "</script" not in script.lower() and "http://" not in script and "https://" not in script
    style = page.asset(page.STYLE)
    assert style.isascii() and "</style" not in style.lower()


def test_the_assets_ship_in_the_wheel() -> None:
    """A non-editable install reads them as package data: pyproject must list them."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assets = ROOT / "gpumon" / "web" / "assets"
    shipped = {p for g in globs["gpumon.web"] for p in (ROOT / "gpumon" / "web").glob(g)}
    assert set(assets.iterdir()) <= shipped
    assert {p.name for p in assets.iterdir()} == {page.STYLE, *page.SCRIPTS}


def test_without_training_the_page_says_so_and_the_node_name_is_text(daemon) -> None:
    d = daemon("--simulate", "1xH100-SXM", "--no-ingest", "--node-name", HOSTILE_NODE)
    text = d.get("/").text
    assert 'data-jobs="off"' in text and "Training telemetry is off" in text
    assert 'href="/v1/jobs"' not in text and d.get("/v1/jobs").status_code == 404
    assert "<script>alert" not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in text


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    config = tmp_path_factory.mktemp("web") / "web.yml"
    config.write_text(json.dumps({"basic_auth_users": {"alice": HASH}}))  # JSON is YAML
    d = start_daemon("--simulate", "2xH100-SXM", "--interval", "200ms", "--web-config", str(config))
    yield d
    d.stop()


def test_the_page_needs_the_web_configs_password(guarded: Daemon) -> None:
    bare = guarded.get("/")
    assert bare.status_code == 401 and bare.headers["www-authenticate"] == 'Basic realm="gpumon"'
    assert "<html" not in bare.text
    assert guarded.get("/v1/gpus").status_code == 401
    auth = ("alice", PASSWORD)
    r = guarded.get("/", auth=auth)
    assert r.status_code == 200 and "content-security-policy" in r.headers
    assert guarded.get("/v1/gpus", auth=auth).status_code == 200
    assert guarded.get("/", auth=("alice", "wrong")).status_code == 401


# --- in chromium ---


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def chrome(browser: Any) -> Any:
    browser.get("about:blank")
    browser.get_log("browser")  # what an earlier test left behind
    return browser


def open_page(driver: Any, url: str, rows: str = "#gpu-rows > tr") -> None:
    driver.get(url)
    wait_for(f"{rows} at {url}", lambda: texts(driver, rows))


def click(driver: Any, css: str) -> None:
    """Click the first element matching ``css`` as a user would, looking again when a redraw replaced it."""
    wait_for(f"a click on {css}", lambda: driver.find_element("css selector", css).click() or True)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """Two simulated H100s running a simulated job through the SDK, with a baseline it falls far short of."""
    library = tmp_path_factory.mktemp("baselines") / "baselines.toml"
    library.write_text(BASELINE)
    d = start_daemon(
        "--simulate",
        "2xH100-SXM",
        "--sim-job",
        "demo:0-1",
        "--interval",
        "250ms",
        "--baselines",
        str(library),
    )
    yield d
    d.stop()


def job_ready(d: Daemon, name: str) -> dict[str, Any] | None:
    r = d.get("/v1/jobs/" + quote(name, safe=""))
    doc = r.json() if r.status_code == 200 else None
    return doc if doc and doc["tokens_per_second"] and doc["baseline"]["ratios"] else None


def number(text: str) -> float:
    m = re.search(r"-?\d+(\.\d+)?", text)
    assert m, text
    return float(m.group())


@pytest.mark.slow
def test_the_page_shows_each_gpu_and_the_job_with_its_verdict_evidence_and_baseline(chrome, demo) -> None:
    api = wait_for("the demo job's rates", lambda: job_ready(demo, "demo"))
    open_page(chrome, demo.url + "/?refresh=1", "#job-rows .job-name")
    gpus = demo.get("/v1/gpus").json()["gpus"]
    wait_for("the GPUs' users", lambda: "demo rank 1" in texts(chrome, "#gpu-rows > tr")[1])
    rows = texts(chrome, "#gpu-rows > tr")
    assert len(rows) == len(gpus) == 2
    for g, row in zip(gpus, rows, strict=True):
        cells = [c.strip() for c in row.split("\t")]
        reading = g["reading"]
        assert cells[0].split("\n")[:2] == [str(g["index"]), g["name"]]
        assert 0 <= number(cells[1]) <= 100 and cells[1].split("\n")[0].endswith(" %")
        assert number(cells[2]) == pytest.approx(reading["memory_used_bytes"] / 2**30, abs=0.5)
        assert f" / {reading['memory_total_bytes'] / 2**30:.1f} GiB" in cells[2]
        assert cells[3].endswith(f" / {reading['power_limit_watts']:.0f} W")
        assert re.fullmatch(r"\d+ °C\nHBM \d+ °C", cells[4])
        assert re.match(r"\d+ MHz\n", cells[5])
        assert f"demo rank {g['index']}" in cells[7]
        assert re.search(r"pid \d+ python \(\w+\) [\d.]+ GiB", cells[7])

    (job,) = texts(chrome, "#job-rows > tr")
    name, tokens, mfu, step, verdict, baseline = (c.strip() for c in job.split("\t"))
    assert name.split("\n")[:3] == ["demo", "2 of 2 ranks here · train", "GPU 0, 1"]
    shown = number(tokens) * {"k": 1e3, "M": 1e6}[tokens.split("\n")[0].split()[1]]
    assert shown == pytest.approx(api["tokens_per_second"], rel=0.1)
    assert number(mfu) == pytest.approx(api["mfu"] * 100, abs=1.0)
    current = api["baseline"]["current"]["step_time_seconds"]
    assert number(step) * (1e-3 if step.endswith("ms") else 1) == pytest.approx(current, rel=0.1)
    diagnosis = api["diagnosis"]
    assert verdict.startswith(diagnosis["bottleneck"].replace("_", " ") + " ")
    assert diagnosis["summary"].split(":")[0] in verdict  # e.g. "compute-bound"
    # signals near their threshold come and go between two reads: each met one drawn is one the API has
    checks = {
        (e["signal"].replace("_", " "), e["op"].replace(">=", "≥"), round(e["threshold"] * 100, 1))
        for e in diagnosis["evidence"]
    }
    met = texts(chrome, "#job-rows ul.evidence:not(details ul) li.met")
    assert met
    for line in met:
        m = re.fullmatch(r"([a-z ]+) [\d.]+ % \(([≥<]) ([\d.]+) %\)", line)
        assert m and (m[1], m[2], float(m[3])) in checks, line
    assert f"all {len(diagnosis['evidence'])} signals" in verdict and "goodput" in verdict
    ratios = rf"tokens/s {X}0\.0\d\nstep {X}\d+\.\d\d\nMFU {X}0\.\d\d\nvs demo-on-2xh100"
    assert re.fullmatch(ratios, baseline), baseline
    assert len(chrome.find_elements("css selector", "#job-rows li.worse")) == 3  # all three below the mark

    # evidence the reader opened stays open across refreshes
    click(chrome, "#job-rows details summary")
    seen = refreshes(chrome)
    wait_for("two more refreshes", lambda: refreshes(chrome) >= seen + 2)
    assert chrome.execute_script("return document.querySelector('#job-rows details').open")
    assert status(chrome).startswith("live · sample ")
    assert problems(chrome) == []


@pytest.mark.slow
def test_a_jobs_name_opens_its_ranks_and_advice_in_the_page(chrome, demo) -> None:
    """Found trying the page as a new user would (issue 32): the job's name led to raw JSON. It opens the
    job below its row, as `gpumon diagnose` tells it, from the detail the page already has; the JSON is one
    link further."""
    api = wait_for("the demo job's rates", lambda: job_ready(demo, "demo"))
    open_page(chrome, demo.url + "/?refresh=0.5", "#job-rows details")
    assert texts(chrome, "#job-rows > tr.job-detail") == []
    click(chrome, "#job-rows .job-name")
    (shown,) = wait_for("the job's details", lambda: texts(chrome, "#job-rows > tr.job-detail"))
    assert shown.startswith("Advice: " + api["diagnosis"]["advice"]), shown
    for r in api["ranks"]:
        g = r["gpus"][0]
        line = re.search(
            rf"rank {r['rank']} train · pid {r['pid']} · GPU {g['index']} {g['name']} .*\n(.*)", shown
        )
        assert line, shown
        assert number(line[1].split("MFU ")[1]) == pytest.approx(r["mfu"] * 100, abs=1.0)
        assert re.search(
            r"[\d.]+ k tokens/s · step [\d.]+ s · MFU .* · data wait \d+ % · communication", line[1]
        )
    assert shown.endswith("\nthis job as JSON")
    href = "return document.querySelector('#job-rows a.job-json').href"
    assert chrome.execute_script(href) == demo.url + "/v1/jobs/demo"

    # open across redraws, directly below the job's row; the name closes them
    seen = refreshes(chrome)
    wait_for("two more refreshes", lambda: refreshes(chrome) >= seen + 2)
    rows = "return Array.from(document.querySelectorAll('#job-rows > tr'), (r) => r.className)"
    assert chrome.execute_script(rows) == ["", "job-detail"]
    expanded = "return document.querySelector('#job-rows .job-name').ariaExpanded"
    assert chrome.execute_script(expanded) == "true"
    click(chrome, "#job-rows .job-name")
    wait_for("the details closed", lambda: chrome.execute_script(rows) == [""])
    seen = refreshes(chrome)
    wait_for("two more refreshes", lambda: refreshes(chrome) >= seen + 2)
    assert chrome.execute_script(rows) == [""] and chrome.execute_script(expanded) == "false"
    assert problems(chrome) == []


# the runs of letters and digits in the text under the selected elements that the layout splits across lines
# (a word is a run: "NVIDIA", "H100", "80GB"; a name may still wrap at its spaces, hyphens and slashes)
BROKEN_WORDS = """
const broken = [];
for (const root of document.querySelectorAll(arguments[0])) {
  const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let text = walk.nextNode(); text; text = walk.nextNode()) {
    for (const m of text.data.matchAll(/[\\p{L}\\p{N}]+/gu)) {
      const range = document.createRange();
      range.setStart(text, m.index);
      range.setEnd(text, m.index + m[0].length);
      if (new Set(Array.from(range.getClientRects(), (r) => Math.round(r.top))).size > 1) broken.push(m[0]);
    }
  }
}
return broken;
"""


@pytest.mark.slow
@pytest.mark.parametrize("width", [420, 800])
def test_on_a_phone_or_a_narrow_window_no_word_is_broken_across_lines(demo, width: int) -> None:
    """Found trying the page as a new user would (issue 32): at 420 px the tables squeezed their name
    columns until "NVIDIA H100 80GB HBM3" and the job's name stood one letter a line."""
    wait_for("the demo job's rates", lambda: job_ready(demo, "demo"))
    with chromium(width=width) as narrow:
        open_page(narrow, demo.url + "/?refresh=1", "#job-rows details")
        wait_for("the GPUs' users", lambda: "demo rank 1" in texts(narrow, "#gpu-rows > tr")[1])
        assert "NVIDIA H100 80GB HBM3" in texts(narrow, "#gpu-rows > tr")[0]
        assert narrow.execute_script(BROKEN_WORDS, "#gpu-rows, #job-rows") == []
        # the page never scrolls sideways; a table may in its box, but not on a phone, where rows stack
        boxes = "html, .scroll" if width < 640 else "html"
        widths = narrow.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]), "
            "(e) => [e.scrollWidth, e.clientWidth])",
            boxes,
        )
        assert all(scroll <= client for scroll, client in widths), widths
        assert problems(narrow) == []


@pytest.mark.slow
def test_the_page_refreshes_itself_and_stays_usable_with_20_jobs_on_8_gpus(chrome, daemon) -> None:
    d = daemon("--simulate", "8xH100-SXM", "--interval", "250ms")
    open_page(chrome, d.url + "/?refresh=0.5")
    assert "No job reports to this node" in chrome.find_element("id", "job-rows").text
    chrome.execute_script("window.__sameDocument = true")
    first = status(chrome)
    longest = "z" * 128  # a name as long as the protocol allows, with nowhere to break it
    for i in range(19):
        post(d, now_report(50, job=f"job-{i:02}", devices=[str(i % 8)], step_seconds=0.2))
    post(d, now_report(50, job=longest, devices=["7"], step_seconds=0.2))
    wait_for("20 job rows", lambda: len(texts(chrome, "#job-rows .job-name")) == 20)
    assert chrome.execute_script("return window.__sameDocument === true")  # redrawn, not reloaded
    assert status(chrome) != first  # a newer sample
    gpu0 = texts(chrome, "#gpu-rows > tr")[0]
    assert all(f"job-{i:02} rank 0" in gpu0 for i in (0, 8, 16))
    names = texts(chrome, "#job-rows .job-name")
    assert names == sorted(names) and names[0] == "job-00" and names[-1] == longest
    assert f"{longest} rank 0" in texts(chrome, "#gpu-rows > tr")[7]
    # neither the page nor either table scrolls sideways at 1280 px
    widths = chrome.execute_script(
        "return [document.documentElement, ...document.querySelectorAll('.scroll')]"
        ".map((e) => [e.scrollWidth, e.clientWidth])"
    )
    assert all(scroll <= client for scroll, client in widths), widths
    assert problems(chrome) == []


@pytest.mark.slow
def test_a_hostile_job_name_is_text_and_its_link_and_detail_stay_one_path_segment(chrome, daemon) -> None:
    d = daemon("--simulate", "2xH100-SXM", "--interval", "250ms")
    post(d, now_report(50, job=HOSTILE_JOB, devices=["0"], step_seconds=0.2))
    open_page(chrome, d.url + "/?refresh=1", "#job-rows .job-name")
    assert texts(chrome, "#job-rows .job-name") == [HOSTILE_JOB]
    click(chrome, "#job-rows .job-name")
    read = "return document.querySelector('#job-rows a.job-json').href"
    assert wait_for("the JSON link", lambda: chrome.execute_script(read)) == (
        d.url + "/v1/jobs/" + quote(HOSTILE_JOB, safe="")
    )
    assert d.get("/v1/jobs/" + quote(HOSTILE_JOB, safe="")).json()["job"] == HOSTILE_JOB
    # the job's detail came with the list: its evidence, step time and GPU are drawn
    wait_for("the job's detail", lambda: "signals" in texts(chrome, "#job-rows > tr")[0])
    assert f"{HOSTILE_JOB} rank 0" in texts(chrome, "#gpu-rows > tr")[0]
    assert problems(chrome) == []


@pytest.mark.slow
def test_without_training_the_page_never_asks_for_jobs_and_shows_an_xid(chrome, daemon) -> None:
    d = daemon("--simulate", "1xH100-SXM", "--no-ingest", "--interval", "250ms", "--sim-fault=xid:0:79@0.5")
    open_page(chrome, d.url + "/?refresh=0.5")
    seen = refreshes(chrome)
    wait_for("two more refreshes", lambda: refreshes(chrome) >= seen + 2)
    assert "Training telemetry is off" in chrome.find_element("id", "jobs").text
    badge = wait_for("the XID", lambda: chrome.find_elements("css selector", "#gpu-rows .badge.bad"))[0]
    (xid,) = d.get("/v1/gpus").json()["gpus"][0]["xids"]
    assert badge.text == f"XID 79 {X}1" and badge.get_attribute("title").startswith(xid["description"])
    assert problems(chrome) == []  # a request for /v1/jobs would have logged its 404


@pytest.mark.slow
def test_the_page_loads_with_the_browsers_basic_auth_credentials(chrome, guarded) -> None:
    url = guarded.url.replace("http://", f"http://alice:{quote(PASSWORD, safe='')}@") + "/?refresh=0.5"
    open_page(chrome, url)
    seen = refreshes(chrome)
    wait_for("two more refreshes", lambda: refreshes(chrome) >= seen + 2)
    # /v1/gpus and /v1/jobs answered: the browser sent the credentials it was opened with
    assert status(chrome).startswith("live · sample "), status(chrome)
    assert len(texts(chrome, "#gpu-rows > tr")) == 2
    assert problems(chrome) == []


@pytest.mark.slow
def test_a_password_revoked_mid_session_shows_as_401_at_the_next_refresh(chrome, tmp_path) -> None:
    """Found by review: the daemon's 401 carried a challenge, which a browser answers with a sign-in prompt
    that the page's fetch waits on (forever, headless): the page said "no answer in time", never 401. Its
    own requests now get the 401 without a challenge."""
    config = tmp_path / "web.yml"
    config.write_text(json.dumps({"basic_auth_users": {"alice": HASH}}))
    d = start_daemon("--simulate", "1xH100-SXM", "--interval", "200ms", "--web-config", str(config))
    try:
        open_page(
            chrome, d.url.replace("http://", f"http://alice:{quote(PASSWORD, safe='')}@") + "/?refresh=0.5"
        )
        wait_for("live", lambda: status(chrome).startswith("live"))
        config.write_text(json.dumps({"basic_auth_users": {"bob": HASH}}))  # alice's password is revoked
        wait_for("the 401", lambda: "401 unauthorized: reload the page" in status(chrome), timeout=8)
        assert len(texts(chrome, "#gpu-rows > tr")) == 1  # the last data stays
        assert problems(chrome, allow_network=True) == []
        page_request = d.client.get("/v1/gpus", headers={"X-Gpumon-Page": "1"})
        assert page_request.status_code == 401 and "www-authenticate" not in page_request.headers
        assert (
            d.client.get("/v1/gpus").headers["www-authenticate"] == 'Basic realm="gpumon"'
        )  # others: as ever
    finally:
        d.stop()
