"""Who is at the other end of a connection, and whether it is still there.

Over the unix socket, who: the kernel's word (SO_PEERCRED), not the request's.

A report names its own pid; over the unix socket the kernel also says which process connected, so a local
process cannot report as another (docs/reliability.md, "A hostile local process"). TCP gives no such word:
a loopback connection could be any local process, and its requests carry no ``Peer``.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# the ASGI scope keys under which a request carries its connection's Peer (unix socket only) and a callable
# that says whether the connection has closed
PEER_SCOPE_KEY = "gpumon.peer"
GONE_SCOPE_KEY = "gpumon.gone"
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True, slots=True)
class Peer:
    """A connected process as this daemon sees it. ``pid`` is 0 when the sender lives in a pid namespace
    this daemon cannot see (a pod, with the daemon's own pod not on the host's pid namespace): then nothing
    can be checked, and the peer is not ``known``."""

    pid: int  # in this daemon's pid namespace
    uid: int
    start: int | None = None  # /proc/<pid>/stat starttime (clock ticks after boot): tells a reused pid apart
    pids: tuple[int, ...] = ()  # its pid in each nested namespace, outermost first (/proc/<pid>/status NSpid)

    @property
    def known(self) -> bool:
        return self.pid > 0 and self.start is not None

    def same(self, other: Peer | None) -> bool:
        """The same process: one pid, started at one moment."""
        return other is not None and (self.pid, self.start) == (other.pid, other.start)

    def speaks_for(self, pid: int) -> bool:
        """Whether ``pid`` (as a report gives it, in the sender's own namespace) is this process's. A peer
        whose namespaces cannot be read is given the benefit of the doubt."""
        return not self.pids or pid in self.pids

    def alive(self) -> bool:
        """Still running (not exited, not a zombie awaiting its parent), and not a new process on its pid."""
        if not self.known:
            return False
        state, start = _stat(self.pid)
        return start == self.start and state not in (None, "Z", "X")


def peer_of(sock: socket.socket) -> Peer | None:
    """The process connected to a unix socket, or None where the kernel does not say (not AF_UNIX)."""
    if sock.family != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    if pid <= 0:
        return Peer(0, uid)
    _, start = _stat(pid)
    return Peer(pid, uid, start, _nspids(pid))


def _stat(pid: int) -> tuple[str | None, int | None]:
    """The state letter and start time of ``pid`` from /proc; (None, None) once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None, None
    # the command name in parentheses may hold spaces and parentheses itself: the fields follow the last ")"
    fields = text.rpartition(")")[2].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None, None


def _nspids(pid: int) -> tuple[int, ...]:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"NSpid:"):
                    return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


class Tagged:
    """ASGI wrapper for one connection: its requests carry whether their client has gone (``client_gone``),
    and over the unix socket the connection's Peer.

    ``gone`` is held weakly: the connection holds this wrapper, and a strong reference back would make each
    closed connection a reference cycle (protocol, transport, buffers: 2-7 KB), left to the interpreter's
    rare full collections. 1,000 connections opened and closed kept 2.2 MB that way. A connection that no
    longer exists is gone."""

    def __init__(self, app: Any, gone: Callable[[], bool], peer: Peer | None) -> None:
        self.app = app
        method = weakref.WeakMethod(gone)  # type: ignore[arg-type]

        def is_gone() -> bool:
            live = method()
            return live is None or live()

        self.extra: dict[str, Any] = {GONE_SCOPE_KEY: is_gone}
        if peer is not None:
            self.extra[PEER_SCOPE_KEY] = peer

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.app({**scope, **self.extra}, receive, send)


def client_address(host: str) -> str:
    """A client's address as one client: an IPv6 one as its /64 (one host may hold a whole /64, and would
    otherwise count as as many clients as it likes), an IPv4-mapped one as the IPv4 address."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, 64), strict=False))


def peer_in(scope: Mapping[str, Any]) -> Peer | None:
    peer = scope.get(PEER_SCOPE_KEY)
    return peer if isinstance(peer, Peer) else None


class Abandoned(Exception):
    """The client left before its work (a password check, a render, a document) began: not done."""


def client_gone(scope: Mapping[str, Any]) -> bool:
    """Whether the request's connection has closed (or is closing): its answer would go nowhere, so work
    still ahead of it (a password check, a render) is not worth starting. uvicorn does not cancel a request
    whose client left; it only notices once the answer is written."""
    gone = scope.get(GONE_SCOPE_KEY)
    return gone is not None and bool(gone())
