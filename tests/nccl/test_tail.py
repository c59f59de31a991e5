"""The dump directory read pass by pass: only what files gained, whole lines, bounded, and never through a
link or into a FIFO (the directory is writable by every training process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.inspector import append, dump_path, line, record

from gpumon.nccl import tail
from gpumon.nccl.records import MAX_LINE
from gpumon.nccl.tail import DumpDir


def lines(d: DumpDir) -> list[bytes]:
    return [raw for _, _, raw in d.read().lines]


def test_a_file_is_read_from_where_the_last_pass_left_off(tmp_path: Path) -> None:
    d = DumpDir(str(tmp_path))
    assert d.read().files == 0  # the first pass: nothing yet
    append(tmp_path, "node-1", 42, [record("node-1", 42, 1), record("node-1", 42, 2)])
    got = d.read()
    assert [(h, p) for h, p, _ in got.lines] == [("node-1", 42)] * 2
    assert got.files == 1
    assert lines(d) == []
    append(tmp_path, "node-1", 42, [record("node-1", 42, 3)])
    assert lines(d) == [line(record("node-1", 42, 3)).rstrip(b"\n")]


def test_files_present_at_start_are_read_from_their_end(tmp_path: Path) -> None:
    append(tmp_path, "h", 1, [record("h", 1, n) for n in range(100)])  # history before this daemon
    path = dump_path(tmp_path, "h", 2)
    path.write_bytes(line(record("h", 2, 1)) + line(record("h", 2, 2))[:30])  # mid-line when we start
    d = DumpDir(str(tmp_path))
    assert lines(d) == []
    append(tmp_path, "h", 1, [record("h", 1, 100)])
    with path.open("ab") as f:
        f.write(line(record("h", 2, 2))[30:] + line(record("h", 2, 3)))
    got = lines(d)
    # the end of the line begun before the first pass is not a record; the next whole one is
    assert sorted(got) == [line(record("h", 1, 100)).rstrip(b"\n"), line(record("h", 2, 3)).rstrip(b"\n")]


def test_a_line_written_in_pieces_is_read_once_whole(tmp_path: Path) -> None:
    d = DumpDir(str(tmp_path))
    d.read()
    whole = line(record("h", 1, 1))
    path = dump_path(tmp_path, "h", 1)
    for i in range(0, len(whole), 50):
        with path.open("ab") as f:
            f.write(whole[i : i + 50])
        got = lines(d)
        assert got == ([whole.rstrip(b"\n")] if i + 50 >= len(whole) else [])


def test_truncated_or_replaced_files_are_read_from_their_start(tmp_path: Path) -> None:
    d = DumpDir(str(tmp_path))
    d.read()
    path = append(tmp_path, "h", 1, [record("h", 1, n) for n in range(5)])
    assert len(lines(d)) == 5
    path.write_bytes(line(record("h", 1, 9)))  # truncated and rewritten shorter
    assert lines(d) == [line(record("h", 1, 9)).rstrip(b"\n")]
    other = tmp_path / "new"
    other.write_bytes(b"".join(line(record("h", 1, n)) for n in range(20, 40)))
    os.replace(other, path)  # a new inode, larger than the offset reached
    assert len(lines(d)) == 20


def test_a_backlog_over_the_limit_is_skipped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tail, "MAX_BACKLOG", 10_000)
    d = DumpDir(str(tmp_path))
    d.read()
    path = append(tmp_path, "h", 1, [record("h", 1, n) for n in range(100)])
    got = d.read()
    assert got.lines == [] and got.skipped_bytes == path.stat().st_size
    append(tmp_path, "h", 1, [record("h", 1, 100)])  # reading resumes with the next line
    assert len(lines(d)) == 1


def test_an_over_long_line_is_dropped_up_to_its_newline(tmp_path: Path) -> None:
    d = DumpDir(str(tmp_path))
    d.read()
    path = dump_path(tmp_path, "h", 1)
    path.write_bytes(b"x" * (MAX_LINE + 10))  # no newline yet: grows without bound
    got = d.read()
    assert got.lines == [] and got.skipped_bytes == MAX_LINE + 10
    with path.open("ab") as f:
        f.write(b"y" * 5 * MAX_LINE + b"\n" + line(record("h", 1, 1)))
    got = d.read()
    assert [raw for _, _, raw in got.lines] == [line(record("h", 1, 1)).rstrip(b"\n")]


def test_links_fifos_and_other_names_are_never_opened(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(line(record("h", 1, 1)))
    d = DumpDir(str(tmp_path))
    d.read()
    os.symlink(secret, dump_path(tmp_path, "h", 1))
    os.mkfifo(dump_path(tmp_path, "h", 2))  # opening it for reading would block
    (tmp_path / "h-pid3.log.1").write_bytes(line(record("h", 3, 1)))
    (tmp_path / "nccl_inspector_metrics_GPU-1.prom").write_text("x 1\n")
    os.mkdir(dump_path(tmp_path, "h", 4))
    got = d.read()
    assert got.lines == [] and got.files == 0 and got.listed == 3


def test_only_the_files_of_wanted_processes_are_read(tmp_path: Path) -> None:
    d = DumpDir(str(tmp_path))
    d.read(wanted={})
    append(tmp_path, "h", 1, [record("h", 1, 1)])
    append(tmp_path, "h", 2, [record("h", 2, 1)])
    got = d.read(wanted={("h", 2): None})
    assert [(h, p) for h, p, _ in got.lines] == [("h", 2)] and got.files == 1
    # a file that appeared after the first pass is read whole once its process is wanted
    append(tmp_path, "h", 1, [record("h", 1, 2)])
    assert len(d.read(wanted={("h", 1): None, ("h", 2): None}).lines) == 2


def test_a_file_last_written_before_its_process_started_is_read_from_its_end(tmp_path: Path) -> None:
    """An earlier process of the same name and pid left its file; the new one's rank reports before its
    plugin opens (and truncates) it: the old records are not the new process's (found by review)."""
    d = DumpDir(str(tmp_path))
    d.read(wanted={})
    path = append(tmp_path, "h", 57, [record("h", 57, n) for n in range(2000)])
    os.utime(path, (1000.0, 1000.0))
    assert d.read(wanted={}).lines == []  # nobody reports it yet
    assert d.read(wanted={("h", 57): 5000.0}).lines == []
    path.write_bytes(line(record("h", 57, 1, comm="0xnew")))  # the new process's plugin truncates it
    assert len(d.read(wanted={("h", 57): 5000.0}).lines) == 1


def test_bytes_without_a_newline_are_charged_too(tmp_path: Path) -> None:
    """64 reported files of 8 MiB without a newline each made one pass read 512 MiB (found by review)."""
    d = DumpDir(str(tmp_path))
    d.read()
    for pid in range(1, 9):
        dump_path(tmp_path, "h", pid).write_bytes(b"x" * (1 << 20))
    reads: list[int] = []
    real = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return real(fd, n, offset)

    tail.os.pread = counting  # type: ignore[attr-defined]
    try:
        got = d.read(budget=64 << 10)
    finally:
        tail.os.pread = real  # type: ignore[attr-defined]
    assert got.lines == [] and got.skipped_bytes == 8 << 20
    assert sum(reads) <= (64 << 10) + 8 * (tail.LINE_COST + 2 * tail.TAIL)


def test_a_file_swapped_for_a_link_between_listing_and_open_is_not_followed(tmp_path: Path) -> None:
    d = DumpDir(str(tmp_path))
    d.read()
    path = append(tmp_path, "h", 1, [record("h", 1, 1)])
    secret = tmp_path / "secret"
    secret.write_bytes(line(record("h", 1, 2)) * 3)
    real_list = tail._list

    def swapped(p: str) -> tuple[list[tuple[str, tail.Process, os.stat_result]], int]:
        listed = real_list(p)
        path.unlink()
        os.symlink(secret, path)
        return listed

    tail._list = swapped  # type: ignore[assignment]
    try:
        assert d.read().lines == []
    finally:
        tail._list = real_list  # type: ignore[assignment]


def test_a_missing_directory_is_an_error_not_an_exception(tmp_path: Path) -> None:
    d = DumpDir(str(tmp_path / "absent"))
    got = d.read()
    assert got.error is not None and "absent" in got.error
    (tmp_path / "absent").mkdir()
    assert d.read().error is None


def test_the_most_recently_written_files_are_read_first_and_the_rest_keep_their_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared directory gathers a file per process ever run: past MAX_FILES, the live ones are read, and a
    stale one read later resumes where it was, never from its start (found by review)."""
    monkeypatch.setattr(tail, "MAX_FILES", 3)
    for pid in range(1, 6):
        path = append(tmp_path, "h", pid, [record("h", pid, n) for n in range(10)])  # history
        os.utime(path, (1000 + pid, 1000 + pid))
    d = DumpDir(str(tmp_path))
    assert d.read().lines == []  # from their end
    live = append(tmp_path, "h", 1, [record("h", 1, 10)])  # the oldest file written to again: newest now
    for pid in (2, 3, 4, 5):
        append(tmp_path, "h", pid, [record("h", pid, 10)])
        os.utime(dump_path(tmp_path, "h", pid), (1000 + pid, 1000 + pid))
    got = d.read()
    assert (got.files, got.unread) == (3, 2)
    assert ("h", 1) in {(h, p) for h, p, _ in got.lines} and len(got.lines) == 3
    os.utime(live, (900, 900))
    for pid in (2, 3):
        os.utime(dump_path(tmp_path, "h", pid), (2000, 2000))
    later = d.read()
    assert len(later.lines) == 2  # the two left: their one new record each, not their history
    for pid in range(1, 6):
        dump_path(tmp_path, "h", pid).unlink()
    assert d.read().files == 0
    assert not d._files  # forgotten with their files


def test_the_budget_bounds_a_pass_over_many_files(tmp_path: Path) -> None:
    d = DumpDir(str(tmp_path))
    d.read()
    for pid in range(1, 11):
        append(tmp_path, "h", pid, [record("h", pid, n) for n in range(10)])
    size = dump_path(tmp_path, "h", 1).stat().st_size
    got = d.read(budget=3 * size)
    total = sum(dump_path(tmp_path, "h", pid).stat().st_size for pid in range(1, 11))
    assert len(got.lines) == 30 and got.skipped_bytes == total - sum(len(x) + 1 for _, _, x in got.lines)


def test_a_flood_of_tiny_lines_costs_what_records_would(tmp_path: Path) -> None:
    """A process may write anything into its dump: 8 MiB of "1\\n" is 4 million lines, which a byte budget
    alone would parse in a pass of tens of seconds and hundreds of MB (found by review)."""
    d = DumpDir(str(tmp_path))
    d.read()
    path = dump_path(tmp_path, "h", 1)
    path.write_bytes(b"1\n" * (4 << 20))
    got = d.read(budget=1 << 20)
    assert len(got.lines) == (1 << 20) // tail.LINE_COST
    assert got.skipped_bytes == path.stat().st_size - 2 * len(got.lines)
    append(tmp_path, "h", 1, [record("h", 1, 1)])  # reading resumes with the next whole line
    assert lines(d) == [line(record("h", 1, 1)).rstrip(b"\n")]


def test_a_file_rewritten_in_place_is_read_from_its_start(tmp_path: Path) -> None:
    """The plugin truncates its file when it opens it: a new process with the same name and pid that writes
    past the old offset between two passes is read from its start, not from the old offset (found by
    review)."""
    d = DumpDir(str(tmp_path))
    d.read()
    path = append(tmp_path, "h", 1, [record("h", 1, n) for n in range(5)])
    assert len(lines(d)) == 5
    path.write_bytes(b"".join(line(record("h", 1, n, comm="0xnew")) for n in range(50)))
    assert len(lines(d)) == 50


def test_a_file_swapped_for_a_fifo_costs_that_file_not_the_pass(tmp_path: Path) -> None:
    path = append(tmp_path, "h", 1, [record("h", 1, 1)])
    append(tmp_path, "h", 2, [record("h", 2, 1)])
    d = DumpDir(str(tmp_path))
    d.read()
    append(tmp_path, "h", 1, [record("h", 1, 2)])
    append(tmp_path, "h", 2, [record("h", 2, 2)])
    real_list = tail._list

    def swapped(p: str) -> tuple[list[tuple[str, tail.Process, os.stat_result]], int]:
        listed = real_list(p)
        path.unlink()
        os.mkfifo(path)
        return listed

    tail._list = swapped  # type: ignore[assignment]
    try:
        got = d.read()
    finally:
        tail._list = real_list  # type: ignore[assignment]
    assert [(h, p) for h, p, _ in got.lines] == [("h", 2)]
