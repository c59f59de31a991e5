"""The Inspector's dump directory, read incrementally: each pass reads what the files gained since the last.

The plugin names a process's file ``<hostname>-pid<pid>.log`` and appends to it for the process's life
(200-500 bytes per operation and communicator: hundreds of MB over a long job); it never deletes one, so a
shared directory gathers a file per process ever run. A pass lists the directory and reads only the files of
the processes ``wanted`` (the ranks reporting to this daemon), from where it left off:

- a file present at the first pass is read from its end: its past is a job's history before this daemon,
  and reading a 500 MB file whole would stall every other pass. A file that appears later is read from its
  start once its process is wanted, unless it was last written before that process started (an earlier
  process's of the same name and pid): then from its end;
- a file that shrank, whose inode changed, or whose bytes before the offset read differ from what was read
  (truncated and rewritten within a pass) is read from its start;
- a file that gained more than MAX_BACKLOG since the last pass is skipped to its end (counted), and a pass
  reads at most its budget, every byte charged and each line at least LINE_COST bytes (a flood of tiny
  lines costs as much as records), skipping the rest of the files it reaches after that: the records read
  stay a sample;
- a line longer than records.MAX_LINE is dropped up to its newline; a last line without its newline is kept
  (up to MAX_LINE) until the rest arrives;
- symbolic links, FIFOs and devices are never opened: the directory is writable by every training process.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpumon.nccl.records import MAX_LINE

NAME = re.compile(r"(?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,254})-pid(?P<pid>[1-9][0-9]{0,9})\.log")
MAX_LISTED = 65536  # dump files looked at per pass; a directory with more is cut (counted)
MAX_FILES = 1024  # wanted files read per pass, the most recently written first
MAX_BACKLOG = 8 << 20  # bytes a file may gain between two passes and still be read in full
LINE_COST = 256  # bytes of budget a line costs at least
CHUNK = 1 << 20
START_SLACK = 5.0  # seconds between a process's start and its file's times
TAIL = 32  # bytes before the offset kept, to tell a file rewritten in place from one appended to

Process = tuple[str, int]


@dataclass
class _File:
    inode: tuple[int, int]
    offset: int
    partial: bytes = b""
    skipping: bool = False  # inside an over-long line or after a skip: drop up to the next newline
    tail: bytes = b""  # the last bytes before offset, as read
    check_end: bool = False  # started at the end of a file: where that end falls is found at its first read


@dataclass
class Pass:
    """What one pass found."""

    lines: list[tuple[str, int, bytes]] = field(default_factory=list)  # (hostname, pid, line) per whole line
    skipped_bytes: int = 0  # backlogs jumped over, budget exhausted, over-long lines dropped
    files: int = 0  # files read (or up to date) this pass
    unread: int = 0  # wanted files left for a later pass (over MAX_FILES), and names over MAX_LISTED
    listed: int = 0  # dump files in the directory (at most MAX_LISTED)
    error: str | None = None  # the directory could not be listed


class DumpDir:
    def __init__(self, path: str) -> None:
        self.path = path
        self._files: dict[str, _File] = {}
        self.first = True  # no pass listed the directory yet
        self._turn = -1

    def read(self, wanted: Mapping[Process, float | None] | None = None, budget: int = 64 << 20) -> Pass:
        """One pass: the whole lines the files of ``wanted`` processes (each with its start, unix seconds,
        where known; None: every file) gained, within ``budget`` bytes."""
        out = Pass()
        try:
            entries, out.unread = _list(self.path)
        except OSError as exc:
            out.error = f"{self.path}: {exc.strerror or exc}"
            return out
        first, self.first = self.first, False
        listed = {name for name, _, _ in entries}
        out.listed = len(listed)
        for name in set(self._files) - listed:  # gone: a finished job's file removed
            del self._files[name]
        due = []
        for name, process, st in entries:
            f = self._files.get(name)
            if f is None and first:
                f = self._files[name] = _File((st.st_dev, st.st_ino), st.st_size, check_end=st.st_size > 0)
            if wanted is not None and process not in wanted:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            due.append((st.st_mtime, name, process, st))
        due.sort(reverse=True)  # the most recently written first: live processes before stale files
        out.unread += max(0, len(due) - MAX_FILES)
        due = due[:MAX_FILES]
        # a pass whose budget runs out skips the files after it: start each pass one file further on
        self._turn = (self._turn + 1) % max(1, len(due))
        for _, name, process, st in due[self._turn :] + due[: self._turn]:
            f = self._files.get(name)
            inode = (st.st_dev, st.st_ino)
            started = None if wanted is None else wanted.get(process)
            if f is None and started is not None and st.st_mtime < started - START_SLACK and st.st_size:
                # last written before its process started: an earlier process's of that name (the plugin
                # truncates the file when the new one opens it, and reading starts afresh then)
                f = self._files[name] = _File(inode, st.st_size, check_end=True)
            elif f is None or f.inode != inode or st.st_size < f.offset:
                f = self._files[name] = _File(inode, 0)
            out.files += 1
            if st.st_size == f.offset:
                continue
            try:
                budget = self._read(name, process, f, st.st_size, budget, out)
            except OSError:  # swapped, removed or unreadable mid-read: this file waits for the next pass
                continue
        return out

    def _read(self, name: str, process: Process, f: _File, size: int, budget: int, out: Pass) -> int:
        fd = _open(os.path.join(self.path, name))
        if fd is None:
            return budget
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != f.inode:
                return budget  # swapped between the listing and the open: next pass
            size = st.st_size
            if f.check_end:
                f.check_end = False
                _resume(fd, f)
            elif f.tail and os.pread(fd, len(f.tail), f.offset - len(f.tail)) != f.tail:
                f.offset, f.partial, f.skipping, f.tail = 0, b"", False, b""  # rewritten in place
            if size - f.offset > MAX_BACKLOG or budget <= 0:
                _skip(fd, f, size, out)
                return budget
            while f.offset < size:
                # never more than the budget left (and a line's worth): what is read is charged
                data = os.pread(fd, min(CHUNK, size - f.offset, max(budget, LINE_COST)), f.offset)
                if not data:
                    break
                used, budget = _split(f, data, process, budget, out)
                f.offset += used
                f.tail = (f.tail + data[max(0, used - TAIL) : used])[-TAIL:]
                if used < len(data):  # the budget ran out inside this chunk
                    _skip(fd, f, size, out)
                    break
        finally:
            os.close(fd)
        return budget


def _skip(fd: int, f: _File, size: int, out: Pass) -> None:
    """Jump to the end of the file, counting what is left unread; reading resumes at the next whole line."""
    out.skipped_bytes += size - f.offset + len(f.partial)
    f.offset, f.partial = size, b""
    _resume(fd, f)


def _resume(fd: int, f: _File) -> None:
    """Reading starts at ``f.offset``, not where the last read ended: keep the bytes before it, and skip to
    the next whole line where it falls inside one."""
    f.tail = os.pread(fd, TAIL, max(0, f.offset - TAIL)) if f.offset else b""
    f.skipping = bool(f.tail) and not f.tail.endswith(b"\n")


def _split(f: _File, data: bytes, process: Process, budget: int, out: Pass) -> tuple[int, int]:
    """The whole lines of ``data`` into ``out`` while ``budget`` lasts: (bytes consumed, budget left). Every
    byte consumed is charged, a line at least LINE_COST."""
    host, pid = process
    start = 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            rest = data[start:]
            if budget < len(rest):
                return start, budget
            budget -= len(rest)
            if f.skipping:
                out.skipped_bytes += len(rest)
            elif len(f.partial) + len(rest) > MAX_LINE:
                out.skipped_bytes += len(f.partial) + len(rest)
                f.partial, f.skipping = b"", True
            else:
                f.partial += rest
            return len(data), budget
        cost = max(LINE_COST, end + 1 - start)
        if budget < cost:
            return start, budget
        budget -= cost
        piece = data[start:end]
        if f.skipping:
            out.skipped_bytes += len(piece) + 1
            f.skipping = False
        else:
            line = f.partial + piece if f.partial else piece
            f.partial = b""
            if len(line) > MAX_LINE:
                out.skipped_bytes += len(line) + 1
            elif line.strip():
                out.lines.append((host, pid, line))
        start = end + 1


def _open(path: str) -> int | None:
    """A descriptor of the file, never through a link nor blocking on a FIFO; None when it is gone or
    unreadable (the next pass tries again)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.EACCES, errno.ENXIO, errno.EPERM):
            return None
        raise


def _list(path: str) -> tuple[list[tuple[str, Process, os.stat_result]], int]:
    """The dump files (at most MAX_LISTED) with their process and lstat (a link is reported as a link, never
    followed), and how many more there were."""
    out: list[tuple[str, Process, os.stat_result]] = []
    more = 0
    with os.scandir(path) as it:
        for entry in it:
            m = NAME.fullmatch(entry.name)
            if m is None:
                continue
            if len(out) >= MAX_LISTED:
                more += 1
                continue
            try:
                out.append((entry.name, (m["host"], int(m["pid"])), entry.stat(follow_symlinks=False)))
            except OSError:  # removed between the listing and the stat
                continue
    return out, more
