"""Adapters through the router: a request for an adapter goes to one of its revisions by its weights, under the
name the engines know that revision by; a failing adapter revision's attempts are retried on the adapter's
stable revision (on the same replica when it is the only one) and never eject the replica; `/v1/models`
lists each routed adapter once, under its own name."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from folio.operator import metric_names as m
from tests.router.conftest import RouterFactory
from tests.router.upstreams import FakeUpstream, serving


def config(*upstreams: FakeUpstream, sql: list[dict[str, Any]], stable: str = "s1", **more: Any) -> dict[str, Any]:
    return {
        "traffic": [{"revision": "b1", "weight": 100}], "stable": "b1",
        "endpoints": {"b1": [u.url for u in upstreams]},
        "adapters": {"sql": {"traffic": sql, "stable": stable}},
        **more,
    }  # fmt: skip


async def sql(r: Any, **body: Any) -> Any:
    return await r.client.post("/v1/completions", json={"model": "sql", "prompt": "SELECT", **body})


async def test_an_adapter_request_goes_to_its_revisions_by_their_weights(router: RouterFactory) -> None:
    up = FakeUpstream("b1")
    async with serving(up), router(**config(up, sql=[{"revision": "s1", "weight": 75},
                                                     {"revision": "s2", "weight": 25}])) as r:
        for _ in range(8):
            assert (await sql(r)).status_code == 200
        models = Counter(json.loads(seen.body)["model"] for seen in up.seen)
        assert models == {"sql@s1": 6, "sql@s2": 2}
        assert json.loads(up.seen[0].body)["prompt"] == "SELECT", "only the model changes"
        assert (await r.complete()).status_code == 200
        assert json.loads(up.seen[-1].body)["model"] == "m", "the base model's requests pass as they are"
        for rev, n in (("s1", 6), ("s2", 2)):
            assert r.metric(m.REQUESTS, revision="b1", adapter="sql", adapter_revision=rev, code="200") == n
            assert r.metric(f"{m.DURATION}_count", revision="b1", adapter="sql", adapter_revision=rev) == n
            assert r.metric(f"{m.TTFT}_count", revision="b1", adapter="sql", adapter_revision=rev) == n
        assert r.metric(m.REQUESTS, revision="b1", code="200") == 1


async def test_a_failing_adapter_revision_is_retried_on_the_stable_one_and_ejects_nothing(
        router: RouterFactory) -> None:
    ups = [FakeUpstream(f"u{i}", failing_models=frozenset({"sql@bad"})) for i in (1, 2)]
    settings = {"outlierDetection": {"consecutiveErrors": 1, "baseEjectionTime": "60s"}}
    async with serving(*ups), router(**config(*ups, sql=[{"revision": "s1", "weight": 50},
                                                         {"revision": "bad", "weight": 50}], **settings)) as r:
        for stream in (False, True) * 4:
            resp = await sql(r, stream=stream)
            assert resp.status_code == 200, resp.text
        assert r.metric(m.REQUESTS, revision="b1", adapter="sql", adapter_revision="bad", code="500") == 4
        assert r.metric(m.REQUESTS, revision="b1", adapter="sql", adapter_revision="s1", code="200") == 8
        assert r.metric(m.RETRIES, from_revision="b1", to_revision="b1") == 4
        ejected = sum(r.metric(m.EJECTED, revision="b1", replica=u.url) for u in ups)
        assert ejected == 0, "the adapter canary's errors are its own: the replicas serve everyone else"
        assert (await r.complete()).status_code == 200


async def test_a_failing_adapter_revision_is_retried_on_the_same_replica_when_it_is_the_only_one(
        router: RouterFactory) -> None:
    up = FakeUpstream("b1", failing_models=frozenset({"sql@bad"}))
    async with serving(up), router(**config(up, sql=[{"revision": "bad", "weight": 50},
                                                     {"revision": "s1", "weight": 50}])) as r:
        assert (await sql(r)).status_code == 200
        assert [json.loads(seen.body)["model"] for seen in up.seen] == ["sql@bad", "sql@s1"]


async def test_a_failing_stable_adapter_revision_counts_against_its_replica(router: RouterFactory) -> None:
    ups = [FakeUpstream(f"u{i}", failing_models=frozenset({"sql@s1"})) for i in (1, 2)]
    settings = {"outlierDetection": {"consecutiveErrors": 1, "baseEjectionTime": "60s"}}
    async with serving(*ups), router(**config(*ups, sql=[{"revision": "s1", "weight": 100}], **settings)) as r:
        assert (await sql(r)).status_code == 500  # tried on both replicas: nothing answers it
        ejected = sum(r.metric(m.EJECTED, revision="b1", replica=u.url) for u in ups)
        assert ejected == 1, "its stable revision failing is the replica's failure (at most half are ejected)"


async def test_models_lists_each_routed_adapter_once_under_its_name(router: RouterFactory) -> None:
    up = FakeUpstream("b1", adapters=("sql@s1", "sql@s2", "old@x1"))
    async with serving(up), router(**config(up, sql=[{"revision": "s1", "weight": 90},
                                                     {"revision": "s2", "weight": 10}])) as r:
        resp = await r.client.get("/v1/models")
        assert resp.status_code == 200
        assert [c["id"] for c in resp.json()["data"]] == ["m", "sql"], "old is no longer routed"
    async with serving(up), router(traffic=[{"revision": "b1", "weight": 100}], stable="b1",
                                   endpoints={"b1": [up.url]}) as r:
        ids = [c["id"] for c in (await r.client.get("/v1/models")).json()["data"]]
        assert ids == ["m", "sql@s1", "sql@s2", "old@x1"], "no adapters routed: the engine's answer as it is"
