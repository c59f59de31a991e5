"""What gpumon/web/connections.py takes from uvicorn beyond its public API, held to account on the uvicorn
installed (pyproject pins it below the next minor version; a bump runs this first).

The connection gate subclasses uvicorn's protocol classes: it overrides their asyncio callbacks, reads the
request in flight (``cycle``) and, for httptools, the queue of pipelined requests (``pipeline``) and the
hook that starts a request (``_start_asgi_task``), and replaces ``app`` per connection. Each is checked to
exist, and the limits built on them are checked on an in-process protocol fed by hand, so a rename upstream
fails here rather than silently undoing a defence.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gpumon.web.connections import MAX_HEAD_BYTES, MAX_PIPELINED, Gate, Limits, guarded

ROOT = Path(__file__).resolve().parents[2]
PROTOCOLS = [HttpToolsProtocol, H11Protocol]
# overridden, and called through super()
CALLBACKS = ("connection_made", "connection_lost", "data_received", "on_response_complete", "pause_writing",
             "resume_writing", "send_400_response", "_unsupported_upgrade_warning")  # fmt: skip


def test_the_pin_covers_the_installed_uvicorn() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'"uvicorn>=([\d.]+),<([\d.]+)"', text)
    assert m, "uvicorn needs an upper pin: its internals are used (this file)"
    low, high = (tuple(int(x) for x in v.split(".")) for v in m.groups())
    installed = tuple(int(x) for x in importlib.metadata.version("uvicorn").split(".")[:2])
    assert low[:2] <= installed < high[:2], (installed, low, high)


@pytest.mark.parametrize("cls", PROTOCOLS, ids=lambda c: c.__name__)
def test_the_hooks_the_gate_uses_exist(cls: type) -> None:
    for name in CALLBACKS:
        assert callable(getattr(cls, name, None)), f"{cls.__name__}.{name} is gone"
    if cls is HttpToolsProtocol:
        assert callable(getattr(cls, "_start_asgi_task", None))


class Transport(asyncio.Transport):
    """What a protocol writes, and whether it was closed or aborted."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = self.aborted = self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 9478)}.get(name, default)

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def _never_answers(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.Event().wait()


def _connection(cls: type, limits: Limits | None = None) -> tuple[Any, Transport, Gate]:
    config = uvicorn.Config(_never_answers, log_config=None, lifespan="off", ws="none")
    config.load()
    gate = Gate(limits or Limits())
    proto = guarded(cls, gate)(config=config, server_state=ServerState(), app_state={})  # type: ignore[call-arg]
    transport = Transport()
    proto.connection_made(transport)
    return proto, transport, gate


@pytest.mark.parametrize("cls", PROTOCOLS, ids=lambda c: c.__name__)
def test_an_endless_head_behind_a_request_being_answered_is_cut_at_the_limit(cls: type) -> None:
    async def scenario() -> None:
        proto, transport, gate = _connection(cls)
        proto.data_received(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /")
        assert not proto.idle(), "the first request is being answered"
        fed = 0
        while not transport.is_closing() and fed < 16 * MAX_HEAD_BYTES:
            proto.data_received(b"a" * 4096)
            fed += 4096
        assert transport.aborted and MAX_HEAD_BYTES <= fed <= MAX_HEAD_BYTES + 8192, fed
        assert gate.closed["header_too_large"] == 1
        assert transport.written == b"", "no 431 in the middle of an answer"
        proto.connection_lost(None)

    asyncio.run(scenario())


def test_a_pipeline_deeper_than_the_limit_is_closed() -> None:
    async def scenario() -> None:
        proto, transport, gate = _connection(HttpToolsProtocol)
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        proto.data_received(request * (MAX_PIPELINED + 1))  # one answered, MAX_PIPELINED queued
        assert not transport.is_closing() and len(proto.pipeline) == MAX_PIPELINED
        proto.data_received(request)
        assert transport.aborted and gate.closed["pipeline"] == 1
        proto.connection_lost(None)

    asyncio.run(scenario())


@pytest.mark.parametrize("cls", PROTOCOLS, ids=lambda c: c.__name__)
def test_an_answer_nobody_reads_is_cut_at_the_request_deadline(cls: type) -> None:
    async def scenario() -> None:
        proto, transport, gate = _connection(cls, Limits(request_timeout=0.2))
        proto.data_received(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        proto.pause_writing()  # what asyncio calls once the socket's buffers are full
        await asyncio.sleep(0.4)
        assert transport.aborted and gate.closed["write_timeout"] == 1
        proto.connection_lost(None)

    asyncio.run(scenario())
