"""Bounds a report cannot pass whoever sends it (physics.py), and the sender binding of incarnations
(store.py with web/peer.py): the kernel's word on who connected, checked against the report's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from support.reports import T0, report

from gpumon.jobs.physics import MAX_RATE, MAX_THREADS, SLACK, check_growth, check_start
from gpumon.jobs.report import parse
from gpumon.jobs.store import Conflict, Impostor, JobStore
from gpumon.web.peer import Peer, peer_of


def store() -> JobStore:
    return JobStore(max_jobs=4, max_ranks=8, ttl=60.0, window=60.0)


def test_growth_within_wall_time_passes_and_beyond_it_names_the_field() -> None:
    old = parse(report(10, t=T0 + 10))
    fine = report(20, t=T0 + 20)
    fine["totals"]["tokens"] = 10_000 + MAX_RATE["tokens"] * (10 + SLACK) * 0.99
    check_growth(old, parse(fine))
    fine["totals"]["tokens"] = 10_000 + MAX_RATE["tokens"] * (10 + SLACK) * 1.01
    with pytest.raises(ValueError, match=r"^totals\.tokens: grew by .* in 10 s since the last report"):
        check_growth(old, parse(fine))
    phases = report(20, t=T0 + 20, phases={"data_wait": MAX_THREADS * 16})  # 15 s of wall time at most
    with pytest.raises(ValueError, match=r"^phases\.data_wait: grew by"):
        check_growth(old, parse(phases))


def test_a_first_report_is_bounded_by_the_time_since_its_process_started() -> None:
    r = report(1, t=T0 + 1, started=T0)
    r["totals"]["tokens"] = MAX_RATE["tokens"] * (1 + SLACK) * 1.01
    with pytest.raises(ValueError, match=r"since the process started"):
        check_growth(None, parse(r))
    r["process_started"] = T0 - 3600  # the process ran an hour before its Reporter: still bounded by that
    check_growth(None, parse(r))


def test_a_local_report_cannot_start_before_the_node_booted() -> None:
    boot = T0 + 100
    check_start(parse(report(5, started=boot, t=boot + 10)), boot)
    with pytest.raises(ValueError, match=r"^started: 3600 s before this node booted"):
        check_start(parse(report(5, started=boot - 3600, t=boot + 10)), boot)
    late = report(5, started=boot, t=boot + 10, process_started=boot - 86400)
    with pytest.raises(ValueError, match=r"^process_started:"):
        check_start(parse(late), boot)


def test_the_store_refuses_impossible_growth_and_keeps_the_rank() -> None:
    s = store()
    s.ingest(parse(report(10, t=T0 + 10)), T0 + 10)
    jump = report(11, t=T0 + 11)
    jump["totals"]["tokens"] = 2**53
    with pytest.raises(ValueError, match=r"totals\.tokens: grew by"):
        s.ingest(parse(jump), T0 + 11)
    s.ingest(parse(report(12, t=T0 + 12)), T0 + 12)
    assert s.views(T0 + 12)[0].totals()["tokens"] == 12_000


def test_the_kernel_names_the_connected_process() -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        peer = peer_of(a)
    assert peer is not None and peer.pid == os.getpid() and peer.known and peer.alive()
    assert peer.speaks_for(os.getpid()) and not peer.speaks_for(os.getpid() + 1)
    tcp = socket.socket()
    with tcp:
        assert peer_of(tcp) is None


def _child() -> tuple[subprocess.Popen[bytes], Peer]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        me = peer_of(a)
    assert me is not None
    from gpumon.web.peer import _nspids, _stat

    return proc, Peer(proc.pid, me.uid, _stat(proc.pid)[1], _nspids(proc.pid))


def test_an_incarnation_belongs_to_the_process_that_first_sent_it() -> None:
    s = store()
    proc, owner = _child()
    try:
        s.ingest(parse(report(10, t=T0 + 10, pid=proc.pid)), T0 + 10, owner)
        other = Peer(owner.pid + 1, owner.uid, 1, (owner.pid + 1,))
        with pytest.raises(Impostor, match=r"incarnation 'a1b2c3d4' is pid \d+'s, and this report came"):
            s.ingest(parse(report(11, t=T0 + 11)), T0 + 11, other)
        with pytest.raises(Impostor, match="a TCP connection"):
            s.ingest(parse(report(11, t=T0 + 11)), T0 + 11, None)
        s.ingest(parse(report(11, t=T0 + 11, pid=proc.pid)), T0 + 11, owner)  # the owner goes on
        takeover = report(1, t=T0 + 12, started=T0 + 11.5, incarnation="new")
        with pytest.raises(Conflict, match=r"which is still running"):
            s.ingest(parse(takeover), T0 + 12, other)
        proc.kill()
        proc.wait()  # reaped: a zombie would still hold the pid, and counts as exited too
        s.ingest(parse(takeover), T0 + 12, other)
        (view,) = s.views(T0 + 12)
        assert view.report.incarnation == "new" and view.restarts == 1 and view.totals()["steps"] == 12
    finally:
        proc.kill()
        proc.wait()


def test_over_tcp_nothing_is_bound_and_nothing_is_checked() -> None:
    s = store()
    s.ingest(parse(report(10, t=T0 + 10)), T0 + 10, None)
    s.ingest(parse(report(11, t=T0 + 11)), T0 + 11, Peer(os.getpid(), 0, 1, (os.getpid(),)))
    s.ingest(parse(report(12, t=T0 + 12)), T0 + 12, None)
    assert s.views(T0 + 12)[0].totals()["steps"] == 12


def test_a_peer_in_an_invisible_namespace_binds_nothing() -> None:
    s = store()
    s.ingest(parse(report(10, t=T0 + 10)), T0 + 10, Peer(0, 1000))
    s.ingest(parse(report(11, t=T0 + 11)), T0 + 11, Peer(0, 1001))
    assert Peer(0, 1000).speaks_for(12345) and not Peer(0, 1000).alive()
