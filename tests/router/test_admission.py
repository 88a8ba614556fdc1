"""The admission queue of saturated replicas: who runs, who waits, who is shed, and why."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from folio.operator import metric_names as m
from folio.operator.router.admission import Admission, Shed
from folio.operator.router.fair import RANK, Claim
from folio.operator.router.metrics import RouterMetrics
from folio.operator.router.secrets import FolderSecrets
from folio.operator.router.state import RoutingState
from folio.operator.serving.router import RouterConfig
from tests.router.conftest import RouterFactory
from tests.router.test_tenants import TRAFFIC, access, post, write_secret
from tests.router.upstreams import FakeUpstream, serving
from tests.support.wait import until

CRITICAL, STANDARD, SHEDDABLE = (Claim(t, RANK[t]) for t in ("Critical", "Standard", "Sheddable"))


def admission(slots: int = 2, replicas: int = 1, **options: Any) -> Admission:
    state = RoutingState(RouterMetrics("chat"))
    state.apply(RouterConfig.parse({
        **TRAFFIC, "endpoints": {"r1": [f"http://10.0.0.{i}:8000" for i in range(replicas)]},
        "access": {"anonymous": True, "slots": slots},
    }))  # fmt: skip
    return Admission(state, state.metrics, **options)


def shed(adm: Admission, tenant: str, reason: str) -> float:
    value = adm.metrics.registry.get_sample_value(m.TENANT_SHED, {"isvc": "chat", "tenant": tenant,
                                                                              "reason": reason})  # fmt: skip
    return value or 0.0


async def test_the_slots_of_every_usable_replica_less_other_callers_load_are_the_capacity() -> None:
    adm = admission(slots=4, replicas=2)
    assert adm.capacity() == 8
    one, other = adm.state.balancer.replicas()
    other.engine_requests, other.ours_at_scrape, other.scraped_at = 3, 0, time.monotonic()
    assert adm.capacity() == 5  # another router's 3 requests on it
    one.mark_down("gone")
    assert adm.capacity() == 1
    other.mark_down("gone")
    assert adm.capacity() is None  # nothing usable: the hold queue's case, not this one's


async def test_past_the_slots_requests_wait_and_go_in_order_as_others_end() -> None:
    adm = admission(slots=2)
    a, b = await adm.enter(STANDARD), await adm.enter(STANDARD)
    waiting = [asyncio.create_task(adm.enter(claim)) for claim in (SHEDDABLE, STANDARD)]
    await until(lambda: adm.waiting == 2)
    adm.leave(a)
    standard = await waiting[1]  # the Standard one first, though it came after
    assert not waiting[0].done() and adm.running(RANK["Standard"]) == 2
    adm.leave(b)
    sheddable = await waiting[0]
    adm.leave(standard)
    adm.leave(sheddable)
    assert adm.waiting == 0 and [adm.running(r) for r in range(3)] == [0, 0, 0]


async def test_a_priority_counts_the_ones_below_it_as_room() -> None:
    adm = admission(slots=2)
    low = [await adm.enter(SHEDDABLE), await adm.enter(SHEDDABLE)]
    critical = [await adm.enter(CRITICAL), await adm.enter(CRITICAL)]  # the engines preempt the Sheddable ones
    standard = asyncio.create_task(adm.enter(STANDARD))  # Critical ones fill the slots: it waits
    await until(lambda: adm.waiting == 1)
    adm.leave(critical[0])
    adm.leave(await standard)
    for ticket in (critical[1], *low):
        adm.leave(ticket)


async def test_sheddable_requests_wait_no_deeper_than_the_slots() -> None:
    adm = admission(slots=2)
    running = [await adm.enter(SHEDDABLE) for _ in range(2)]
    waiting = [asyncio.create_task(adm.enter(SHEDDABLE)) for _ in range(2)]
    await until(lambda: adm.waiting == 2)
    with pytest.raises(Shed) as refused:
        await adm.enter(SHEDDABLE)
    assert refused.value.reason == "full" and "retry after" in str(refused.value)
    assert shed(adm, "Sheddable", "full") == 1
    for ticket in running:
        adm.leave(ticket)
    for task in waiting:
        adm.leave(await task)


async def test_a_higher_priority_displaces_the_newest_lower_one_from_a_full_queue() -> None:
    adm = admission(slots=1, limit=2)
    first = await adm.enter(CRITICAL)
    standard, sheddable = asyncio.create_task(adm.enter(STANDARD)), asyncio.create_task(adm.enter(SHEDDABLE))
    await until(lambda: adm.waiting == 2)
    critical = asyncio.create_task(adm.enter(CRITICAL))  # full: the Sheddable one goes
    with pytest.raises(Shed) as displaced:
        await sheddable
    assert displaced.value.reason == "displaced" and shed(adm, "Sheddable", "displaced") == 1
    adm.leave(first)
    adm.leave(await critical)
    adm.leave(await standard)


async def test_a_request_waits_no_longer_than_the_bound_and_a_client_that_leaves_frees_its_place() -> None:
    adm = admission(slots=1, timeout=0.2)
    first = await adm.enter(STANDARD)
    with pytest.raises(Shed) as late:
        await adm.enter(STANDARD)
    assert late.value.reason == "timeout" and adm.waiting == 0
    gone = asyncio.create_task(adm.enter(STANDARD))
    await until(lambda: adm.waiting == 1)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert adm.waiting == 0
    adm.leave(first)
    assert adm.running(STANDARD.rank) == 0


async def test_a_replica_that_turns_usable_takes_waiting_requests_without_any_ending() -> None:
    adm = admission(slots=1, replicas=2, poll=0.05)
    _, two = adm.state.balancer.replicas()
    two.mark_down("starting")
    first = await adm.enter(STANDARD)
    waiting = asyncio.create_task(adm.enter(STANDARD))
    await until(lambda: adm.waiting == 1)
    two.mark_up()
    second = await waiting
    adm.leave(first)
    adm.leave(second)
    await adm.close()


# --------------------------------------------------------------------------------------- router


async def test_the_router_sheds_sheddable_requests_and_keeps_serving_critical_ones(
    router: RouterFactory, tmp_path: Path
) -> None:
    write_secret(tmp_path, "llm-keys", {"search": "sk-search", "batch": "sk-batch"})
    up = FakeUpstream("r1", hold=asyncio.Event())
    tenants = [{"name": "search", "priority": "Critical"}, {"name": "batch", "priority": "Sheddable"}]
    async with serving(up), router(endpoints={"r1": [up.url]}, access=access(tenants=tenants, slots=1), **TRAFFIC,
                                   app_options={"secrets": FolderSecrets(tmp_path, 0.05)}) as r:  # fmt: skip
        await until(lambda: r.app.state.tenants is not None and r.app.state.tenants.keys.tenants)
        batch = [asyncio.create_task(post(r, "sk-batch")) for _ in range(2)]
        await until(lambda: len(up.seen) == 1 and r.app.admission.waiting == 1)  # one runs, one waits
        refused = await post(r, "sk-batch")
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["code"] == "server_overloaded"
        search = asyncio.create_task(post(r, "sk-search"))
        await until(lambda: len(up.seen) == 2)  # at once: the engine gives it the Sheddable one's place
        assert up.hold is not None
        up.hold.set()
        assert (await search).status_code == 200
        assert [(await t).status_code for t in batch] == [200, 200]
        assert r.metric(m.TENANT_SHED, tenant="batch", reason="full") == 1
        assert r.metric(m.TENANT_REQUESTS, tenant="batch", code="503") == 1
        assert r.metric(m.REQUESTS, revision="r1", code="503") == 0  # shed: never a revision's error
        assert r.metric(m.TENANT_QUEUE + "_count", tenant="batch") == 2
        assert r.metric(m.TENANT_QUEUE + "_count", tenant="search") == 1


async def test_the_hold_of_scale_from_zero_keeps_the_priorities(router: RouterFactory, tmp_path: Path) -> None:
    write_secret(tmp_path, "llm-keys", {"search": "sk-search", "batch": "sk-batch"})
    up = FakeUpstream("r1")
    tenants = [{"name": "search", "priority": "Critical"}, {"name": "batch", "priority": "Sheddable"}]
    config = {**TRAFFIC, "stable": "r1", "access": access(tenants=tenants),
              "holding": {"maxHeldRequests": 1, "holdTimeout": 30, "releasePerReplica": 1}}
    async with serving(up), router(endpoints={"r1": []}, app_options={"secrets": FolderSecrets(tmp_path, 0.05)},
                                   **config) as r:  # fmt: skip
        await until(lambda: r.app.state.tenants is not None and r.app.state.tenants.keys.tenants)
        batch = asyncio.create_task(post(r, "sk-batch"))
        await until(lambda: r.metric(m.HELD) == 1)
        search = asyncio.create_task(post(r, "sk-search"))  # the hold is full: it takes the Sheddable one's place
        refused = await batch
        assert refused.status_code == 503 and "higher priority" in refused.json()["error"]["message"]
        assert r.metric(m.HELD_TOTAL, outcome="full") == 1
        r.set(**config, endpoints={"r1": [up.url]})
        assert (await search).status_code == 200
        assert r.metric(m.HELD_TOTAL, outcome="served") == 1
