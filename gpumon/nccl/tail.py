"""The Inspector's dump directory, read incrementally: each pass reads what the files gained since the last.

The plugin names a process's file ``<hostname>-pid<pid>.log`` and appends to it for the process's life
(200-500 bytes per operation and communicator: hundreds of MB over a long job). A pass stats the directory,
opens only files that changed, and reads from where it left off:

- a file present at the first pass is read from its end: its past is a job's history before this daemon,
  and reading a 500 MB file whole would stall every other pass;
- a file that shrank, or whose inode changed, was truncated or replaced: read from its start;
- a file that gained more than MAX_BACKLOG since the last pass is skipped to its end (counted), so one
  process that writes faster than a pass can parse never delays the others: the records read stay a sample;
- a line longer than records.MAX_LINE is dropped up to its newline; a last line without its newline is kept
  (up to MAX_LINE) until the rest arrives;
- symbolic links, FIFOs and devices are never opened: the directory is writable by every training process.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field

from gpumon.nccl.records import MAX_LINE

NAME = re.compile(r"(?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,254})-pid(?P<pid>[1-9][0-9]{0,9})\.log")
MAX_FILES = 1024  # files followed at once; more are left unread (counted)
MAX_BACKLOG = 8 << 20  # bytes a file may gain between two passes and still be read in full
CHUNK = 1 << 20


@dataclass
class _File:
    inode: tuple[int, int]
    offset: int
    partial: bytes = b""
    skipping: bool = False  # inside an over-long line or after a skip: drop up to the next newline


@dataclass
class Pass:
    """What one pass found."""

    lines: list[tuple[str, int, bytes]] = field(default_factory=list)  # (hostname, pid, line) per whole line
    skipped_bytes: int = 0  # backlogs jumped over, over-long lines dropped
    files: int = 0  # files followed
    ignored: int = 0  # files over MAX_FILES, or not regular files
    error: str | None = None  # the directory could not be listed


class DumpDir:
    def __init__(self, path: str) -> None:
        self.path = path
        self._files: dict[str, _File] = {}
        self._first = True
        self._turn = -1

    def read(self, budget: int = 64 << 20) -> Pass:
        """One pass: the whole lines every file gained, at most ``budget`` bytes over all files."""
        out = Pass()
        try:
            entries = _list(self.path)
        except OSError as exc:
            out.error = f"{self.path}: {exc.strerror or exc}"
            return out
        first, self._first = self._first, False
        seen: set[str] = set()
        # a pass whose budget runs out skips the files after it: start each pass one file further on
        self._turn = (self._turn + 1) % max(1, len(entries))
        for name, st in entries[self._turn :] + entries[: self._turn]:
            if not stat.S_ISREG(st.st_mode):
                out.ignored += 1
                continue
            if len(seen) >= MAX_FILES:
                out.ignored += 1
                continue
            seen.add(name)
            inode = (st.st_dev, st.st_ino)
            f = self._files.get(name)
            if f is None and first:  # from its end, and from the next whole line
                f = self._files[name] = _File(inode, st.st_size, skipping=not self._whole(name, st.st_size))
            elif f is None or f.inode != inode or st.st_size < f.offset:
                f = self._files[name] = _File(inode, 0)
            if st.st_size == f.offset:
                continue
            if st.st_size - f.offset > MAX_BACKLOG or budget <= 0:
                out.skipped_bytes += st.st_size - f.offset + len(f.partial)
                f.offset, f.partial = st.st_size, b""
                f.skipping = not self._whole(name, st.st_size)
                continue
            budget -= self._read(name, f, st.st_size, out)
        for name in set(self._files) - seen:  # gone: a finished job's file removed
            del self._files[name]
        out.files = len(seen)
        return out

    def _whole(self, name: str, size: int) -> bool:
        """Whether the file ends with a whole line (or is empty)."""
        if size == 0:
            return True
        fd = _open(os.path.join(self.path, name))
        if fd is None:
            return True
        try:
            return os.pread(fd, 1, size - 1) in (b"\n", b"")
        finally:
            os.close(fd)

    def _read(self, name: str, f: _File, size: int, out: Pass) -> int:
        m = NAME.fullmatch(name)
        assert m is not None
        host, pid = m["host"], int(m["pid"])
        fd = _open(os.path.join(self.path, name))
        if fd is None:
            return 0
        got = 0
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != f.inode:
                return 0  # swapped between the listing and the open: next pass
            while f.offset < size:
                data = os.pread(fd, min(CHUNK, size - f.offset), f.offset)
                if not data:
                    break
                f.offset += len(data)
                got += len(data)
                _split(f, data, host, pid, out)
        finally:
            os.close(fd)
        return got


def _split(f: _File, data: bytes, host: str, pid: int, out: Pass) -> None:
    start = 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            rest = data[start:]
            if f.skipping:
                out.skipped_bytes += len(rest)
            elif len(f.partial) + len(rest) > MAX_LINE:
                out.skipped_bytes += len(f.partial) + len(rest)
                f.partial, f.skipping = b"", True
            else:
                f.partial += rest
            return
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


def _list(path: str) -> list[tuple[str, os.stat_result]]:
    """The dump files by name, with their lstat (a link is reported as a link, never followed)."""
    out = []
    with os.scandir(path) as it:
        for entry in it:
            if NAME.fullmatch(entry.name):
                try:
                    out.append((entry.name, entry.stat(follow_symlinks=False)))
                except OSError:  # removed between the listing and the stat
                    continue
    out.sort()
    return out
