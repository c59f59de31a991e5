"""Ingest and job endpoints of a real daemon over loopback HTTP and a unix socket."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.helpers import require_tool
from support.reports import now_report, report

from gpumon.client import protocol as P
from gpumon.jobs.api import is_local
from gpumon.web.listen import UNIX_SOCKET_SCOPE_KEY

TOKEN = "s3cret-token-0123456789"


@pytest.fixture
def node(daemon):
    # the hand-made reports' pids run nowhere: the GPUs' load is the node's own jobs, which do not report
    return daemon(
        "--simulate", "2xH100-SXM", "--sim-unreported-jobs", "--interval", "200ms", "--max-jobs", "2",
        "--max-ranks", "3", "--counter-hold", "1s",
    )  # fmt: skip


def post(d, body, **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    return d.client.post(P.PATH, content=content, headers=headers, **kw)


def samples(text: str, name: str) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_a_report_shows_up_in_metrics_and_in_the_jobs_api(node) -> None:
    assert post(node, now_report(100, flops_per_token=6e9)).status_code == 204
    metrics = node.get("/metrics").text
    tokens = samples(metrics, "gpumon_training_tokens_total")
    assert tokens == {(("job_name", "llm"), ("rank", "0")): 100_000}
    (mfu,) = samples(metrics, "gpumon_training_job_mfu_ratio").values()
    assert mfu == pytest.approx(99_000 / 9.9 * 6e9 / 989.5e12, rel=1e-6)
    (flops,) = samples(metrics, "gpumon_training_job_flops_per_second").values()
    (peak,) = samples(metrics, "gpumon_training_job_peak_flops_per_second").values()
    assert (flops, peak) == (pytest.approx(99_000 / 9.9 * 6e9, rel=1e-6), 989.5e12)
    assert not samples(metrics, "gpumon_training_mfu_ratio"), "per rank only under --collect rank-rates"
    jobs = node.get("/v1/jobs").json()
    assert [j["job"] for j in jobs["jobs"]] == ["llm"] and jobs["jobs"][0]["bottleneck"]
    one = node.get("/v1/jobs/llm").json()
    assert one["ranks"][0]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert node.get("/v1/jobs/nope").status_code == 404
    outcomes = samples(metrics, "gpumon_ingest_reports_total")
    assert outcomes[(("outcome", "accepted"),)] == 1 and outcomes[(("outcome", "invalid"),)] == 0


def test_bad_reports_get_a_4xx_with_a_reason_and_change_nothing(node) -> None:
    bad = now_report(5)
    bad["rank"] = -1
    r = post(node, bad)
    assert r.status_code == 422 and "rank: must be between" in r.json()["detail"]
    r = post(node, b"{not json")
    assert r.status_code == 400 and "not JSON" in r.json()["detail"]
    r = post(node, b"[" * 100_000)
    assert r.status_code == 413
    r = post(node, b"[" * 30_000 + b"]" * 30_000)
    assert r.status_code in (400, 422)
    r = post(node, b"x" * (P.MAX_BODY_BYTES + 1))
    assert r.status_code == 413 and "larger than" in r.json()["detail"]
    assert "gpumon_training_tokens_total" not in node.get("/metrics").text
    assert node.get("/readyz").status_code == 200


def test_the_cardinality_guard_answers_429_and_names_the_limit(node) -> None:
    assert post(node, now_report(1, job="a")).status_code == 204
    assert post(node, now_report(1, job="b")).status_code == 204
    r = post(node, now_report(1, job="c"))
    assert r.status_code == 429 and "--max-jobs" in r.json()["detail"]
    assert post(node, now_report(1, job="a", rank=1, world_size=2)).status_code == 204
    r = post(node, now_report(1, job="b", rank=1, world_size=2))
    assert r.status_code == 429 and "--max-ranks" in r.json()["detail"]
    outcomes = samples(node.get("/metrics").text, "gpumon_ingest_reports_total")
    assert outcomes[(("outcome", "job_limit"),)] == 1 and outcomes[(("outcome", "rank_limit"),)] == 1


def test_a_duplicate_report_is_acknowledged_and_counted_once(node) -> None:
    report = now_report(10)
    assert post(node, report).status_code == 204
    assert post(node, report).status_code == 204
    metrics = node.get("/metrics").text
    assert samples(metrics, "gpumon_training_steps_total") == {(("job_name", "llm"), ("rank", "0")): 10}
    assert samples(metrics, "gpumon_ingest_reports_total")[(("outcome", "duplicate"),)] == 1


def test_a_token_is_required_when_configured(daemon) -> None:
    d = daemon("--simulate", "1xH100-SXM", "--ingest-token", TOKEN)
    r = post(d, now_report(1))
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert post(d, now_report(1), headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert post(d, now_report(1), headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 204


@pytest.mark.slow
def test_silent_ranks_expire_and_their_series_go(daemon) -> None:
    d = daemon("--simulate", "1xH100-SXM", "--rank-ttl", "1s")
    assert post(d, now_report(5)).status_code == 204
    assert "gpumon_training_tokens_total{" in d.get("/metrics").text
    time.sleep(1.3)
    text = d.get("/metrics").text
    assert "gpumon_training_tokens_total{" not in text and "gpumon_training_rank_info{" not in text
    assert samples(text, "gpumon_ingest_expired_ranks_total") == {(): 1}
    assert d.get("/v1/jobs").json()["jobs"] == []


@pytest.mark.slow
def test_reports_over_the_unix_socket(daemon) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "ingest.sock")
        d = daemon("--simulate", "1xH100-SXM", "--ingest-socket", path)
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://gpumon") as c:
            # over the unix socket the kernel names the sender: a report speaks for its own process
            r = c.post(P.PATH, content=json.dumps(now_report(7, pid=os.getpid())).encode())
            assert r.status_code == 204, r.text
        assert samples(d.get("/metrics").text, "gpumon_training_steps_total")
        from support.helpers import run_gpumon

        out = run_gpumon("diagnose", "--job", "llm", env={"GPUMON_URL": f"unix://{path}"})
        assert out.returncode == 0 and "Job llm" in out.stdout, (
            out.stderr
        )  # the CLI finds it where the SDK does
        assert d.stop() == 0
        assert not Path(path).exists(), "the socket file is removed at shutdown"


def test_ingest_can_be_turned_off(daemon) -> None:
    d = daemon("--simulate", "1xH100-SXM", "--no-ingest")
    assert post(d, now_report(1)).status_code in (404, 405)
    assert d.get("/v1/jobs").status_code == 404


@pytest.mark.parametrize(
    ("client", "local"),
    [
        (None, False),  # a TCP request whose peer reset the connection: uvicorn knows no address
        (("", 0), False),
        (("127.0.0.1", 5), True),
        (("127.8.9.1", 5), True),
        (("::1", 5), True),
        (("::ffff:127.0.0.1", 5), True),
        (("10.0.0.7", 5), False),
        (("::ffff:10.0.0.7", 5), False),
        (("testclient", 5), False),
        (("localhost", 5), False),  # a peer is an address, never a name
    ],
)
def test_only_loopback_and_the_unix_socket_are_local(client, local) -> None:
    assert is_local({"type": "http", "client": client}) is local
    assert is_local({"type": "http", "client": client, UNIX_SOCKET_SCOPE_KEY: True})


def test_promtool_accepts_the_exposition_with_training_series(node) -> None:
    promtool = require_tool("promtool")
    post(node, now_report(100, phases={"data_wait": 1.0, "communication": 2.0}))
    inference = now_report(50, job="serve", kind="inference")
    inference["request_seconds"] = inference["step_seconds"]
    inference["totals"]["requests"] = 50
    post(node, inference)
    body = node.get("/metrics").text
    assert "gpumon_training_job_step_duration_seconds_bucket" in body
    assert "# TYPE gpumon_training_step_duration_seconds summary" in body
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout + check.stderr == "", check.stdout + check.stderr


def _outside_address() -> str | None:
    """This machine's address on a non-loopback interface, as another host would reach it."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


@pytest.mark.slow
def test_reports_from_another_host_are_refused_unless_allowed(daemon) -> None:
    addr = _outside_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    d = daemon("--simulate", "1xH100-SXM", "--listen", "0.0.0.0:0")
    port = d.url.rsplit(":", 1)[1]
    body = json.dumps(now_report(1)).encode()
    r = httpx.post(f"http://{addr}:{port}{P.PATH}", content=body, timeout=10)
    assert r.status_code == 403 and "--ingest-allow-remote" in r.json()["detail"]
    assert httpx.get(f"http://{addr}:{port}/metrics", timeout=10).status_code == 200, "scrapes stay open"
    d2 = daemon("--simulate", "1xH100-SXM", "--listen", "0.0.0.0:0", "--ingest-allow-remote")
    port2 = d2.url.rsplit(":", 1)[1]
    assert httpx.post(f"http://{addr}:{port2}{P.PATH}", content=body, timeout=10).status_code == 204


@pytest.mark.slow
def test_gpumon_diagnose_explains_the_verdict_with_numbers(node) -> None:
    from support.helpers import run_gpumon

    t = time.time()
    waits = [
        now_report(10, t=t - 1, seq=1, phases={"data_wait": 0.0}),
        now_report(20, t=t, seq=2, phases={"data_wait": 0.6}),
    ]
    for r in waits:
        assert post(node, r).status_code == 204
    out = run_gpumon("diagnose", "--url", node.url, "--job", "llm")
    assert out.returncode == 0, out.stderr
    assert "Job llm: 1 rank(s) on this node" in out.stdout
    assert "data_wait_share" in out.stdout and "60.0 %" in out.stdout and "Advice:" in out.stdout
    assert "rank 0 on GPU 0 NVIDIA H100 80GB HBM3" in out.stdout
    everything = run_gpumon("diagnose", "--url", node.url, "--json")
    (job,) = json.loads(everything.stdout)
    assert job["ranks"][0]["rates"]["phase_ratios"]["data_wait"] == pytest.approx(0.6)
    missing = run_gpumon("diagnose", "--url", node.url, "--job", "nope")
    assert missing.returncode == 1 and "no job 'nope'" in missing.stderr and "Traceback" not in missing.stderr
    down = run_gpumon("diagnose", "--url", "http://127.0.0.1:1")
    assert down.returncode == 1 and down.stderr.count("\n") == 1 and "cannot reach" in down.stderr
    bad = run_gpumon("diagnose", "--url", "ftp://x")
    assert bad.returncode == 2 and "--url" in bad.stderr


def test_two_processes_reporting_as_one_rank_get_409_naming_both(node) -> None:
    now = time.time()
    first = report(5, incarnation="first", pid=100, started=now - 30)
    second = report(5, incarnation="second", pid=200, started=now - 20)
    assert post(node, first).status_code == 204
    assert post(node, second).status_code == 204
    again = report(9, incarnation="first", pid=100, started=now - 30, t=now)
    r = post(node, again)
    assert r.status_code == 409 and "pid 200" in r.json()["detail"]
    assert node.client.get(P.PATH).status_code == 405
    outcomes = samples(node.get("/metrics").text, "gpumon_ingest_reports_total")
    assert outcomes[(("outcome", "conflict"),)] == 1 and outcomes[(("outcome", "invalid"),)] == 1


def test_a_future_dated_incarnation_is_refused_and_the_live_rank_keeps_counting(node) -> None:
    """The issue's row: a new incarnation claiming to start 999 s from now made every later report of the
    live process look older than it: each answered 204 but counted "duplicate", its counters frozen."""
    now = time.time()
    live = report(10, incarnation="live", pid=100, started=now - 5, step_seconds=0.1)
    assert post(node, live).status_code == 204
    liar = report(1, incarnation="liar", pid=666, started=now + 999, t=now + 999)
    r = post(node, liar)
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("time: 999 s ahead of this node's clock"), r.json()
    slightly = report(1, incarnation="liar", pid=666, started=now + 60, t=now + 60)
    assert post(node, slightly).status_code == 422
    later = report(30, incarnation="live", pid=100, started=now - 5, step_seconds=0.1)
    assert post(node, later).status_code == 204
    metrics = node.get("/metrics").text
    assert samples(metrics, "gpumon_training_steps_total") == {(("job_name", "llm"), ("rank", "0")): 30}
    outcomes = samples(metrics, "gpumon_ingest_reports_total")
    assert outcomes[(("outcome", "duplicate"),)] == 0 and outcomes[(("outcome", "invalid"),)] == 2
    # a clock a second or two ahead (another host's, NTP-synced) is still accepted
    assert post(node, report(1, job="skew", started=time.time() + 2, t=time.time() + 2)).status_code == 204


def test_an_impostor_with_the_live_incarnation_cannot_freeze_it_in_silence(node) -> None:
    """Found by review: the incarnation is public (GET /v1/jobs/{job}); one report with it and seq 2**62 made
    every later report of the live process a silent duplicate, forever."""
    now = time.time()
    live = dict(incarnation="live", pid=100, started=now - 60, step_seconds=0.1)
    assert post(node, report(10, seq=10, t=now - 10, **live)).status_code == 204
    huge = post(node, report(10, seq=2**62, t=now - 9, **live))
    assert huge.status_code == 422 and huge.json()["detail"].startswith("seq: jumped from 10 to"), huge.text
    assert post(node, report(20, seq=11, t=now - 8, **live)).status_code == 204  # still counting
    # a jump within what a real SDK could make is taken; the live process's next report then says why it
    # is not counted (409), instead of a 204 counted as a duplicate
    assert post(node, report(20, seq=500, t=now - 7, **live)).status_code == 204
    r = post(node, report(30, seq=12, t=now, **live))
    assert r.status_code == 409 and "two senders in one process (pid 100) send incarnation 'live'" in r.text
    outcomes = samples(node.get("/metrics").text, "gpumon_ingest_reports_total")
    assert outcomes[(("outcome", "duplicate"),)] == 0


@pytest.mark.slow
def test_gpumon_estimate_compares_with_what_a_running_job_uses(node) -> None:
    from support.helpers import run_gpumon

    assert post(node, now_report(10)).status_code == 204
    out = run_gpumon("estimate", "--model", "llama3-8b", "--batch", "1", "--job", "llm", "--url", node.url)
    assert out.returncode == 0, out.stderr
    assert "job llm" in out.stdout and "USED/ESTIMATED" in out.stdout, out.stdout
    as_json = run_gpumon(
        "estimate", "--model", "llama3-8b", "--batch", "1", "--job", "llm", "--url", node.url, "--json"
    )
    doc = json.loads(as_json.stdout)
    assert doc["job"]["ranks"][0]["actual_bytes"] > 0, doc["job"]


def test_training_series_can_be_selected_by_name(node) -> None:
    assert post(node, now_report(10)).status_code == 204
    r = node.get("/metrics", params={"name[]": ["gpumon_training_tokens_total", "gpumon_gpu_up"]})
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert names == {"gpumon_training_tokens", "gpumon_gpu_up"}


def test_forwarded_headers_never_change_who_the_client_is(daemon, monkeypatch) -> None:
    # uvicorn trusts X-Forwarded-For from the addresses in FORWARDED_ALLOW_IPS, a variable gpumon never
    # documents; with "*" a remote report could claim 127.0.0.1. Here a loopback client claims to be remote:
    # were the header believed, the loopback-only rule would refuse it (403)
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    d = daemon("--simulate", "1xH100-SXM")
    forged = {"X-Forwarded-For": "203.0.113.9", "Forwarded": "for=203.0.113.9", "X-Forwarded-Proto": "https"}
    assert post(d, now_report(1, job="forwarded"), headers=forged).status_code == 204
    assert [j["job"] for j in d.get("/v1/jobs").json()["jobs"]] == ["forwarded"]


def test_the_allocator_view_beside_the_estimate_in_the_api_and_diagnose(node) -> None:
    """A PyTorch rank that retries allocations: the memory finding, the estimate against the allocator, the
    gap named and a ZeRO stage that fits, in /v1/jobs, /metrics and `gpumon diagnose`."""
    from support.helpers import run_gpumon

    t = time.time()
    llama = {"layers": 32, "hidden": 4096, "heads": 32, "vocab": 32000, "seq_len": 4096, "name": "llama2-7b"}
    setup = {
        "model": llama,
        "micro_batch": 1,
        "zero_stage": 0,
        "checkpointing": "full",
    }
    gib = 1 << 30
    for seq, retries in ((1, 2), (2, 9)):
        memory = {
            "device": 0, "allocated_bytes": 60 * gib, "allocated_peak_bytes": 74 * gib,
            "reserved_bytes": 76 * gib, "reserved_peak_bytes": 78 * gib, "inactive_split_bytes": 3 * gib,
            "alloc_retries": retries, "ooms": 0,
        }  # fmt: skip
        # a process younger than the daemon (one older is a daemon restart's: its counters show at once)
        kw = {"seq": seq, "world_size": 8, "memory": memory, "setup": setup, "step_seconds": 0.001}
        body = now_report(10 * seq, t=t - 2 + seq, **kw)
        assert post(node, body).status_code == 204, body
    rank = (("job_name", "llm"), ("rank", "0"))
    # the retries' first value comes after renders at 0 (zerofirst.py), so increase() sees it
    shown = []
    while not shown or shown[-1] != {rank: 9}:
        assert len(shown) < 50, shown
        shown.append(samples(node.get("/metrics").text, "gpumon_training_allocator_retries_total"))
        time.sleep(0.1)  # a render is shared for up to the sample interval (200 ms)
    assert shown[0] == {rank: 0} and all(x in ({rank: 0}, {rank: 9}) for x in shown), shown
    metrics = node.get("/metrics").text
    assert samples(metrics, "gpumon_training_allocator_reserved_bytes") == {rank: 76 * gib}
    # the peaks and the fragmentation ratio are rank-detail; 1 - allocated/reserved in PromQL
    assert not samples(metrics, "gpumon_training_allocator_fragmentation_ratio")
    job = node.get("/v1/jobs/llm").json()
    diagnosis, memory = job["diagnosis"], job["ranks"][0]["memory"]
    assert "memory_capacity" in [diagnosis["bottleneck"], *diagnosis["findings"]]
    retries = next(e for e in diagnosis["evidence"] if e["signal"] == "alloc_retries")
    assert (retries["value"], retries["unit"], retries["met"]) == (7, "count", True)  # 9 - 2 in the window
    est = memory["estimate"]
    assert est["zero_stage"] == 0 and est["total_bytes"] > 100 * gib  # 16 B per parameter: cannot fit
    assert "more than estimated" not in memory["gap"] and "less than estimated" in memory["gap"]
    assert any("ZeRO stage 1 would need" in line for line in memory["advice"])
    assert any("expandable_segments" in line for line in memory["advice"])
    out = run_gpumon("diagnose", "--url", node.url, "--job", "llm")
    assert out.returncode == 0, out.stderr
    assert "alloc_retries" in out.stdout and "7  >=       1  yes" in out.stdout
    assert "memory: 60.0 GiB allocated (peak 74.0 GiB), 76.0 GiB reserved" in out.stdout
    assert "estimate (ZeRO 0, micro-batch 1): 102.0 GiB = weights 12.6 GiB + gradients 12.6 GiB" in out.stdout
    assert "optimizer states 75.3 GiB" in out.stdout and "ZeRO stage 1 would need" in out.stdout


def test_the_job_list_with_detail_holds_each_jobs_document(node) -> None:
    """/v1/jobs?detail=true: every job's /v1/jobs/{job} document in one request (the node page's refresh)."""
    for job in ("a", "b"):
        assert post(node, now_report(10, job=job)).status_code == 204
    listed = node.get("/v1/jobs", params={"detail": "true"}).json()["jobs"]
    assert [j["job"] for j in listed] == ["a", "b"]
    for entry in listed:
        one = node.get(f"/v1/jobs/{entry['job']}").json()
        assert entry["detail"].keys() == one.keys() and entry["detail"]["job"] == entry["job"]
        assert entry["detail"]["ranks"][0]["rank"] == one["ranks"][0]["rank"]
    assert all("detail" not in j for j in node.get("/v1/jobs").json()["jobs"])
    assert node.get("/v1/jobs", params={"detail": "maybe"}).status_code == 422
