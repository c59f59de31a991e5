"""HTTP: /metrics, /healthz, /readyz, /v1/gpus, /v1/report, /v1/jobs, /v1/history, /v1/baselines, the node
page at / (gpumon/web/page.py); one uvicorn worker."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Hashable

import psutil
from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder

from gpumon import __version__
from gpumon.gpu.collector import SnapshotCollector
from gpumon.gpu.compat_dcgm import DcgmCompatCollector
from gpumon.gpu.snapshot import Snapshot, snapshot_json
from gpumon.jobs.api import Ingest, Reason
from gpumon.jobs.api import router as training_router
from gpumon.jobs.service import Training
from gpumon.web import page
from gpumon.web.connections import Gate
from gpumon.web.guard import Access, Guard
from gpumon.web.peer import Abandoned, client_gone
from gpumon.web.scrape import BUSY, Format, ScrapeCache, Selections, SelectionsBusy, TooManyNames
from gpumon.web.shared import SharedDocuments

TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
_ESCAPING = re.compile(r"escaping=([\w-]+)")


def build_registry(
    source: Callable[[], Snapshot | None],
    *,
    owner_labels: bool = False,
    compat: str | None = None,
    training: Training | None = None,
    node: str | None = None,
    connections: Gate | None = None,
    details: frozenset[str] = frozenset(),
    compat_host_label: str = "Hostname",
    counter_hold: float = 60.0,
) -> CollectorRegistry:
    """``counter_hold``: --counter-hold, for the GPU flow's rare counters (the training flow has its own)."""
    registry = CollectorRegistry()
    registry.register(
        SnapshotCollector(
            source, owner_labels=owner_labels, node=node, details=details, counter_hold=counter_hold
        )
    )
    if connections is not None:
        registry.register(connections)
    if training is not None:
        registry.register(training.collector(details))
    if compat == "dcgm":  # dcgm-exporter's names beside ours, for dashboards built on them
        registry.register(DcgmCompatCollector(source, node, compat_host_label))
    ProcessCollector(registry=registry)
    return registry


def negotiate(accept: str) -> str:
    """The content type prometheus_client's negotiation picks (the renderer writes every one of them), except
    that an unparseable Accept header (a bad version, say) gets the plain text format instead of an error: a
    scraper with an odd header still gets metrics."""
    try:
        return choose_encoder(accept)[1]
    except Exception:  # prometheus_client raises TypeError/ValueError on versions it cannot parse
        return TEXT_0_0_4


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether the Accept-Encoding header admits gzip (RFC 9110: ``gzip`` or its alias ``x-gzip`` with a
    q-value above 0, else ``*`` with one); ``gzip;q=0`` refuses it, and ``nogzip`` is not gzip."""
    q: dict[str, float] = {}
    for part in accept_encoding.split(","):
        name, _, params = part.partition(";")
        weight = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        q[name.strip().lower()] = weight
    named = [q[n] for n in ("gzip", "x-gzip") if n in q]
    return max(named) > 0 if named else q.get("*", 0.0) > 0


def dots_escaping(content_type: str) -> bool:
    """Whether the negotiated format asks for dots name escaping. Every gpumon name is a legacy (pre-UTF-8)
    name, which the underscores, allow-utf-8 and values schemes all leave as it is; only dots changes it.
    The renderer writes every scheme: prometheus_client 0.26 breaks two of them, writing U__-prefixed
    sample names under unprefixed HELP and TYPE lines (OpenMetrics, values) and escaping the _bucket, _sum
    and _count suffixes out of their histogram (dots); promtool rejects both."""
    m = _ESCAPING.search(content_type)
    return m is not None and m.group(1) == "dots"


def create_app(
    source: Callable[[], Snapshot | None],
    alive: Callable[[], bool],
    *,
    backend: str,
    owner_labels: bool = False,
    compat: str | None = None,
    training: Training | None = None,
    node: str | None = None,
    guard: Guard | None = None,
    max_age: float = 1.0,
    connections: Gate | None = None,
    fresh: Callable[[], bool] = lambda: True,
    details: frozenset[str] = frozenset(),
    compat_host_label: str = "Hostname",
    counter_hold: float = 60.0,
) -> FastAPI:
    """``max_age``: how long a render may be reused while nothing it reads has changed (the sample
    interval: what changes with time alone is then as fresh as the GPU series). ``fresh``: whether the
    latest sample is recent (/readyz)."""
    registry = build_registry(
        source,
        owner_labels=owner_labels,
        compat=compat,
        training=training,
        node=node,
        connections=connections,
        details=details,
        compat_host_label=compat_host_label,
        counter_hold=counter_hold,
    )
    app = FastAPI(title="gpumon", version=__version__, docs_url=None, redoc_url=None)
    # requests not served, by reason (exported by the gate; counted here when there is none, as in tests)
    refused: Counter[str] = connections.refused if connections is not None else Counter()

    def state() -> tuple[Hashable, ...]:
        return (source(), None if training is None else training.state())

    # heavy JSON documents, built one at a time and shared (shared.py)
    docs = SharedDocuments(state, max_age=max_age)
    if training is not None:
        app.include_router(training_router(training.analysis, training.library, training.history, docs))
        app.add_middleware(
            Ingest,
            analysis=training.analysis,
            stats=training.stats,
            policy=training.policy,
            boot=psutil.boot_time(),
        )
    scrapes = ScrapeCache(registry.collect, state, max_age=max_age)
    app.add_middleware(Selections, scrapes=scrapes, refused=refused)
    if guard is not None:  # added last, so outermost: nothing is answered before it has looked
        app.add_middleware(Access, guard=guard, refused=refused)

    @app.get(
        "/metrics",
        summary="Prometheus exposition (text 0.0.4 or OpenMetrics by Accept; gzip)",
        response_class=PlainTextResponse,
        responses={
            200: {"content": {"application/openmetrics-text": {}}},
            400: {"description": "More name[] than allowed (256)", "content": {"text/plain": {}}},
            503: {"description": "Too many name[] scrapes waiting (4)", "content": {"text/plain": {}}},
        },
    )
    async def metrics(request: Request) -> Response:
        content_type = negotiate(request.headers.get("accept", ""))
        fmt = Format(content_type.startswith("application/openmetrics"), dots_escaping(content_type))
        gzipped = accepts_gzip(request.headers.get("accept-encoding", ""))
        try:  # (the cheap refusals, from the raw query, were made before it was parsed: Selections)
            body = await scrapes.get(
                fmt,
                gzipped=gzipped,
                names=request.query_params.getlist("name[]"),
                gone=lambda: client_gone(request.scope),
            )
        except TooManyNames as exc:
            refused["too_many_names"] += 1
            return PlainTextResponse(f"{exc}\n", status_code=400)
        except SelectionsBusy:
            refused["selections_busy"] += 1
            return PlainTextResponse(BUSY + "\n", status_code=503, headers={"Retry-After": "1"})
        except Abandoned:
            refused["abandoned"] += 1
            return Response(status_code=499)  # written to nobody: uvicorn drops it
        headers = {"Content-Type": content_type, "Vary": "Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        return Response(body, headers=headers)

    @app.get(
        "/healthz",
        response_class=PlainTextResponse,
        summary="Liveness: the sampler is running",
        responses={503: {"description": "The sampler stalled", "content": {"text/plain": {}}}},
    )
    async def healthz() -> Response:  # async: answered on the loop, never queued for a worker thread
        if alive():
            return PlainTextResponse("ok\n")
        return PlainTextResponse("sampler stalled: no sweep completed recently\n", status_code=503)

    @app.get(
        "/readyz",
        response_class=PlainTextResponse,
        summary="Readiness: a recent sample exists",
        responses={503: {"description": "No sample yet, or none recent", "content": {"text/plain": {}}}},
    )
    async def readyz() -> Response:
        if source() is None:
            return PlainTextResponse("not ready: waiting for the first sample\n", status_code=503)
        if not fresh():
            return PlainTextResponse("not ready: no sample in the last three intervals\n", status_code=503)
        return PlainTextResponse("ready\n")

    @app.get(
        "/v1/gpus",
        summary="The latest snapshot as JSON: readings in base units, health, capabilities",
        responses={503: {"model": Reason, "description": "No sample yet"}},
    )
    async def gpus(request: Request) -> Response:
        snap = source()
        if snap is None:
            return JSONResponse({"detail": "not ready: waiting for the first sample"}, status_code=503)

        def build() -> tuple[int, bytes]:
            latest = source() or snap  # read after the state the document is kept under
            return 200, bytes(JSONResponse(snapshot_json(latest)).body)

        # shared: found by review, 80 loops of /v1/gpus each built their 40 KB on a thread of their own and
        # put 9 of 47 probes over 250 ms
        return await docs.answer(request.scope, ("gpus",), build)

    document = page.render(backend, jobs=training is not None, node=node)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> Response:
        return HTMLResponse(document, headers=page.headers())

    return app
