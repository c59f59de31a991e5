"""/metrics as a shared read (gpumon/web/scrape.py): concurrent scrapers share one render, a change or the
sample interval makes a new one, a scraper never gets a render older than its own arrival when something
changed, and the render runs off the event loop."""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections import Counter
from collections.abc import Hashable, Iterable

import httpx
import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from gpumon.web.peer import Abandoned as ScrapeAbandoned
from gpumon.web.scrape import (
    MAX_NAMES,
    MAX_SELECTING,
    Format,
    ScrapeCache,
    Selections,
    SelectionsBusy,
    TooManyNames,
)

TEXT = Format(openmetrics=False, dots=False)
OPENMETRICS = Format(openmetrics=True, dots=False)


class World:
    """The state a render reads: a version a test bumps, a clock it moves, a collect it can hold."""

    def __init__(self) -> None:
        self.version = 0
        self.now = 100.0
        self.collected = 0  # collects made
        self.entered = threading.Event()  # a collect has started
        self.release = threading.Event()  # collects may finish
        self.release.set()
        self.thread: threading.Thread | None = None  # where the last collect ran

    def collect(self) -> Iterable[Metric]:
        self.collected += 1
        self.thread = threading.current_thread()
        self.entered.set()
        assert self.release.wait(10), "the test never released the render"
        g = GaugeMetricFamily("gpumon_test_version", "The state's version.", labels=["n"])
        g.add_metric([str(self.collected)], self.version)
        return [g, GaugeMetricFamily("gpumon_test_other", "Another family.", value=1.0)]

    def state(self) -> tuple[Hashable, ...]:
        return (self.version,)

    def cache(self, max_age: float = 1.0) -> ScrapeCache:
        return ScrapeCache(self.collect, self.state, max_age=max_age, clock=lambda: self.now)


def run(coro):
    return asyncio.run(coro)


def test_a_render_is_reused_until_the_state_changes_or_the_interval_passes() -> None:
    world = World()
    cache = world.cache(max_age=1.0)

    async def scenario() -> None:
        first = await cache.get(TEXT)
        world.now += 0.5
        assert await cache.get(TEXT) is first and cache.made == 1  # nothing changed, within the interval
        world.version += 1  # a report was counted (or a sweep ended)
        changed = await cache.get(TEXT)
        assert changed != first and b"gpumon_test_version{" in changed and cache.made == 2
        world.now += 1.0  # nothing changed, but the render is a sample interval old
        assert await cache.get(TEXT) != changed and cache.made == 3

    run(scenario())


def test_each_format_is_its_own_render_and_gzip_is_made_once() -> None:
    world = World()
    cache = world.cache()

    async def scenario() -> None:
        text = await cache.get(TEXT)
        om = await cache.get(OPENMETRICS)
        assert om.endswith(b"# EOF\n") and not text.endswith(b"# EOF\n") and cache.made == 2
        zipped = await cache.get(TEXT, gzipped=True)
        assert gzip.decompress(zipped) == text and await cache.get(TEXT, gzipped=True) is zipped
        assert cache.made == 2

    run(scenario())


def test_concurrent_scrapers_share_one_render() -> None:
    world = World()
    cache = world.cache()

    async def scenario() -> list[bytes]:
        return await asyncio.gather(*(cache.get(TEXT) for _ in range(32)))

    bodies = run(scenario())
    assert len(set(bodies)) == 1 and cache.made == 1


def test_scrapers_arriving_during_a_render_after_a_change_share_the_next_one() -> None:
    world = World()
    cache = world.cache()

    async def scenario() -> None:
        world.release.clear()
        first = asyncio.create_task(cache.get(TEXT))
        await asyncio.to_thread(world.entered.wait, 10)  # the first render is reading the state
        world.version += 1  # a report arrives while it runs: the waiters must not get the older render
        late = [asyncio.create_task(cache.get(TEXT)) for _ in range(16)]
        await asyncio.sleep(0.01)
        world.release.set()
        old = await first
        bodies = await asyncio.gather(*late)
        assert len(set(bodies)) == 1 and bodies[0] != old
        assert b'gpumon_test_version{n="2"} 1.0' in bodies[0]
        assert cache.made == 2  # 17 scrapers, two renders

    run(scenario())


def test_the_render_runs_off_the_event_loop() -> None:
    world = World()
    cache = world.cache()

    async def scenario() -> None:
        world.release.clear()
        scrape = asyncio.create_task(cache.get(TEXT))
        await asyncio.to_thread(world.entered.wait, 10)
        # the render is held inside collect(), on a thread that is not the loop's
        assert world.thread is not None and world.thread is not threading.current_thread()
        # and meanwhile the loop runs timers: were the render on it, this could not fire until it ended
        await asyncio.wait_for(asyncio.sleep(0.01), timeout=5.0)
        assert not scrape.done()
        world.release.set()
        assert b"gpumon_test_version" in await scrape

    run(scenario())


def test_scrapers_cancelled_mid_render_never_leave_renders_running_side_by_side() -> None:
    """A scraper cancelled while its render runs releases the lock; the thread goes on. The next scrapers
    wait for that thread instead of starting renders beside it, so giving up mid-scrape, again and again,
    cannot pile renders (and threads) up."""
    world = World()
    cache = world.cache()
    running, most = [0], [0]
    collect = world.collect

    def counted() -> Iterable[Metric]:
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            return collect()
        finally:
            running[0] -= 1

    cache._collect = counted

    async def scenario() -> None:
        world.release.clear()
        for _ in range(5):
            world.entered.clear()
            world.version += 1  # each scraper needs a new render
            scrape = asyncio.create_task(cache.get(TEXT))
            await asyncio.to_thread(world.entered.wait, 10)
            scrape.cancel()
            with pytest.raises(asyncio.CancelledError):
                await scrape
            follower = asyncio.create_task(cache.get(TEXT, names=["gpumon_test_version"]))
            await asyncio.sleep(0.05)
            assert not follower.done() and world.collected == 2 * _ + 1  # it waits, no second render
            world.release.set()
            assert b"gpumon_test_version" in await follower
            world.release.clear()
        world.release.set()

    run(scenario())
    assert most[0] == 1


def test_scrapes_that_select_series_are_cut_from_the_shared_render() -> None:
    """Found by review: each name[] scrape was a render of its own under the lock, so 16 such scrapers took
    plain scrapes from 2 ms to 1.1 s. Now they share the render and only format what they select."""
    world = World()
    cache = world.cache()

    async def scenario() -> None:
        whole = await cache.get(TEXT)
        answers = await asyncio.gather(*(cache.get(TEXT, names=["gpumon_test_version"]) for _ in range(16)))
        assert world.collected == 1 and cache.made == 1
        assert answers[0] in whole and b"gpumon_test_other" not in answers[0] and len(set(answers)) == 1
        assert await cache.get(TEXT, names=["gpumon_nothing"]) == b""
        assert gzip.decompress(await cache.get(TEXT, gzipped=True, names=["gpumon_test_other"])).startswith(
            b"# HELP gpumon_test_other"
        )

    run(scenario())


def test_a_selection_is_bounded_in_names_and_made_once_per_render() -> None:
    world = World()
    cache = world.cache()
    made: list[frozenset[str]] = []
    select = cache._select

    def counted(r, fmt, names, gzipped):  # type: ignore[no-untyped-def]
        made.append(names)
        return select(r, fmt, names, gzipped)

    cache._select = counted  # type: ignore[method-assign]

    async def scenario() -> None:
        names = ["gpumon_test_version", "gpumon_nothing"]
        first = await cache.get(TEXT, names=names)
        assert await cache.get(TEXT, names=list(reversed(names))) == first and len(made) == 1
        assert b"gpumon_test_version" in first and b"gpumon_test_other" not in first
        with pytest.raises(TooManyNames, match=rf"at most {MAX_NAMES} series names"):
            await cache.get(TEXT, names=[f"gpumon_x{i}" for i in range(MAX_NAMES + 1)])
        # the limit counts distinct names: repeating one is not a pile
        await cache.get(TEXT, names=["gpumon_test_other"] * (MAX_NAMES + 1))

    asyncio.run(scenario())


def test_selections_past_the_limit_are_refused_before_their_query_is_parsed() -> None:
    """Found by review: selections that no cache serves each cost about a render, queued without bound on
    the render lock ahead of plain scrapes (p50 11 -> 709 ms with 64 clients), and were refused only after
    FastAPI had parsed their queries. At most MAX_SELECTING wait; more are refused from the raw query."""
    world = World()
    cache = world.cache()
    refused: Counter[str] = Counter()
    reached: list[bytes] = []

    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        reached.append(scope["query_string"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    gate = Selections(app, scrapes=cache, refused=refused)

    async def call(query: bytes) -> int:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "path": "/metrics", "query_string": query, "headers": []}
        await gate(scope, None, send)
        return sent[0]["status"]

    async def scenario() -> None:
        world.release.clear()  # the render holds: selections wait behind it
        waiting = [
            asyncio.create_task(cache.get(TEXT, names=["gpumon_test_version", f"x{i}"]))
            for i in range(MAX_SELECTING)
        ]
        await asyncio.sleep(0.05)
        with pytest.raises(SelectionsBusy):
            await cache.get(TEXT, names=["gpumon_test_other"])
        assert await call(b"name[]=gpumon_test_other") == 503
        assert await call(b"name%5b%5D=gpumon_test_other") == 503
        assert await call(b"%6Eame[%5D=gpumon_test_other") == 503, "a key is decoded, every byte of it"
        assert await call(b"NAME[]=x") == 200, "keys are case-sensitive: not a selection"
        assert await call(b"") == 200 and await call(b"x=1") == 200, "a plain scrape is not refused"
        assert await call(b"&".join([b"name[]=a"] * (2 * MAX_NAMES + 1))) == 400
        assert reached == [b"NAME[]=x", b"", b"x=1"], "refused requests never reached the app (its parser)"
        assert refused == {"selections_busy": 3, "too_many_names": 1}
        world.release.set()
        await asyncio.gather(*waiting)
        assert await call(b"name[]=gpumon_test_other") == 200, "free again"

    asyncio.run(scenario())


def test_a_scraper_that_left_while_it_waited_gets_no_render() -> None:
    world = World()
    cache = world.cache()

    async def scenario() -> None:
        with pytest.raises(ScrapeAbandoned):
            await cache.get(TEXT, gone=lambda: True)
        assert cache.made == 0 and world.collected == 0
        with pytest.raises(ScrapeAbandoned):
            await cache.get(TEXT, names=["gpumon_test_version"], gone=lambda: True)
        assert cache.made == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_daemon_answers_every_concurrent_scrape_with_the_same_exposition(daemon, gzipped: bool) -> None:
    node = daemon("--simulate", "2xH100-SXM")
    headers = {"Accept-Encoding": "gzip" if gzipped else "identity"}

    async def storm() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=node.url, timeout=30) as client:
            return await asyncio.gather(*(client.get("/metrics", headers=headers) for _ in range(24)))

    answers = run(storm())
    assert {a.status_code for a in answers} == {200}
    assert all(a.headers.get("content-encoding") == ("gzip" if gzipped else None) for a in answers)
    sweeps = {a.text.split("\ngpumon_samples_total ")[1].split("\n")[0] for a in answers}
    assert len(sweeps) <= 2  # one render shared (two when a sweep ended mid-storm)
