"""HTTP for training telemetry: POST /v1/report (the SDK), GET /v1/jobs and /v1/jobs/{job} (people, tools).

Ingest is for processes on this node: by default only loopback clients and the unix socket may report
(403 otherwise), and with a token configured every report must carry it (401 otherwise). Bodies are
bounded before they are read whole, so a client cannot make the daemon buffer more than MAX_BODY_BYTES.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from gpumon.baselines.history import JobHistory
from gpumon.baselines.jobfigures import against, baseline_json
from gpumon.baselines.watch import LibraryWatch
from gpumon.client import protocol as P
from gpumon.jobs import report as reports
from gpumon.jobs.analysis import Analysis
from gpumon.jobs.collector import IngestStats
from gpumon.jobs.jobjson import job_json
from gpumon.jobs.physics import check_start
from gpumon.jobs.store import Conflict, Impostor, LimitExceeded, Stale
from gpumon.web.listen import is_loopback, via_unix_socket
from gpumon.web.peer import peer_in
from gpumon.web.shared import SharedDocuments


class Reason(BaseModel):
    """Every 4xx and 503 answer: why. A string, or FastAPI's list of validation errors for a bad parameter."""

    detail: str | list[Any]


NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Reason, "description": "No such job on this node"}
}
BAD_PARAMETER: dict[int | str, dict[str, Any]] = {
    422: {"model": Reason, "description": "A parameter is invalid"}
}


@dataclass(frozen=True)
class IngestPolicy:
    token: str | None = None
    allow_remote: bool = False


def is_local(scope: Scope) -> bool:
    """The unix socket, or a loopback peer. A TCP request without a peer address is not local."""
    if via_unix_socket(scope):
        return True
    client: Sequence[Any] | None = scope.get("client")
    if not client or not client[0]:
        return False
    return is_loopback(str(client[0])) and client[0] != "localhost"  # a peer address, never a name


class Ingest:
    """POST /v1/report as a pure ASGI middleware in front of the web framework.

    Reports are the one request that arrives thousands of times a second on a busy node; routing them
    through FastAPI's request and dependency machinery cost about as much as validating and storing them
    (docs/performance.md), so they are answered here and everything else passes through.
    """

    def __init__(
        self,
        app: ASGIApp,
        analysis: Analysis,
        stats: IngestStats,
        policy: IngestPolicy,
        boot: float | None = None,
    ) -> None:
        """``boot``: when this node booted (unix seconds), before which no local report can speak of."""
        self.app = app
        self.analysis = analysis
        self.stats = stats
        self.policy = policy
        self.boot = boot
        self.expected = None if policy.token is None else f"Bearer {policy.token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != P.PATH:
            await self.app(scope, receive, send)
            return
        outcome = await self._handle(scope, receive)
        if outcome is None:  # the sender died mid-body (a rank killed while reporting): nobody to answer,
            return  # nothing to count; its totals arrive whole with the rank's next incarnation
        status, detail = outcome
        headers = [(b"content-type", b"application/json")]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if status == 405:
            headers.append((b"allow", b"POST"))
        if status == 408:  # the rest of a stalled body may still come: the connection is not reusable
            headers.append((b"connection", b"close"))
        body = b"" if status == 204 else json.dumps({"detail": detail}).encode()
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _refuse(self, outcome: str, status: int, detail: str) -> tuple[int, str]:
        self.stats.count(outcome)
        return status, detail

    async def _handle(self, scope: Scope, receive: Receive) -> tuple[int, str] | None:
        if scope["method"] != "POST":
            return self._refuse("invalid", 405, f"{P.PATH} takes POST")
        local = is_local(scope)
        if not self.policy.allow_remote and not local:
            return self._refuse(
                "forbidden",
                403,
                "reports are accepted from this node only (loopback or the unix socket); start gpumon with "
                "--ingest-allow-remote to change that",
            )
        headers = dict(scope["headers"])
        if self.expected is not None and not hmac.compare_digest(
            headers.get(b"authorization", b""), self.expected
        ):
            return self._refuse("unauthorized", 401, "missing or wrong bearer token (GPUMON_INGEST_TOKEN)")
        try:
            body = await _within(_body(headers.get(b"content-length"), receive), BODY_TIMEOUT)
        except asyncio.TimeoutError:
            return self._refuse("timeout", 408, f"the report's body did not arrive within {BODY_TIMEOUT:g} s")
        if isinstance(body, _Gone):
            return None
        if body is None:
            return self._refuse("too_large", 413, f"report larger than {P.MAX_BODY_BYTES} bytes")
        try:
            data = _DECODER.decode(body.decode("utf-8"))
        except DuplicateKey as exc:
            return self._refuse("invalid", 422, str(exc))
        except RecursionError:
            return self._refuse("invalid", 400, "the body nests JSON deeper than any report (3 levels)")
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError: RFC 8259 JSON is UTF-8
            return self._refuse("invalid", 400, f"the body is not JSON: {exc}")
        try:
            report = reports.parse(data)
        except reports.InvalidReport as exc:
            return self._refuse("invalid", 422, str(exc))
        peer = peer_in(scope)
        if peer is not None and not peer.speaks_for(report.pid):
            return self._refuse(
                "forbidden",
                403,
                f"pid: the report says {report.pid}, and the kernel says its sender is pid {peer.pid}; a "
                "process reports for itself",
            )
        try:
            if local and self.boot is not None:
                check_start(report, self.boot)
            self.analysis.store.ingest(report, time.time(), peer)
        except Stale:
            self.stats.count("duplicate")
            return 204, ""
        except LimitExceeded as exc:
            return self._refuse(exc.outcome, 429, str(exc))
        except Conflict as exc:
            return self._refuse("conflict", 409, str(exc))
        except Impostor as exc:
            return self._refuse("forbidden", 403, str(exc))
        except ValueError as exc:
            return self._refuse("invalid", 422, str(exc))
        self.stats.count("accepted")
        return 204, ""


class DuplicateKey(ValueError):
    """A JSON object names one key twice: json.loads would keep the last silently."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # the slow way only to name the key
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(
                    f"{reports.show(key)} appears twice in one JSON object; give each field once"
                )
            seen.add(key)
    return obj


# Refuses duplicate keys, which json.loads resolves by keeping the last one: {"rank": 0, ..., "rank": 3}
# must not be read as rank 3 without a word, any more than an unknown field is dropped without one.
# The hook costs ~3 us a report (~5 % of decoding and validating it).
_DECODER = json.JSONDecoder(object_pairs_hook=_unique)


class _Gone:
    """The client went away before its report's body had arrived. A value, not an exception: raised out of
    a body being awaited under a deadline, an exception's traceback ties it to the waiting frames and their
    task, a reference cycle for every rank killed mid-report, kept until the interpreter's next full
    collection (3 KB each)."""


GONE = _Gone()


async def _within(body: Awaitable[bytes | _Gone | None], seconds: float) -> bytes | _Gone | None:
    """``body`` under a deadline, in this task (``asyncio.timeout``); 3.10 has only ``wait_for``, whose task
    per call leaves a reference cycle when its deadline passes."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await body
    return await asyncio.wait_for(body, seconds)


# A report is under 2 KB, sent at once by a process on this node (the SDK itself gives up after 2 s): a body
# that trickles in slower than this is a stalled or hostile client holding a connection open
BODY_TIMEOUT = 5.0


async def _body(length: bytes | None, receive: Receive) -> bytes | _Gone | None:
    """The body, or None once it passes the limit (read no further), or GONE."""
    if length is not None and length.isdigit() and int(length) > P.MAX_BODY_BYTES:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return GONE
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > P.MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def router(
    analysis: Analysis,
    library: LibraryWatch | None = None,
    history: JobHistory | None = None,
    docs: SharedDocuments | None = None,
) -> APIRouter:
    """GET /v1/jobs, /v1/jobs/{job}, /v1/history/{job} and /v1/baselines. ``docs``: where the job documents
    are built, one at a time and shared (web/shared.py); without it each request builds its own."""
    api = APIRouter()

    async def shared(request: Request, key: Hashable, build: Callable[[], tuple[int, bytes]]) -> Response:
        if docs is not None:
            return await docs.answer(request.scope, key, build)
        status, body = await asyncio.to_thread(build)
        return Response(body, status_code=status, media_type="application/json")

    def _json(doc: object, status: int = 200) -> tuple[int, bytes]:
        return status, bytes(JSONResponse(doc).body)

    @api.get(
        "/v1/jobs",
        summary="Jobs reporting to this node: rates, MFU, verdict (detail=true: each job's full document)",
        response_class=JSONResponse,
    )
    async def jobs(request: Request, detail: bool = False) -> Response:
        def build() -> tuple[int, bytes]:
            out = []
            for j in analysis.jobs():
                entry: dict[str, Any] = {
                    "job": j.job,
                    "ranks_on_node": len(j.ranks),
                    "tokens_per_second": j.tokens_per_second,
                    "mfu": j.mfu,
                    "bottleneck": j.verdict.bottleneck,
                    "summary": j.verdict.summary,
                }
                if detail:  # what /v1/jobs/{job} answers, for every job in one request (the node page)
                    entry["detail"] = _job_document(j)
                out.append(entry)
            return _json({"window_seconds": analysis.window, "jobs": out})

        return await shared(request, ("jobs", detail), build)

    def _job_document(found: Any) -> dict[str, Any]:
        doc = job_json(found, analysis.window)
        if library is not None:
            doc["baseline"] = baseline_json(against(found, library.library()))
        return doc

    @api.get(
        "/v1/jobs/{job:path}",
        summary="One job: every rank's figures, its GPUs, the diagnosis and evidence",
        responses=NOT_FOUND,
        response_class=JSONResponse,
    )
    async def job(request: Request, job: str) -> Response:
        def build() -> tuple[int, bytes]:
            found = analysis.jobs(only=job)
            if found:
                return _json(_job_document(found[0]))
            why = f"no job {reports.show(job)} reports to this node (GET /v1/jobs lists those that do)"
            return _json({"detail": why}, 404)

        return await shared(request, ("job", job), build)

    if history is not None:

        @api.get(
            "/v1/history/{job:path}",
            summary="A job's samples every 10 s over the last hour (for gpumon baseline record)",
            responses={**NOT_FOUND, **BAD_PARAMETER},
        )
        def job_history(job: str, window: float | None = None) -> Response:
            if window is not None and not window > 0:
                return JSONResponse({"detail": "window must be a positive number of seconds"}, 422)
            doc = history.json(job, window)
            if doc is None:
                why = f"no history for job {reports.show(job)} on this node (GET /v1/jobs lists the jobs)"
                return JSONResponse({"detail": why}, status_code=404)
            return JSONResponse(doc)

    if library is not None:

        @api.get("/v1/baselines", summary="The baseline library as the daemon last read it")
        def baselines() -> Response:
            lib = library.library()
            return JSONResponse(
                {
                    "path": library.path,
                    "ok": library.ok,
                    "error": library.error,
                    "baselines": [b.to_dict() for b in lib.baselines],
                }
            )

    return api
