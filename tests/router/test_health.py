"""Active health checks take a failing replica out of rotation and put it back when it recovers."""

from __future__ import annotations

from tests.router.conftest import RouterFactory
from tests.router.upstreams import FakeUpstream, serving
from tests.support.wait import until


async def test_failing_replica_is_ejected_and_returns(router: RouterFactory) -> None:
    good, sick = FakeUpstream("good"), FakeUpstream("sick")
    async with (
        serving(good, sick),
        router(
            traffic=[{"revision": "r1", "weight": 100}],
            endpoints={"r1": [good.url, sick.url]},
            loadBalancing={"strategy": "LeastLoaded"},  # alike requests spread, so both get some
            app_options={"health_interval": 0.02},
        ) as r,
    ):
        replica = {x.url: x for x in r.app.state.balancer.replicas()}[sick.url]
        served = {(await r.complete()).json()["served_by"] for _ in range(4)}
        assert served == {"good", "sick"}

        sick.health_status = 503
        await until(lambda: not replica.healthy)
        assert "503" in replica.last_error
        sick.seen.clear()
        assert {(await r.complete()).json()["served_by"] for _ in range(6)} == {"good"}
        assert sick.seen == []

        sick.health_status = 200
        await until(lambda: replica.healthy)
        assert {(await r.complete()).json()["served_by"] for _ in range(4)} == {"good", "sick"}


async def test_refused_replica_comes_back_once_it_listens_again(router: RouterFactory) -> None:
    up = FakeUpstream("r1")
    async with serving(up):
        pass  # now `up.url` is an address nothing listens on
    async with router(
        traffic=[{"revision": "r1", "weight": 100}],
        endpoints={"r1": [up.url]},
        app_options={"health_interval": 0.02},
    ) as r:
        replica = r.app.state.balancer.replicas()[0]
        assert (await r.complete()).status_code in (502, 503)  # refused, or already known to be down
        await until(lambda: not replica.healthy)
        assert (await r.complete()).status_code == 503
        assert (await r.client.get("/ready")).status_code == 503
        async with serving(up):  # the engine restarts on the same address
            await until(lambda: replica.healthy)
            assert (await r.complete()).status_code == 200
            assert (await r.client.get("/ready")).status_code == 200
