"""The daemon's listening address: parsing, and binding the socket before the server starts."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
from collections.abc import Mapping
from typing import Any

# Set in the ASGI scope of every request that came through the unix socket. "No peer address" must never
# be read as "local": uvicorn also gives a TCP request client=None when getpeername() fails, which a
# client can cause by resetting the connection right after sending its request.
UNIX_SOCKET_SCOPE_KEY = "gpumon.unix_socket"


class ListenError(Exception):
    pass


class MarkUnixSocket:
    """ASGI wrapper for the app as served on the unix socket: its requests say so, positively."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.app({**scope, UNIX_SOCKET_SCOPE_KEY: True}, receive, send)


def via_unix_socket(scope: Mapping[str, Any]) -> bool:
    return scope.get(UNIX_SOCKET_SCOPE_KEY) is True


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (IPv4, IPv6, or IPv4 mapped into IPv6); names are not resolved."""
    if host == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (all IPv4 interfaces) or ``[IPv6]:PORT``."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ListenError(
            f"bad listen address {text!r}: expected HOST:PORT, e.g. 0.0.0.0:9478 or 127.0.0.1:9478"
        )
    if not 0 <= int(port) <= 65535:
        raise ListenError(f"bad listen address {text!r}: port {int(port)} is out of range (0-65535)")
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


def bind_unix(path: str) -> socket.socket:
    """A unix socket for local SDK reports. A stale socket file from a crashed daemon is replaced; anything
    else at the path (a live daemon's socket, a regular file) is an error, not silently removed."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise ListenError(f"cannot listen on unix:{path}: the path exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody answers: left behind by a daemon that did not shut down
        else:
            raise ListenError(f"cannot listen on unix:{path}: another process is serving it")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o666)  # any local training process may report; the token, if set, still applies
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on unix:{path}: {exc.strerror}") from None
    return sock
