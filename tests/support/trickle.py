"""A server that answers one request a byte at a time: the client's deadline must end the exchange."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def trickling(
    scheme: str, where: Path, reply: bytes, every: float, tls: ssl.SSLContext | None = None
) -> Iterator[str]:
    """Serve one connection at the URL yielded (``scheme``: http, https or unix, the socket in ``where``):
    read the request, then send ``reply`` one byte every ``every`` seconds until done or the block ends."""
    if scheme == "unix":
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(where / "trickle.sock"))
        url = f"unix://{where / 'trickle.sock'}"
    else:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        url = f"{scheme}://localhost:{listener.getsockname()[1]}"
    listener.listen(1)
    stop = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with tls.wrap_socket(conn, server_side=True) if tls is not None else conn as c:
                c.recv(65536)
                for byte in reply:
                    if stop.wait(every):
                        return
                    c.sendall(bytes([byte]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield url
    finally:
        stop.set()
        listener.close()
        thread.join(10)
