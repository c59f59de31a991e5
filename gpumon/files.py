"""Reading a file an operator names (the config, the web config and its certificates, the baseline
library): regular files only, opened without blocking, and no larger than a cap.

A FIFO or a device in the file's place (``--config /dev/zero``, ``cert_file: /dev/zero``) would otherwise hang
the reader or fill memory before any parser could object; each caller turns ``NotAFile`` into its own
one-line error naming the file.
"""

from __future__ import annotations

import os
import stat

MiB = 1 << 20


class NotAFile(ValueError):
    """The path is not a regular file of a sensible size; the message says what it is instead."""


def read_bounded(path: str, limit: int) -> bytes:
    """The file's bytes. Raises OSError as opening or reading does (FileNotFoundError included), and
    NotAFile for a directory, a device, a pipe, a socket, or a file over ``limit`` bytes."""
    # non-blocking: opening a FIFO for reading would otherwise wait for a writer
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise NotAFile("is a directory")
        if not stat.S_ISREG(mode):
            raise NotAFile("is not a regular file (a device, pipe or socket)")
        chunks, size = [], 0
        while chunk := os.read(fd, MiB):
            size += len(chunk)
            if size > limit:
                raise NotAFile(f"is larger than {_size(limit)}")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str, limit: int) -> str:
    """``read_bounded``, decoded as UTF-8; a file that is not UTF-8 text is NotAFile too."""
    try:
        return read_bounded(path, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise NotAFile("is not UTF-8 text") from None


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n} bytes"
