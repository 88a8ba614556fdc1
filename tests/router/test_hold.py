"""The router's hold queue: requests wait for a replica (scale from zero), bounded, timed out, paced."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from aiohttp import web

from folio.operator import metric_names as m
from folio.operator.router.sources import InProcessSource
from folio.operator.serving.router import RouterConfig
from tests.router.conftest import RouterFactory
from tests.router.upstreams import FakeUpstream, dead_url, serving
from tests.support.wait import until

TRAFFIC = [{"revision": "r1", "weight": 100}]


def holding(**kw: Any) -> dict[str, Any]:
    return {"maxHeldRequests": 8, "holdTimeout": 30, "releasePerReplica": 2, **kw}


class AskingSource(InProcessSource):
    """The cluster source's shape: a source that can ask for a scale up."""

    def __init__(self, config: RouterConfig) -> None:
        super().__init__(config)
        self.asked = 0

    async def ask_scale_up(self) -> None:
        self.asked += 1


class CountingUpstream(FakeUpstream):
    """Remembers the most completions it had in progress at once."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.now = self.most = 0

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await super()._complete(request)
        finally:
            self.now -= 1


def _error(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    return body["error"]


async def test_held_until_a_replica_is_ready_and_a_scale_up_is_asked(router: RouterFactory) -> None:
    up = FakeUpstream("r1")
    source = AskingSource(RouterConfig.parse({"traffic": TRAFFIC, "stable": "r1", "holding": holding()}))
    async with serving(up), router(source=source) as r:
        assert (await r.client.get("/ready")).status_code == 200  # no replica, but it holds: stay in the Service
        pending = asyncio.ensure_future(r.complete())
        await until(lambda: r.metric(m.HELD) == 1, what="the request held")
        await until(lambda: source.asked == 1, what="a scale up asked for")
        assert not pending.done()
        r.set(traffic=TRAFFIC, stable="r1", holding=holding(), endpoints={"r1": [up.url]})
        resp = await pending
        assert resp.status_code == 200 and resp.json()["served_by"] == "r1"
        assert r.metric(m.HELD) == 0 and r.metric(m.HELD_TOTAL, outcome="served") == 1
        resp = await r.complete()  # nothing held any more: straight through
        assert resp.status_code == 200 and source.asked == 1


async def test_bounded_queue_refuses_the_rest_with_503_and_retry_after(router: RouterFactory) -> None:
    async with router(traffic=TRAFFIC, holding=holding(maxHeldRequests=2)) as r:
        held = [asyncio.ensure_future(r.complete()) for _ in range(2)]
        await until(lambda: r.metric(m.HELD) == 2, what="two requests held")
        resp = await r.complete()
        assert resp.status_code == 503 and resp.headers["Retry-After"] == "5"
        assert _error(resp)["code"] == "no_ready_replica" and "maxHeldRequests" in _error(resp)["message"]
        assert r.metric(m.HELD_TOTAL, outcome="full") == 1
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)


async def test_timeout_is_503_or_overflow_when_configured(router: RouterFactory) -> None:
    remote = FakeUpstream("remote")
    async with serving(remote), router(traffic=TRAFFIC, holding=holding(holdTimeout=0.3)) as r:
        resp = await r.complete()
        assert resp.status_code == 503 and "holdTimeout" in _error(resp)["message"]
        assert r.metric(m.HELD_TOTAL, outcome="timeout") == 1 and r.metric(m.HELD) == 0
        r.set(traffic=TRAFFIC, holding=holding(holdTimeout=0.3), overflow={"url": remote.url})
        resp = await r.complete()
        assert resp.status_code == 200 and resp.json()["served_by"] == "remote"
        assert r.metric(m.HELD_TOTAL, outcome="timeout") == 2


async def test_release_is_paced_by_the_replicas_that_are_ready(router: RouterFactory) -> None:
    up = CountingUpstream("r1")
    up.hold = asyncio.Event()  # completions wait until set: the replica is "busy"
    async with serving(up), router(traffic=TRAFFIC, holding=holding(releasePerReplica=2)) as r:
        pending = [asyncio.ensure_future(r.complete()) for _ in range(6)]
        await until(lambda: r.metric(m.HELD) == 6, what="six requests held")
        r.set(traffic=TRAFFIC, holding=holding(releasePerReplica=2), endpoints={"r1": [up.url]})
        await until(lambda: len(up.seen) == 2, what="the first two released")
        assert r.metric(m.HELD) == 4  # the rest wait for those two to be answered
        late = asyncio.ensure_future(r.complete())  # a newcomer queues behind the held ones
        await until(lambda: r.metric(m.HELD) == 5, what="the newcomer held")
        up.hold.set()
        answers = await asyncio.gather(*pending, late)
        assert [a.status_code for a in answers] == [200] * 7
        assert up.most <= 2 and r.metric(m.HELD_TOTAL, outcome="served") == 7


async def test_without_holding_no_replica_is_503_at_once(router: RouterFactory) -> None:
    async with router(traffic=TRAFFIC) as r:
        resp = await r.complete()
        assert resp.status_code == 503 and _error(resp)["code"] == "no_upstream"
        assert (await r.client.get("/ready")).status_code == 503


async def test_a_replica_found_gone_holds_the_request_instead_of_failing_it(router: RouterFactory) -> None:
    """Scaled to zero before the config says so: the only replica refuses connections, so the request
    (which reached no engine) is held like any other with nothing ready, and served once one is."""
    up = FakeUpstream("r1")
    config = {"traffic": TRAFFIC, "stable": "r1", "holding": holding(), "endpoints": {"r1": [dead_url()]}}
    async with serving(up), router(**config) as r:
        pending = asyncio.ensure_future(r.complete())
        await until(lambda: r.metric(m.HELD) == 1, what="the request held after the refused connection")
        assert not pending.done()
        r.set(traffic=TRAFFIC, stable="r1", holding=holding(), endpoints={"r1": [up.url]})
        resp = await pending
        assert resp.status_code == 200 and resp.json()["served_by"] == "r1"
        assert r.metric(m.HELD_TOTAL, outcome="served") == 1
