"""End to end through a real router (uvicorn, in this event loop) to fake engines on loopback."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import httpx
import pytest

from folio.engine.server.openai_errors import ErrorCode
from folio.operator import metric_names as m
from tests.router.conftest import RouterFactory
from tests.router.upstreams import FakeUpstream, dead_url, serving
from tests.support.wait import until


def _openai_error(resp: httpx.Response) -> dict[str, object]:
    body = resp.json()
    assert set(body) == {"error"}
    assert {"message", "type", "param", "code"} <= set(body["error"])
    ErrorCode(body["error"]["code"])  # the router's codes are the engine's table's
    return body["error"]


async def test_split_follows_weights_end_to_end(router: RouterFactory) -> None:
    r1, r2 = FakeUpstream("r1"), FakeUpstream("r2")
    async with (
        serving(r1, r2),
        router(
            traffic=[{"revision": "r1", "weight": 90}, {"revision": "r2", "weight": 10}], stable="r1", canary="r2",
            endpoints={"r1": [r1.url], "r2": [r2.url]},
        ) as r,
    ):
        served = Counter()
        for _ in range(200):
            resp = await r.complete()
            assert resp.status_code == 200
            served[resp.json()["served_by"]] += 1
            assert resp.headers["x-folio-revision"] == resp.json()["served_by"]
        assert served == {"r1": 180, "r2": 20}
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 180
        assert r.metric(m.REQUESTS, revision="r2", code="200") == 20
        assert r.metric(m.WEIGHT, revision="r2") == 10
        assert r.metric(f"{m.DURATION}_count", revision="r2") == 20
        assert r.metric(m.IN_FLIGHT, revision="r1") == 0


async def test_pass_through_keeps_path_query_headers_and_body(router: RouterFactory) -> None:
    up = FakeUpstream("r1")
    async with (
        serving(up),
        router(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [up.url]}) as r,
    ):
        body = {"model": "m", "messages": [{"role": "user", "content": "héllo"}], "logit_bias": {"5": -100},
                "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}},
                "guided_regex": "[a-z]+", "structured_outputs": {"choice": ["a", "b"]},
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                "tool_choice": "required", "parallel_tool_calls": False}  # the engine's to judge
        resp = await r.client.post("/v1/chat/completions?x=1", json=body, headers={"X-Request-Id": "abc"})
        assert resp.status_code == 200
        assert up.seen[-1].path == "/v1/chat/completions?x=1"
        assert json.loads(up.seen[-1].body) == body
        assert up.seen[-1].headers["X-Request-Id"] == "abc"
        models = await r.client.get("/v1/models")
        assert models.status_code == 200 and models.json()["data"][0]["owned_by"] == "r1"


async def test_canary_refusing_connections_costs_no_errors(router: RouterFactory) -> None:
    stable = FakeUpstream("r1")
    async with (
        serving(stable),
        router(
            traffic=[{"revision": "r1", "weight": 50}, {"revision": "r2", "weight": 50}], stable="r1", canary="r2",
            endpoints={"r1": [stable.url], "r2": [dead_url()]},
        ) as r,
    ):
        statuses = [(await r.complete()).status_code for _ in range(20)]
        assert statuses == [200] * 20
        assert len(stable.seen) == 20
        failed = r.metric(m.REQUESTS, revision="r2", code="error")
        assert failed >= 1  # after the first refusal the replica is out of rotation until it answers
        assert r.metric(m.RETRIES, from_revision="r2", to_revision="r1") == failed
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 20


async def test_canary_answering_500_is_retried_on_stable(router: RouterFactory) -> None:
    stable, canary = FakeUpstream("r1"), FakeUpstream("r2", status=500)
    async with (
        serving(stable, canary),
        router(
            traffic=[{"revision": "r1", "weight": 50}, {"revision": "r2", "weight": 50}], stable="r1", canary="r2",
            endpoints={"r1": [stable.url], "r2": [canary.url]},
        ) as r,
    ):
        results = [await r.complete() for _ in range(20)]
        assert [x.status_code for x in results] == [200] * 20
        assert {x.json()["served_by"] for x in results} == {"r1"}
        assert len(canary.seen) == 10  # a 500 is not a dead replica: it keeps getting its share
        assert r.metric(m.REQUESTS, revision="r2", code="500") == 10
        assert r.metric(m.RETRIES, from_revision="r2", to_revision="r1") == 10
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 20


@pytest.mark.parametrize("strategy", ["PrefixHash", "LeastLoaded"])
async def test_failing_stable_replica_is_ejected_and_costs_no_errors(router: RouterFactory, strategy: str) -> None:
    good, bad = FakeUpstream("r1"), FakeUpstream("r1", status=500)
    async with (
        serving(good, bad),
        router(
            traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [good.url, bad.url]},
            outlierDetection={"consecutiveErrors": 3, "baseEjectionTime": "300s"},
            loadBalancing={"strategy": strategy},
        ) as r,
    ):  # fmt: skip
        # distinct prompts: with PrefixHash each has its own place on the ring, so some land on `bad`
        statuses = [(await r.complete(prompt=f"question {i}")).status_code for i in range(30)]
        assert statuses == [200] * 30  # every failed attempt was retried on the other replica
        assert len(bad.seen) == 3  # then it was out of rotation
        assert r.metric(m.EJECTIONS, revision="r1", replica=bad.url) == 1
        assert r.metric(m.EJECTED, revision="r1", replica=bad.url) == 1
        assert r.metric(m.RETRIES, from_revision="r1", to_revision="r1") == 3


async def test_stable_500_is_relayed_after_one_retry(router: RouterFactory) -> None:
    a, b = FakeUpstream("a", status=500), FakeUpstream("b", status=502)
    async with (
        serving(a, b),
        router(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [a.url, b.url]}) as r,
    ):
        resp = await r.complete()
        assert resp.status_code in (500, 502)  # the last attempt's own answer, as the replica sent it
        assert "failed" in _openai_error(resp)["message"]
        assert len(a.seen) + len(b.seen) == 2
        assert r.metric(m.RETRIES, from_revision="r1", to_revision="r1") == 1


async def test_streaming_is_relayed_as_it_arrives(router: RouterFactory) -> None:
    gate = asyncio.Event()
    up = FakeUpstream("r1", gate=gate)
    async with (
        serving(up),
        router(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [up.url]}) as r,
    ):
        body = {"model": "m", "prompt": "hi", "stream": True}
        async with r.client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            chunks = resp.aiter_raw()
            first = await asyncio.wait_for(chunks.__anext__(), timeout=5)
            # The upstream is still parked on the gate: this chunk cannot have been buffered.
            assert not gate.is_set()
            assert b'"n": 1' in first
            gate.set()
            rest = b"".join([c async for c in chunks])
        assert rest.endswith(b"data: [DONE]\n\n")
        assert r.metric(f"{m.TTFT}_count", revision="r1") == 1


async def test_client_leaving_mid_stream_drops_the_upstream_request(router: RouterFactory) -> None:
    gate = asyncio.Event()
    up = FakeUpstream("r1", gate=gate)
    async with (
        serving(up),
        router(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [up.url]}) as r,
    ):
        async with r.client.stream("POST", "/v1/completions", json={"prompt": "x", "stream": True}) as resp:
            await resp.aiter_raw().__anext__()
        # the router notices the client leave and ends its attempt
        await until(lambda: r.metric(m.IN_FLIGHT, revision="r1") == 0, what="the attempt ended")
        gate.set()  # the upstream writes its next chunk into a connection the router has closed
        # the engine sees its client go away, so it can free the sequence
        await until(lambda: up.cancelled, what="the upstream request cancelled")
        assert up.cancelled == 1
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 1


async def test_overflow_when_every_replica_is_busy(router: RouterFactory) -> None:
    a, b, remote = FakeUpstream("a", status=429), FakeUpstream("b", status=503), FakeUpstream("remote")
    async with (
        serving(a, b, remote),
        router(
            traffic=[{"revision": "r1", "weight": 100}], stable="r1",
            endpoints={"r1": [a.url, b.url]},
            overflow={"url": remote.url + "/v1", "apiKey": "sk-remote"},
            apiKeys=["client-key"],
        ) as r,
    ):
        resp = await r.complete(Authorization="Bearer client-key")
        assert resp.status_code == 200 and resp.json()["served_by"] == "remote"
        assert len(a.seen) == len(b.seen) == 1
        assert remote.seen[-1].headers["Authorization"] == "Bearer sk-remote"  # never the client's key
        assert remote.seen[-1].path == "/v1/completions"
        assert r.metric(m.REQUESTS, revision="r1", code="429") == 1
        assert r.metric(m.REQUESTS, revision="r1", code="503") == 1
        assert r.metric(m.REQUESTS, revision="overflow", code="200") == 1
        a.status = 200
        resp = await r.complete(Authorization="Bearer client-key")
        assert resp.json()["served_by"] in ("a", "remote")  # b still busy; a serves again


async def test_busy_without_overflow_relays_the_answer(router: RouterFactory) -> None:
    up = FakeUpstream("r1", status=429)
    async with (
        serving(up),
        router(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [up.url]}) as r,
    ):
        resp = await r.complete()
        assert resp.status_code == 429
        _openai_error(resp)


def mirrored(stable: FakeUpstream, canary: FakeUpstream) -> dict[str, Any]:
    """All traffic on stable, every request mirrored to the canary."""
    return {
        "traffic": [{"revision": "r1", "weight": 100}, {"revision": "r2", "weight": 0}],
        "endpoints": {"r1": [stable.url], "r2": [canary.url]},
        "stable": "r1",
        "canary": "r2",
        "shadow": {"percent": 100},
    }


async def test_shadow_mirrors_to_canary_without_slowing_the_primary(router: RouterFactory) -> None:
    stable = FakeUpstream("r1")
    canary = FakeUpstream("r2", hold=asyncio.Event())  # the mirror never answers while we measure
    async with (
        serving(stable, canary),
        router(**mirrored(stable, canary)) as r,
    ):
        for _ in range(5):
            resp = await r.complete()
            assert resp.status_code == 200 and resp.json()["served_by"] == "r1"
        await until(lambda: len(canary.seen) == 5, what="five mirrored requests")
        assert all(s.headers.get("X-Folio-Shadow") == "1" for s in canary.seen)
        assert r.metric(m.SHADOW_REQUESTS, revision="r2", code="200") == 0
        canary.hold.set()
        await until(lambda: r.metric(m.SHADOW_REQUESTS, revision="r2", code="200") == 5, what="five shadow answers")
        assert r.metric(m.REQUESTS, revision="r2", code="200") == 0  # not real traffic


async def test_shadow_percent_is_a_fraction(router: RouterFactory) -> None:
    stable, canary = FakeUpstream("r1"), FakeUpstream("r2")
    async with (
        serving(stable, canary),
        router(
            traffic=[{"revision": "r1", "weight": 100}, {"revision": "r2", "weight": 0}], stable="r1", canary="r2",
            endpoints={"r1": [stable.url], "r2": [canary.url]},
            shadow={"percent": 0},
        ) as r,
    ):
        for _ in range(10):
            await r.complete()
        await asyncio.sleep(0.05)
        assert canary.seen == []


async def test_api_key_auth(router: RouterFactory) -> None:
    up = FakeUpstream("r1")
    async with (
        serving(up),
        router(
            traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [up.url]}, apiKeys=["k1", "k2"]
        ) as r,
    ):
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic k1"}):
            resp = await r.complete(**headers)
            assert resp.status_code == 401
            assert _openai_error(resp)["code"] == "invalid_api_key"
            assert _openai_error(resp)["type"] == "invalid_request_error"  # as OpenAI answers a bad key
        assert up.seen == []
        resp = await r.complete(Authorization="Bearer k2")
        assert resp.status_code == 200
        assert "Authorization" not in up.seen[-1].headers  # the router's keys stay with the router
        assert (await r.client.get("/health")).status_code == 200  # probes need no key
        assert (await r.client.get("/metrics")).status_code == 200


async def test_malformed_requests_get_openai_4xx(router: RouterFactory) -> None:
    up = FakeUpstream("r1")
    async with (
        serving(up),
        router(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [up.url]}) as r,
    ):
        # the bodies the engine refuses as invalid_json too (tests/server/test_errors.py)
        bad_bodies = [b"{not json", b"[1, 2]", b"", b'"text"', b"null", b"\xff\xfe"]
        for content in bad_bodies:
            resp = await r.client.post("/v1/completions", content=content)
            assert resp.status_code == 400, content
            assert _openai_error(resp)["type"] == "invalid_request_error"
            assert _openai_error(resp)["code"] == ErrorCode.INVALID_JSON
        resp = await r.client.get("/v1/completions")
        assert resp.status_code == 405 and resp.headers["allow"] == "POST"
        assert _openai_error(resp)["code"] == ErrorCode.METHOD_NOT_ALLOWED
        resp = await r.client.post("/v1/embeddings", json={})
        assert resp.status_code == 404
        assert _openai_error(resp)["code"] == ErrorCode.NOT_FOUND
        assert up.seen == []


async def test_no_upstream_is_503_with_retry_after(router: RouterFactory) -> None:
    async with router() as r:
        resp = await r.complete()
        assert resp.status_code == 503
        assert int(resp.headers["retry-after"]) > 0
        assert _openai_error(resp)["code"] == "no_upstream"
        assert _openai_error(resp)["type"] == "server_error"  # the engine's 503 type too
        ready = await r.client.get("/ready")
        assert ready.status_code == 503


async def test_unreachable_stable_is_502(router: RouterFactory) -> None:
    async with router(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [dead_url()]}) as r:
        resp = await r.complete()
        assert resp.status_code == 502
        assert _openai_error(resp)["code"] == "upstream_unreachable"
        assert _openai_error(resp)["type"] == "server_error"
        assert r.metric(m.REQUESTS, revision="r1", code="error") == 1
        # the refused replica is out of rotation now: no attempt at all, and /ready says so
        assert (await r.complete()).status_code == 503
        assert (await r.client.get("/ready")).status_code == 503


async def test_weight_change_applies_to_the_next_request(router: RouterFactory) -> None:
    r1, r2 = FakeUpstream("r1"), FakeUpstream("r2")
    async with serving(r1, r2):
        endpoints = {"r1": [r1.url], "r2": [r2.url]}
        async with router(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints=endpoints) as r:
            assert (await r.complete()).json()["served_by"] == "r1"
            r.set(
                traffic=[{"revision": "r1", "weight": 0}, {"revision": "r2", "weight": 100}], stable="r1", canary="r2",
                endpoints=endpoints,
            )
            assert (await r.complete()).json()["served_by"] == "r2"
            assert r.metric(m.WEIGHT, revision="r1") == 0
            assert r.metric(m.WEIGHT, revision="r2") == 100


async def test_upstream_breaking_mid_stream_ends_the_client_stream_cleanly(router: RouterFactory) -> None:
    up = FakeUpstream("r1", break_stream=True)  # an engine that writes no records: nothing to continue from
    async with (
        serving(up),
        router(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [up.url]}) as r,
    ):
        body = {"model": "m", "prompt": "hi", "stream": True}
        async with r.client.stream("POST", "/v1/completions", json=body) as resp:
            received = b"".join([chunk async for chunk in resp.aiter_raw()])
        events = [e.removeprefix(b"data: ") for e in received.split(b"\n\n") if e]
        assert b'"n": 1' in events[0]
        # not a cut connection: an error event in OpenAI's shape says the answer is incomplete, then [DONE]
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_error" and error["code"] == ErrorCode.UPSTREAM_UNREACHABLE
        assert events[-1] == b"[DONE]" and len(events) == 3
        assert r.metric(m.REQUESTS, revision="r1", code="error") == 1  # the broken attempt is charged
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 0


async def test_fewest_in_flight_replica_gets_the_next_request(router: RouterFactory) -> None:
    busy, idle = FakeUpstream("busy", hold=asyncio.Event()), FakeUpstream("idle")
    async with (
        serving(busy, idle),
        router(
            traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [busy.url, idle.url]},
            loadBalancing={"strategy": "LeastLoaded"},
        ) as r,
    ):  # fmt: skip
        pending = []
        while not busy.seen:  # park one request on `busy` (ties between idle replicas rotate)
            pending.append(asyncio.create_task(r.complete()))
            await asyncio.sleep(0.05)
        idle.seen.clear()
        for _ in range(6):  # round-robin would send half of these to `busy`
            assert (await r.complete()).json()["served_by"] == "idle"
        assert len(busy.seen) == 1
        assert busy.hold is not None
        busy.hold.set()
        assert {(await t).status_code for t in pending} == {200}


async def test_overflow_when_no_local_replica_exists(router: RouterFactory) -> None:
    remote = FakeUpstream("remote")
    async with (
        serving(remote),
        router(traffic=[{"revision": "r1", "weight": 100}], stable="r1", overflow={"url": remote.url}) as r,
    ):
        resp = await r.complete()
        assert resp.status_code == 200 and resp.json()["served_by"] == "remote"
        assert resp.headers["x-folio-revision"] == "overflow"
        assert r.metric(m.REQUESTS, revision="overflow", code="200") == 1


async def test_oversized_body_is_413(router: RouterFactory) -> None:
    up = FakeUpstream("r1")
    async with (
        serving(up),
        router(
            traffic=[{"revision": "r1", "weight": 100}], stable="r1",
            endpoints={"r1": [up.url]},
            app_options={"max_body_bytes": 1000},
        ) as r,
    ):
        resp = await r.client.post("/v1/completions", json={"prompt": "x" * 2000})
        assert resp.status_code == 413
        assert _openai_error(resp)["code"] == "body_too_large"
        assert (await r.client.post("/v1/completions", json={"prompt": "x" * 100})).status_code == 200
        assert len(up.seen) == 1


async def test_shadow_answers_are_compared_with_the_primary(router: RouterFactory) -> None:
    stable, canary = FakeUpstream("r1"), FakeUpstream("r2")
    async with (
        serving(stable, canary),
        router(**mirrored(stable, canary)) as r,
    ):
        async def send(stream: bool = False, **sampling: object) -> None:
            body = {"model": "m", "prompt": "hi", "stream": stream, **sampling}
            assert (await r.client.post("/v1/completions", json=body)).status_code == 200

        def count(result: str) -> float:
            return r.metric(m.SHADOW_COMPARISONS, revision="r2", result=result)

        for _ in range(3):
            await send(temperature=0)
        await send(stream=True, seed=7)
        await until(lambda: count("match") == 4, what="four matching comparisons")
        await send(temperature=0.7)  # not reproducible: mirrored, not compared
        await until(lambda: r.metric(m.SHADOW_REQUESTS, revision="r2", code="200") == 5, what="the fifth mirror")
        canary.text = "something else"
        await send(temperature=0)
        await send(stream=True, temperature=0)
        await until(lambda: count("mismatch") == 2, what="two mismatches")
        canary.status = 500
        await send(temperature=0)
        await until(lambda: count("error") == 1, what="a failed canary answer")
        assert count("match") == 4
        assert r.metric(f"{m.SHADOW_LATENCY_DIFFERENCE}_count", revision="r2") == 7
