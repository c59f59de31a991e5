"""A plain-text answer written straight to ASGI, for middleware that refuses before the app runs."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.types import Send


async def plain(send: Send, status: int, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = (detail + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
