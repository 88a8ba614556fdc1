"""Timeouts that count: a canary that hangs costs the client latency, not errors, and is counted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from folio.operator import metric_names as m
from folio.operator.router.timeouts import attempt_timeout
from folio.operator.serving.router import RouterConfig
from tests.router.conftest import RouterFactory, RouterUnderTest
from tests.router.upstreams import FakeUpstream, serving
from tests.support.wait import until

pytestmark = pytest.mark.timeout(60)

TIMEOUT = "0.3s"


def canary_first(stable: FakeUpstream, canary: FakeUpstream, **config: Any) -> dict[str, Any]:
    """Every request goes to the canary first (weight 100); stable is where failed attempts go."""
    return {
        "traffic": [{"revision": "r1", "weight": 0}, {"revision": "r2", "weight": 100}],
        "endpoints": {"r1": [stable.url], "r2": [canary.url]},
        "stable": "r1",
        "canary": "r2",
        "requestTimeout": TIMEOUT,
        **config,
    }


async def stream(r: RouterUnderTest) -> tuple[httpx.Response, bytes]:
    body = {"model": "m", "prompt": "hi", "stream": True}
    async with r.client.stream("POST", "/v1/completions", json=body) as resp:
        return resp, b"".join([chunk async for chunk in resp.aiter_raw()])


async def test_canary_with_no_answer_in_time_is_answered_by_stable(router: RouterFactory) -> None:
    stable, canary = FakeUpstream("r1"), FakeUpstream("r2", hold=asyncio.Event())
    async with serving(stable, canary), router(**canary_first(stable, canary)) as r:
        for _ in range(3):
            resp = await r.complete()
            assert resp.status_code == 200 and resp.json()["served_by"] == "r1"
        assert r.metric(m.REQUESTS, revision="r2", code=m.TIMEOUT) == 3
        assert r.metric(m.REQUESTS, revision="r2", code="error") == 0  # a timeout is not an error
        assert r.metric(m.RETRIES, from_revision="r2", to_revision="r1") == 3
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 3
        # the canary's connection is dropped, so the engine stops working for nobody
        await until(lambda: canary.cancelled == 3, what="the timed-out requests cancelled upstream")


async def test_canary_stream_without_a_first_byte_is_answered_by_stable(router: RouterFactory) -> None:
    stable, canary = FakeUpstream("r1"), FakeUpstream("r2", hold_body=asyncio.Event())
    async with serving(stable, canary), router(**canary_first(stable, canary)) as r:
        resp, body = await stream(r)  # the canary's headers came, its first event did not
        assert resp.status_code == 200 and resp.headers["x-folio-revision"] == "r1"
        assert b'"served_by": "r1"' in body and body.endswith(b"data: [DONE]\n\n")
        assert b"r2" not in body
        assert r.metric(m.REQUESTS, revision="r2", code=m.TIMEOUT) == 1
        assert r.metric(m.REQUESTS, revision="r2", code="200") == 0


async def test_stream_that_stalls_ends_with_an_error_event(router: RouterFactory) -> None:
    stable, canary = FakeUpstream("r1"), FakeUpstream("r2", gate=asyncio.Event())
    async with serving(stable, canary), router(**canary_first(stable, canary)) as r:
        resp, body = await stream(r)  # one event, then nothing for longer than the timeout
        assert resp.status_code == 200 and resp.headers["x-folio-revision"] == "r2"
        events = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]
        assert b'"served_by": "r2", "n": 1' in events[0]
        error = json.loads(events[-2])["error"]  # the last event before [DONE] says the stream is incomplete
        assert {"message", "type", "param", "code"} <= set(error)
        assert error["type"] == "server_error" and error["code"] == "upstream_timeout"
        assert "0.3s" in error["message"]
        assert events[-1] == b"[DONE]" and len(events) == 3
        assert stable.seen == []  # too late to retry: the client already had the canary's first event
        assert r.metric(m.REQUESTS, revision="r2", code=m.TIMEOUT) == 1
        assert r.metric(m.REQUESTS, revision="r2", code="200") == 0
        await until(lambda: canary.cancelled == 1, what="the stalled request cancelled upstream")


async def test_no_answer_in_time_anywhere_is_504(router: RouterFactory) -> None:
    stable, canary = FakeUpstream("r1", hold=asyncio.Event()), FakeUpstream("r2", hold=asyncio.Event())
    options = {"read_timeout": 0.5}  # what stable is held to (`folio router --upstream-timeout`)
    async with serving(stable, canary), router(**canary_first(stable, canary), app_options=options) as r:
        resp = await r.complete()
        assert resp.status_code == 504
        error = resp.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "upstream_timeout"
        assert "r1 sent no answer within 0.5s" in error["message"]
        assert r.metric(m.REQUESTS, revision="r2", code=m.TIMEOUT) == 1
        assert r.metric(m.REQUESTS, revision="r1", code=m.TIMEOUT) == 1
        assert (await stream(r))[0].status_code == 504  # nothing was sent: a stream fails the same way


async def test_stable_is_not_held_to_the_canary_timeout(router: RouterFactory) -> None:
    """requestTimeout judges the canary; a long non-streaming generation on stable is not cut short."""
    hold = asyncio.Event()
    stable = FakeUpstream("r1", hold=hold)
    async with serving(stable), router(
        traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [stable.url]}, requestTimeout="0.1s"
    ) as r:
        answer = asyncio.create_task(r.complete())
        await until(lambda: stable.seen, what="the request upstream")
        await asyncio.sleep(0.3)  # three times the canary's timeout
        assert not answer.done()
        hold.set()
        assert (await answer).status_code == 200
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 1


async def test_timeouts_eject_a_canary_replica(router: RouterFactory) -> None:
    stable, hung, good = FakeUpstream("r1"), FakeUpstream("r2", hold=asyncio.Event()), FakeUpstream("r2")
    async with serving(stable, hung, good):
        config = canary_first(
            stable, hung, outlierDetection={"consecutiveErrors": 2, "baseEjectionTime": "300s"},
            loadBalancing={"strategy": "LeastLoaded"},  # alike requests spread, so the hung replica gets some
        )
        config["endpoints"]["r2"] = [hung.url, good.url]
        async with router(**config) as r:
            served = [(await r.complete()).json()["served_by"] for _ in range(8)]
            assert set(served) <= {"r1", "r2"} and served.count("r1") == 2  # the two timeouts, retried
            assert r.metric(m.EJECTIONS, revision="r2", replica=hung.url) == 1
            assert len(hung.seen) == 2


def test_only_the_canary_is_held_to_the_request_timeout() -> None:
    config = RouterConfig.parse({
        "traffic": [{"revision": "r1", "weight": 90}, {"revision": "r2", "weight": 10}], "requestTimeout": "2s",
        "stable": "r1", "canary": "r2",
    })  # fmt: skip
    assert attempt_timeout(config, "r2", read_timeout=600.0) == 2.0
    assert attempt_timeout(config, "r1", read_timeout=600.0) == 600.0
    assert attempt_timeout(config, "r2", read_timeout=1.0) == 1.0  # never longer than the router's own limit
    assert RouterConfig.parse({}).request_timeout_seconds == 60.0
