"""Prefix- and session-affine placement with bounded load, end to end and against the split."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from folio.operator import metric_names as m
from folio.operator.router.affinity import affinity_key
from folio.operator.router.metrics import RouterMetrics
from folio.operator.router.ring import HashRing, key_hash
from folio.operator.router.state import RoutingState
from folio.operator.serving.router import RouterConfig
from tests.router.conftest import RouterFactory, RouterUnderTest
from tests.router.upstreams import FakeUpstream, serving
from tests.support.wait import until


def _system(tenant: int) -> str:
    return f"You are the assistant of tenant {tenant}. Answer politely and cite the handbook. " * 4


async def _chat(r: RouterUnderTest, system: str, question: str, **extra: object) -> str:
    body = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            **extra}
    resp = await r.client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200
    return resp.json()["served_by"]


def _fleet(n: int = 4, **knobs: object) -> list[FakeUpstream]:
    return [FakeUpstream(f"e{i}", **knobs) for i in range(n)]  # type: ignore[arg-type]


async def test_requests_sharing_a_prefix_meet_on_one_replica(router: RouterFactory) -> None:
    fleet = _fleet()
    async with serving(*fleet), router(
        traffic=[{"revision": "r1", "weight": 100}], endpoints={"r1": [u.url for u in fleet]}
    ) as r:
        homes: dict[int, set[str]] = {}
        for question in range(6):
            for tenant in range(8):
                homes.setdefault(tenant, set()).add(await _chat(r, _system(tenant), f"question {question}"))
        assert all(len(served) == 1 for served in homes.values()), homes  # one replica per tenant
        assert len(set().union(*homes.values())) > 1  # and the tenants spread over the fleet
        assert r.metric(m.PREFIX_AFFINITY, revision="r1", result="new") == 8  # each tenant's first: by load
        assert r.metric(m.PREFIX_AFFINITY, revision="r1", result="hit") == 40
        assert r.metric(m.PREFIX_AFFINITY, revision="r1", result="spill") == 0


async def test_least_loaded_spreads_the_same_requests(router: RouterFactory) -> None:
    fleet = _fleet()
    async with serving(*fleet), router(
        traffic=[{"revision": "r1", "weight": 100}], endpoints={"r1": [u.url for u in fleet]},
        loadBalancing={"strategy": "LeastLoaded"},
    ) as r:  # fmt: skip
        served = Counter([await _chat(r, _system(0), f"q{i}") for i in range(8)])
        assert served == {u.name: 2 for u in fleet}  # idle replicas take turns
        assert r.metric(m.PREFIX_AFFINITY, revision="r1", result="hit") == 0


async def test_a_hot_prefix_spills_to_other_replicas_instead_of_piling_up(router: RouterFactory) -> None:
    hold = asyncio.Event()
    fleet = _fleet(hold=hold)
    async with serving(*fleet), router(
        traffic=[{"revision": "r1", "weight": 100}], endpoints={"r1": [u.url for u in fleet]}
    ) as r:
        pending = [asyncio.create_task(_chat(r, _system(0), f"q{i}")) for i in range(12)]
        await until(lambda: sum(len(u.seen) for u in fleet) == 12, 10.0, "every request at a replica")
        per_replica = sorted(len(u.seen) for u in fleet)
        # the bound: at most ceil(1.25 x (11 + 1) / 4) = 4 on any replica, where one would take all 12
        assert per_replica[-1] == 4 and sum(n > 0 for n in per_replica) >= 3, per_replica
        hits = r.metric(m.PREFIX_AFFINITY, revision="r1", result="hit")
        spills = r.metric(m.PREFIX_AFFINITY, revision="r1", result="spill")
        assert r.metric(m.PREFIX_AFFINITY, revision="r1", result="new") == 1
        # a spill is a request that left every replica the prefix had been at: one per replica it reached
        assert spills == sum(n > 0 for n in per_replica) - 1 and hits == 12 - 1 - spills
        hold.set()
        await asyncio.gather(*pending)
        # once the burst is over the prefix goes home again: to its owner on the ring
        body = {"messages": [{"role": "system", "content": _system(0)}, {"role": "user", "content": "later"}]}
        key = affinity_key(body, [], r.app.state.balancer.settings.prefix_char_length)
        assert key is not None
        owner = HashRing(r.app.state.balancer.pool("r1"), lambda x: x.url).owner(key_hash(key))
        assert owner is not None
        home = next(u for u in fleet if u.url == owner.url)
        assert len(home.seen) == 4  # the owner took its full share of the burst
        assert {await _chat(r, _system(0), f"later {i}") for i in range(3)} == {home.name}


async def test_sessions_and_users_stay_together_without_sharing_a_prefix(router: RouterFactory) -> None:
    fleet = _fleet()
    async with serving(*fleet), router(
        traffic=[{"revision": "r1", "weight": 100}], endpoints={"r1": [u.url for u in fleet]}
    ) as r:
        for session in range(6):
            served = set()
            for turn in range(4):
                resp = await r.client.post(
                    "/v1/completions", json={"model": "m", "prompt": f"unrelated text {turn} {session}"},
                    headers={"X-Session-Id": f"conversation-{session}"},
                )  # fmt: skip
                served.add(resp.json()["served_by"])
            assert len(served) == 1
        by_user = {await _chat(r, f"system prompt {i}", f"question {i}", user="alice") for i in range(6)}
        assert len(by_user) == 1
        by_prompt = {await _chat(r, f"system prompt {i}", f"question {i}") for i in range(12)}
        assert len(by_prompt) > 1  # without the user field the same requests spread by their prefix


@pytest.mark.parametrize("strategy", ["PrefixHash", "LeastLoaded"])
def test_the_split_stays_exact_with_placement_inside_each_revision(strategy: str) -> None:
    state = RoutingState(RouterMetrics("chat"))
    state.apply(RouterConfig.parse({
        "traffic": [{"revision": "r1", "weight": 90}, {"revision": "r2", "weight": 10}],
        "endpoints": {"r1": [f"http://r1-{i}" for i in range(3)], "r2": [f"http://r2-{i}" for i in range(2)]},
        "loadBalancing": {"strategy": strategy},
    }))  # fmt: skip
    revisions = Counter[str]()
    for i in range(2000):
        primary = state.split.choose()
        replica = state.balancer.pick(primary, key=f"prefix\0tenant {i % 7}")
        assert replica is not None and replica.revision == primary
        revisions[replica.revision] += 1
    assert abs(revisions["r2"] / 2000 - 0.10) <= 0.02
    assert abs(revisions["r1"] / 2000 - 0.90) <= 0.02


async def test_the_router_follows_load_balancing_from_its_config(router: RouterFactory) -> None:
    fleet = _fleet(2)
    async with serving(*fleet), router(
        traffic=[{"revision": "r1", "weight": 100}], endpoints={"r1": [u.url for u in fleet]},
        loadBalancing={"strategy": "PrefixHash", "prefixCharLength": 5, "meanLoadFactor": 2},
    ) as r:  # fmt: skip
        assert r.app.state.balancer.settings.prefix_char_length == 5
        served = {(await r.complete(prompt=f"same {i} but after five chars")).json()["served_by"] for i in range(8)}
        assert len(served) == 1
        r.set(traffic=[{"revision": "r1", "weight": 100}], endpoints={"r1": [u.url for u in fleet]},
              loadBalancing={"strategy": "bogus"})
        assert r.app.state.balancer.settings.strategy == "PrefixHash"  # the default; the bad part is dropped
        assert any("loadBalancing" in p for p in r.app.state.config.problems)
