"""Records counted once per process and operation, the window's bus bandwidth, and a job's counters that
never go back when its ranks restart or leave."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.inspector import append, line, record

from gpumon.nccl import ledger as L
from gpumon.nccl.jobtotals import JobNccl
from gpumon.nccl.ledger import NcclLedger, Totals
from gpumon.nccl.reader import Claim, InspectorReader
from gpumon.nccl.records import parse


def totals(ledger: NcclLedger, hostname: str, pid: int) -> dict[str, Totals]:
    return ledger.generation_totals(hostname, pid)[1]


def add(ledger: NcclLedger, now: float, *args: object, **kw: object) -> str:
    return ledger.add(parse(line(record(*args, **kw))), now)  # type: ignore[arg-type]


def test_each_operation_counts_once_per_communicator() -> None:
    led = NcclLedger()
    assert add(led, 10, "h", 1, 5, seconds=0.5, busbw_gbs=40) == "counted"
    assert add(led, 11, "h", 1, 5, seconds=0.5, busbw_gbs=40) == "duplicate"  # the same record again
    assert add(led, 12, "h", 1, 5, comm="0xother", seconds=0.25, busbw_gbs=80) == "counted"  # another comm
    assert add(led, 12, "h", 1, 9, op="Send", p2p=True, seconds=0.1, busbw_gbs=10) == "counted"
    assert add(led, 13, "h", 1, 10, busbw_gbs="nan") == "unmeasured"
    assert add(led, 13, "h", 1, 10, busbw_gbs=40) == "duplicate"  # its sequence number was read
    assert add(led, 13, "h", 1, 4) == "counted"  # an earlier one that completed later
    got = totals(led, "h", 1)
    assert got["AllReduce"] == Totals(
        3, pytest.approx(0.79), pytest.approx(0.5 * 40e9 + 0.25 * 80e9 + 0.04 * 40e9)
    )
    assert got["Send"].operations == 1
    assert totals(led, "h", 2) == {}


def test_operations_completing_out_of_their_numbering_all_count() -> None:
    """A communicator's sends and receives share one counter, numbered when they start, and are written as
    they complete: a Recv numbered 2 can land before its Send numbered 1 (found by review)."""
    led = NcclLedger()
    for k in range(50):
        assert add(led, 1, "h", 1, 2 * k + 2, op="Recv", p2p=True) == "counted"
        assert add(led, 1, "h", 1, 2 * k + 1, op="Send", p2p=True) == "counted"
    got = totals(led, "h", 1)
    assert (got["Send"].operations, got["Recv"].operations) == (50, 50)
    assert add(led, 2, "h", 1, 37, op="Send", p2p=True) == "duplicate"  # read again
    assert add(led, 2, "h", 1, 400, op="Send", p2p=True) == "counted"
    assert add(led, 2, "h", 1, 400 - L.SEEN, op="Send", p2p=True) == "duplicate"  # older than remembered
    assert add(led, 2, "h", 1, 1 << 62, op="Send", p2p=True) == "counted"  # a jump: no huge shift
    assert add(led, 2, "h", 1, 1000, op="Send", p2p=True) == "duplicate"


def test_a_process_that_reuses_a_gone_ones_name_starts_afresh() -> None:
    """A pod resubmitted with its name and entrypoint pid: what was read under that name before the new
    process started is the old one's (found by review)."""
    led = NcclLedger()
    add(led, 100, "trainer-0", 1, 1)
    led.claim(("trainer-0", 1), started=50.0)  # the process that wrote it
    assert totals(led, "trainer-0", 1)["AllReduce"].operations == 1
    led.claim(("trainer-0", 1), started=500.0)  # a new one
    assert totals(led, "trainer-0", 1) == {}
    add(led, 600, "trainer-0", 1, 1)
    led.claim(("trainer-0", 1), started=None)  # unknown start: nothing to tell apart
    assert totals(led, "trainer-0", 1)["AllReduce"].operations == 1


def test_the_window_weights_bandwidth_by_time() -> None:
    led = NcclLedger()
    add(led, 100, "h", 1, 1, seconds=0.3, busbw_gbs=10)  # before the window
    add(led, 150, "h", 1, 2, seconds=0.3, busbw_gbs=40)
    add(led, 155, "h", 1, 3, seconds=0.1, busbw_gbs=80, op="AllGather")
    use = led.use("h", 1, now=160, window=30)
    assert use is not None
    assert use.operations == 2 and use.seconds == pytest.approx(0.4)
    assert use.bus_bytes_per_second == pytest.approx((0.3 * 40e9 + 0.1 * 80e9) / 0.4)
    assert use.busiest == "AllReduce"
    assert led.use("h", 1, now=400, window=30) is None
    assert led.use("other", 1, now=160, window=30) is None


def test_bounded_in_processes_names_and_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(L, "MAX_PROCESSES", 4)
    led = NcclLedger()
    for pid in range(1, 10):
        add(led, pid, "h", pid, 1)
    assert sorted(p for _, p in led.processes()) == [6, 7, 8, 9]  # the least recently written went first
    for n in range(30):
        add(led, 20, "h", 9, n + 2, op=f"Op{n}")
    names = set(totals(led, "h", 9))
    assert len(names) == L.MAX_OPERATIONS + 1 and L.OTHER in names
    led.forget(now=20 + L.FORGET_AFTER + 1, keep=[("h", 9)])
    assert led.processes() == [("h", 9)]


def test_a_job_counter_never_goes_back_nor_counts_twice() -> None:
    jobs = JobNccl()
    jobs.add("llm", ("h", 1), 1, {"AllReduce": Totals(10, 1.0, 40e9)}, now=0)
    jobs.add("llm", ("h", 2), 2, {"AllReduce": Totals(5, 0.5, 20e9)}, now=0)
    assert jobs.get("llm")["AllReduce"] == (15, 1.5, 60e9)
    jobs.add("llm", ("h", 1), 1, {"AllReduce": Totals(11, 1.1, 44e9)}, now=5)  # its growth only
    assert jobs.get("llm")["AllReduce"] == pytest.approx((16, 1.6, 64e9))
    # a rank restarts as a new process: its totals add in full, even above the old process's
    jobs.add("llm", ("h", 3), 3, {"AllReduce": Totals(12, 1.2, 48e9)}, now=10)
    assert jobs.get("llm")["AllReduce"] == pytest.approx((28, 2.8, 112e9))
    # process 1 drops out of the claims for a while (its rank silent past --rank-ttl) and comes back:
    # what it had is not added again (found by review: 2000 became 3000)
    jobs.keep(["llm"], now=20)
    jobs.add("llm", ("h", 1), 1, {"AllReduce": Totals(11, 1.1, 44e9)}, now=600)
    assert jobs.get("llm")["AllReduce"][0] == 28
    # the ledger forgot process 2 and met it afresh (a new generation): its totals add from 0
    jobs.add("llm", ("h", 2), 9, {"AllReduce": Totals(2, 0.2, 8e9)}, now=610)
    assert jobs.get("llm")["AllReduce"] == pytest.approx((30, 3.0, 120e9))
    # growth while another job claims the process too is nobody's
    jobs.hold("llm", ("h", 3), 3, {"AllReduce": Totals(20, 2.0, 80e9)}, now=620)
    jobs.add("llm", ("h", 3), 3, {"AllReduce": Totals(21, 2.1, 84e9)}, now=625)
    assert jobs.get("llm")["AllReduce"][0] == 31
    jobs.keep([], now=700)  # no rank of it reports any more
    assert jobs.get("llm") == {}


def test_one_process_of_several_ranks_keeps_each_ranks_records() -> None:
    """A process driving two GPUs holds two ranks of one communicator: the same hash and sequence numbers."""
    led = NcclLedger()
    for rank in (0, 1):
        rec = record("h", 1, 7)
        rec["header"]["rank"] = rank
        assert led.add(parse(line(rec)), 10) == "counted"
    assert totals(led, "h", 1)["AllReduce"].operations == 2


def test_the_reader_counts_every_outcome(tmp_path: Path) -> None:
    reader = InspectorReader(str(tmp_path), every=None, clock=lambda: 1000.0)
    reader.read_once()
    path = append(tmp_path, "node-1", 7, [record("node-1", 7, 1), record("node-1", 7, 1)])
    stats = {k: v for k, v in record("node-1", 7, 0).items() if k != "coll_perf"}
    stats["dump_stats"] = {"coll_dropped": 0}  # the plugin's own counts (format v4.2): not an operation
    with path.open("ab") as f:
        f.write(line(record("node-2", 7, 2)))  # another process's record in this file: foreign
        f.write(b"not json\n")
        f.write(line(record("node-1", 7, 3, busbw_gbs="nan")))
        f.write(line(stats))
    reader.read_once()
    outcomes, skipped, files = reader.counts()
    assert outcomes == {"counted": 1, "duplicate": 1, "unmeasured": 1, "stats": 1, "invalid": 1, "foreign": 1}
    assert (skipped, files) == (0, (1, 0))
    assert totals(reader.ledger, "node-2", 7) == {}


def test_a_process_two_jobs_claim_joins_neither(tmp_path: Path) -> None:
    """A rank of job B reporting job A's hostname and pid (or two pods on the host's network with one pid)
    must not take A's records, nor A keep records B's process may have written (found by review)."""
    claims = [Claim("a", "trainer-0", 7, None)]
    reader = InspectorReader(str(tmp_path), every=None, claims=lambda: claims, clock=lambda: 1000.0)
    reader.read_once()
    append(tmp_path, "trainer-0", 7, [record("trainer-0", 7, n) for n in range(1, 11)])
    append(tmp_path, "elsewhere", 9, [record("elsewhere", 9, 1)])  # nobody reports it: not even read
    reader.read_once()
    assert reader.jobs.get("a")["AllReduce"][0] == 10
    assert reader.ledger.processes() == [("trainer-0", 7)]
    claims.append(Claim("b", "trainer-0", 7, None))
    append(tmp_path, "trainer-0", 7, [record("trainer-0", 7, n) for n in range(11, 21)])
    reader.read_once()
    assert reader.jobs.get("b") == {} and reader.jobs.get("a")["AllReduce"][0] == 10
    assert reader.ledger.use("trainer-0", 7, 1000.0, 60.0) is None
    # B goes: A continues from there, without what was read while two jobs claimed the process, and
    # without counting its history twice (found by review)
    claims.pop()
    append(tmp_path, "trainer-0", 7, [record("trainer-0", 7, 21)])
    reader.read_once()
    assert reader.jobs.get("a")["AllReduce"][0] == 11
