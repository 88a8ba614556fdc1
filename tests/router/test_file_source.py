"""The JSON file the local runtime writes: weight changes take effect without a restart."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from folio.operator import metric_names as m
from folio.operator.router.sources import FileSource
from folio.operator.serving.router import RouterConfig
from tests.router.conftest import RouterFactory, RouterUnderTest
from tests.router.upstreams import FakeUpstream, serving
from tests.support.wait import until


def _write(path: Path, config: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config))
    os.replace(tmp, path)  # atomic, as a writer should


async def _until_weight(r: RouterUnderTest, revision: str, weight: float) -> None:
    await until(lambda: r.metric(m.WEIGHT, revision=revision) == weight, what=f"weight {weight} for {revision}")


async def test_weight_change_in_the_file_takes_effect_at_once(router: RouterFactory, tmp_path: Path) -> None:
    r1, r2 = FakeUpstream("r1"), FakeUpstream("r2")
    path = tmp_path / "router.json"
    async with serving(r1, r2):
        endpoints = {"r1": [r1.url], "r2": [r2.url]}
        _write(
            path,
            {
                "traffic": [{"revision": "r1", "weight": 100}, {"revision": "r2", "weight": 0}],
                "endpoints": endpoints,
            },
        )
        async with router(source=FileSource(path, interval=0.02)) as r:
            await _until_weight(r, "r1", 100)
            assert {(await r.complete()).json()["served_by"] for _ in range(5)} == {"r1"}

            _write(
                path,
                {
                    "traffic": [{"revision": "r1", "weight": 0}, {"revision": "r2", "weight": 100}],
                    "endpoints": endpoints,
                },
            )
            await _until_weight(r, "r2", 100)
            assert {(await r.complete()).json()["served_by"] for _ in range(5)} == {"r2"}

            # a broken file is reported and ignored: the last good config keeps serving
            path.write_text('{"traffic": [')
            await asyncio.sleep(0.1)
            assert (await r.complete()).json()["served_by"] == "r2"
            _write(
                path,
                {
                    "traffic": [{"revision": "r1", "weight": 50}, {"revision": "r2", "weight": 50}],
                    "endpoints": endpoints,
                },
            )
            await _until_weight(r, "r1", 50)
            served = [(await r.complete()).json()["served_by"] for _ in range(10)]
            assert served.count("r1") == served.count("r2") == 5


async def test_router_waits_for_a_missing_file(router: RouterFactory, tmp_path: Path) -> None:
    up = FakeUpstream("r1")
    path = tmp_path / "later.json"
    async with serving(up), router(source=FileSource(path, interval=0.02)) as r:
        before = await r.client.get("/ready")
        assert before.status_code == 503 and before.json()["config"] is None
        doc = {"traffic": [{"revision": "r1", "weight": 100}], "endpoints": {"r1": [up.url]}}
        _write(path, doc)
        await _until_weight(r, "r1", 100)
        # the config in force, as its writer (`folio up`) computes it before waiting for the router to follow
        fingerprint = RouterConfig.parse(doc).fingerprint()
        # and, per revision, the replicas in rotation
        ready = {"ready": True, "reason": "ok", "config": fingerprint, "replicas": {"r1": 1}}
        assert (await r.client.get("/ready")).json() == ready
        assert (await r.complete()).status_code == 200


async def test_a_bad_overflow_url_at_start_up_still_serves(router: RouterFactory, tmp_path: Path) -> None:
    """There is no last good config at start-up: the router must serve with what it can use."""
    up = FakeUpstream("r1")
    path = tmp_path / "router.json"
    async with serving(up):
        _write(path, {"traffic": [{"revision": "r1", "weight": 100}], "endpoints": {"r1": [up.url]},
                      "overflow": {"url": "ftp://x"}})  # fmt: skip
        async with router(source=FileSource(path, interval=0.02)) as r:
            await _until_weight(r, "r1", 100)
            codes = [(await r.complete()).status_code for _ in range(50)]
            assert codes == [200] * 50
            health = (await r.client.get("/health")).json()
            assert health["status"] == "ok" and "overflow ignored" in health["configProblems"][0]
