"""Heavy JSON documents (GET /v1/jobs?detail=true, /v1/jobs/{job}) as a shared read, like /metrics.

Each such document was built on a worker thread of its own per request: sixteen clients looping on a
256-rank job list (1.15 MB, ~100 ms each) kept sixteen threads in the interpreter, and the sampler's GPU
workers, starved of the interpreter lock, missed their deadlines: healthy GPUs were reported down. Here a
document is built by one thread at a time, and reused by every client that asks while nothing it reads has
changed (the GPU snapshot, the training state) and it is younger than the sample interval; a client that
left while it waited its turn gets nothing built.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response

from gpumon.web.peer import Abandoned, client_gone

MAX_DOCUMENTS = 64  # kept at once (one per job, and the lists): a flood of made-up job names cannot grow it


@dataclass(frozen=True)
class Document:
    status: int
    body: bytes
    state: tuple[Hashable, ...]
    started: float  # monotonic time its build began reading the state


class SharedDocuments:
    """Owned by one app; ``get`` is called from the event loop."""

    def __init__(
        self,
        state: Callable[[], tuple[Hashable, ...]],
        *,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state = state
        self._max_age = max_age
        self._clock = clock
        self._lock = asyncio.Lock()  # one build at a time, whatever the key
        self._docs: dict[Hashable, Document] = {}
        self.built = 0  # for tests

    async def get(
        self, key: Hashable, build: Callable[[], tuple[int, bytes]], gone: Callable[[], bool] = lambda: False
    ) -> tuple[int, bytes]:
        """The document for ``key``: ``build()`` (status, body) run on a thread, or a recent one reused. A
        client never gets a document begun before it arrived unless nothing has changed since."""
        arrived = self._clock()
        async with self._lock:
            doc = self._docs.get(key)
            if doc is not None and (doc.started > arrived or self._fresh(doc)):
                return doc.status, doc.body
            if gone():
                raise Abandoned()
            started, state = self._clock(), self._state()
            status, body = await asyncio.to_thread(build)
            self.built += 1
            if len(self._docs) >= MAX_DOCUMENTS:
                self._docs.clear()
            self._docs[key] = Document(status, body, state, started)
            return status, body

    async def answer(
        self, scope: Mapping[str, Any], key: Hashable, build: Callable[[], tuple[int, bytes]]
    ) -> Response:
        """``get`` as a JSON response for the request of ``scope``; 499 (written to nobody) if it left."""
        try:
            status, body = await self.get(key, build, lambda: client_gone(scope))
        except Abandoned:
            return Response(status_code=499)  # uvicorn drops it
        return Response(body, status_code=status, media_type="application/json")

    def _fresh(self, doc: Document) -> bool:
        return doc.state == self._state() and self._clock() - doc.started < self._max_age
