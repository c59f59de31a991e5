"""The daemon's listening address: parsing, and binding the socket before the server starts."""

from __future__ import annotations

import errno
import socket


class ListenError(Exception):
    pass


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all IPv4 interfaces) or ``[IPv6]:PORT``."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ListenError(
            f"bad listen address {text!r}: expected HOST:PORT, e.g. 0.0.0.0:9478 or 127.0.0.1:9478"
        )
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def bind(listen: str) -> socket.socket:
    """Bind the listening socket ourselves, so that a busy port is a clear message, and port 0 works."""
    host, port = parse_listen(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {listen}: {exc.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    # proto must be IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on such sockets, and without it every
    # small response waits ~40 ms for a delayed ACK (Nagle)
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        hint = (
            " (is another gpumon running? choose another with --listen)"
            if exc.errno == errno.EADDRINUSE
            else ""
        )
        raise ListenError(f"cannot listen on {listen}: {exc.strerror}{hint}") from None
    return sock
