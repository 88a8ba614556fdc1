"""The router's X-Folio-Priority (its tenant's, spec.access) on the engine: it takes the place of the request's
own `priority` on an engine scheduling by priority, and an fcfs engine ignores it."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from folio.engine.rules import PRIORITY_HEADER
from tests.server.conftest import MODEL, Running
from tests.server.fake_engine import FakeEngine


def ask(server: Running, headers: dict[str, str], **body: object) -> httpx.Response:
    with server.http() as http:
        return http.post("/v1/completions", headers=headers, json={"model": MODEL, "prompt": "hi", "max_tokens": 2,
                                                                   **body})  # fmt: skip


def test_the_routers_priority_is_the_requests_on_a_priority_engine(
    fake_server: Callable[..., Running],
) -> None:
    engine = FakeEngine(scheduling_policy="priority")
    server = fake_server(engine=engine)
    assert (
        ask(server, {PRIORITY_HEADER: "-1"}, priority=5).status_code == 200
    )  # the tenant's, not the client's
    assert ask(server, {PRIORITY_HEADER: "1"}).status_code == 200
    assert ask(server, {}, priority=3).status_code == 200  # no router in front: the field as sent
    assert (
        ask(server, {PRIORITY_HEADER: "garbled"}).status_code == 200
    )  # the router's bug: no client to blame
    assert [engine.priorities[r] for r in engine.priorities] == [-1, 1, 3, 0]


def test_an_fcfs_engine_ignores_the_routers_priority(fake_server: Callable[..., Running]) -> None:
    engine = FakeEngine()
    server = fake_server(engine=engine)
    resp = ask(server, {PRIORITY_HEADER: "-1"}, priority=5)
    assert resp.status_code == 200, resp.text
    assert list(engine.priorities.values()) == [0]
