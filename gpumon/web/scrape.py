"""/metrics as a shared read: one render serves every scraper that asks while nothing has changed, and the
render runs on a worker thread, so probes and SDK reports are answered while it formats.

A render is reused while the GPU snapshot is the same object, nothing the training families read has changed
(reports counted, ranks expired, the baseline library as last read: ``Training.state``), and it is younger
than the sample interval (what changes with time alone, such as a rate decaying or the process's CPU counter,
is then at most one sweep old, as the GPU series are). A scraper never gets a render that began before it
arrived unless nothing has changed since: after a report is answered, or GET /v1/jobs or /v1/baselines showed
a change, the next scrape shows it too. Scrapers that arrive while a render runs wait for it and then share
the next one, so N concurrent scrapers cost at most two renders however large N is. Each format (text,
OpenMetrics, dots escaping) is its own entry; its gzip form is made once, when first asked for. A scrape that
selects series (``name[]``) gets them cut from the same shared render's families: formatting a few families
is cheap, where a render of its own per such scrape let a storm of them hold every other scraper back.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import unquote_to_bytes

from prometheus_client.metrics_core import Metric
from starlette.types import ASGIApp, Receive, Scope, Send

from gpumon.web.answer import plain
from gpumon.web.exposition import Renderer
from gpumon.web.peer import Abandoned

T = TypeVar("T")
# series a /metrics?name[]= scrape may name (more: 400); a selection is then cheap, and cached per render
MAX_NAMES = 256
MAX_SELECTIONS = 32  # distinct selections kept per render
# distinct name[] selections waiting for the render lock or being cut at once (more: 503; the same names as
# one already waiting wait too, at no cost: they are cut once). Found by review: 64 clients
# each selecting the 255 heaviest families plus a random name (so no cache could serve them) queued that
# many renders' worth of work ahead of every plain scrape (p50 11 ms -> 709 ms).
MAX_SELECTING = 4
# what prometheus_client appends to a family's name in its samples' names
_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info")
GZIP_LEVEL = 1  # exposition text compresses ~10x even at level 1; higher levels cost CPU for a few percent


@dataclass(frozen=True)
class Format:
    openmetrics: bool
    dots: bool


@dataclass
class Render:
    key: tuple[Hashable, ...]  # the state it was made from
    started: float  # monotonic time the render began reading that state
    body: bytes
    families: list[Metric] = field(default_factory=list, repr=False)  # what body was written from
    gzipped: bytes | None = field(default=None, repr=False)
    # name[] scrapes answered from this render: (names, gzipped) -> body
    selected: dict[tuple[frozenset[str], bool], bytes] = field(default_factory=dict, repr=False)


class TooManyNames(ValueError):
    def __init__(self, got: int | None = None) -> None:
        said = "" if got is None else f", got {got}"
        super().__init__(f"name[]: at most {MAX_NAMES} series names in one scrape{said}")


class SelectionsBusy(Exception):
    """MAX_SELECTING name[] scrapes are already waiting or being cut."""


class Selections:
    """ASGI middleware: the refusals of /metrics?name[]= made from the raw query, before the framework
    parses it (FastAPI parses every request's query to solve its dependencies, ~1 ms for 256 names). Found
    by review: 80 connections looping selections refused only after that parse kept the event loop busy
    and probes waited 0.8 s."""

    def __init__(self, app: ASGIApp, *, scrapes: ScrapeCache, refused: Counter[str]) -> None:
        self.app = app
        self.scrapes = scrapes
        self.refused = refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            query: bytes = scope.get("query_string", b"")
            if query.count(b"&") >= 2 * MAX_NAMES:
                # 200 requests of 3,000 names each took 1.4 s to parse
                self.refused["too_many_names"] += 1
                await plain(send, 400, str(TooManyNames()))
                return
            if self.scrapes.selecting_full() and _selects(query):
                self.refused["selections_busy"] += 1
                await plain(send, 503, BUSY, [(b"retry-after", b"1")])
                return
        await self.app(scope, receive, send)


BUSY = (
    f"busy: {MAX_SELECTING} name[] scrapes are already waiting; retry in a moment, or scrape without name[]"
)


def _selects(query: bytes) -> bool:
    """Whether the query names series, however its key is percent-encoded (the framework decodes keys)."""
    return b"name[]=" in (unquote_to_bytes(query) if b"%" in query else query)


class ScrapeCache:
    """Owned by one app; its methods are called from the event loop."""

    def __init__(
        self,
        collect: Callable[[], Iterable[Metric]],
        state: Callable[[], tuple[Hashable, ...]],
        *,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._collect = collect  # the registry's families
        self._state = state  # what a render depends on, cheap to read: identities and counters
        self._max_age = max_age
        self._clock = clock
        self._renderer = Renderer()
        # held across every render: renders never run side by side, so a storm of scrapers costs one core
        self._lock = asyncio.Lock()
        self._renders: dict[Format, Render] = {}
        # the thread of the last render, which may outlive a scraper that was cancelled while it waited
        self._inflight: asyncio.Future[object] | None = None
        self.made = 0  # renders made, for tests and benchmarks
        self._selecting: Counter[frozenset[str]] = Counter()  # name[] scrapes waiting or being cut, by names

    async def get(
        self,
        fmt: Format,
        *,
        gzipped: bool = False,
        names: list[str] | None = None,
        gone: Callable[[], bool] = lambda: False,
    ) -> bytes:
        """Raises TooManyNames past MAX_NAMES, SelectionsBusy past MAX_SELECTING, and Abandoned when
        ``gone()`` says the scraper left while it waited its turn (scrapers queued behind a render and then
        gone took their render with them)."""
        wanted = frozenset(names or ())
        if not wanted:
            return await self._get(fmt, gzipped, wanted, gone)
        if len(wanted) > MAX_NAMES:
            raise TooManyNames(len(wanted))
        if wanted not in self._selecting and self.selecting_full():
            raise SelectionsBusy()  # (one already waiting for the same names costs nothing more: cached)
        self._selecting[wanted] += 1
        try:
            return await self._get(fmt, gzipped, wanted, gone)
        finally:
            self._selecting[wanted] -= 1
            if not self._selecting[wanted]:
                del self._selecting[wanted]

    async def _get(
        self, fmt: Format, gzipped: bool, wanted: frozenset[str], gone: Callable[[], bool]
    ) -> bytes:
        arrived = self._clock()
        async with self._lock:
            if gone():
                raise Abandoned()
            leftover = self._inflight
            if leftover is not None and not leftover.done():
                # a cancelled scraper released the lock while its render still runs: wait for that thread,
                # so that renders never run side by side however many scrapers give up mid-render
                await asyncio.wait([leftover])
            r = self._renders.get(fmt)
            if r is None or not (r.started > arrived or self._reusable(r)):
                r = await self._run(self._make, fmt)
                self._renders[fmt] = r
            if wanted:
                body = r.selected.get((wanted, gzipped))
                if body is None:
                    body = await self._run(self._select, r, fmt, wanted, gzipped)
                    if len(r.selected) >= MAX_SELECTIONS:
                        r.selected.clear()
                    r.selected[(wanted, gzipped)] = body
                return body
            if not gzipped:
                return r.body
            if r.gzipped is None:
                r.gzipped = await self._run(gzip.compress, r.body, GZIP_LEVEL)
            return r.gzipped

    def selecting_full(self) -> bool:
        return len(self._selecting) >= MAX_SELECTING

    def _reusable(self, r: Render) -> bool:
        return r.key == self._state() and self._clock() - r.started < self._max_age

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on a thread of its own. Not a pool: a pool's idle thread would outlive every app
        (tests create many) and hold interpreter exit; a thread costs ~0.1 ms against a render's milliseconds.
        A daemon thread, so a render cut short by SIGTERM does not delay the exit."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def settle(result: T | None, exc: BaseException | None) -> None:
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(result)  # type: ignore[arg-type]

        def work() -> None:
            try:
                result, exc = fn(*args), None
            except BaseException as e:  # handed to the awaiting request, as if it had run there
                result, exc = None, e
            with contextlib.suppress(RuntimeError):  # the loop closed while this ran: nobody is waiting
                loop.call_soon_threadsafe(settle, result, exc)

        threading.Thread(target=work, name="gpumon-render", daemon=True).start()
        self._inflight = done  # type: ignore[assignment]
        # shielded: a cancelled scraper leaves the future to the thread, and the next scraper waits on it
        return await asyncio.shield(done)

    def _make(self, fmt: Format) -> Render:
        started, key = self._clock(), self._state()  # the key first: a change after it forces the next render
        self.made += 1
        families = list(self._collect())
        body = self._renderer.render(families, openmetrics_format=fmt.openmetrics, dots=fmt.dots)
        return Render(key, started, body, families)

    def _select(self, r: Render, fmt: Format, names: frozenset[str], gzipped: bool) -> bytes:
        """The series named (sample names, as prometheus_client's restricted registry matches them), found
        by name: the cost grows with the names asked for, not with names x families."""
        families = {f.name: f for f in r.families}
        hit = {
            family
            for n in names
            for family in (n, *(n[: -len(x)] for x in _SUFFIXES if n.endswith(x)))
            if family in families
        }
        chosen = []
        for family in r.families:
            if family.name not in hit:
                continue
            samples = [s for s in family.samples if s.name in names]
            if samples:
                part = Metric(family.name, family.documentation, family.type)
                part.samples = samples
                if hasattr(family, "text_type"):  # a DCGM counter: typed as in the full scrape
                    part.text_type = family.text_type  # type: ignore[attr-defined]
                chosen.append(part)
        body = self._renderer.render(chosen, openmetrics_format=fmt.openmetrics, dots=fmt.dots)
        return gzip.compress(body, compresslevel=GZIP_LEVEL) if gzipped else body
