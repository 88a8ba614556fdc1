"""What a request to the overflow endpoint (a remote service) carries: an allow-list of headers only."""

from __future__ import annotations

import pytest

from folio.operator.router.proxy import OVERFLOW_REQUEST_HEADERS
from tests.router.conftest import RouterFactory
from tests.router.upstreams import FakeUpstream, serving

CLIENT_HEADERS = {
    "Authorization": "Bearer client-key",
    "Cookie": "session=secret",
    "X-Foo": "internal",
    "X-Forwarded-User": "alice@example.com",
    "Accept": "application/json",
    "X-Request-Id": "req-123",
    "X-Client-Request-Id": "client-req-9",
    "OpenAI-Organization": "org-1",
    "OpenAI-Project": "proj-1",
    "OpenAI-Beta": "assistants=v2",
}
PASSED = ("Content-Type", "Accept", "X-Request-Id", "X-Client-Request-Id", "OpenAI-Organization", "OpenAI-Project",
          "OpenAI-Beta")
WITHHELD = ("Cookie", "X-Foo", "X-Forwarded-User")


@pytest.mark.parametrize("api_key", ["sk-remote", None])
async def test_only_allow_listed_headers_reach_the_overflow(router: RouterFactory, api_key: str | None) -> None:
    busy, remote = FakeUpstream("busy", status=429), FakeUpstream("remote")
    overflow = {"url": remote.url, **({"apiKey": api_key} if api_key else {})}
    async with serving(busy, remote):
        overflow["url"] = remote.url
        async with router(traffic=[{"revision": "r1", "weight": 100}], stable="r1",
                          endpoints={"r1": [busy.url]}, overflow=overflow, apiKeys=["client-key"]) as r:
            resp = await r.complete(**CLIENT_HEADERS)
            assert resp.status_code == 200 and resp.json()["served_by"] == "remote"

    local, seen = busy.seen[-1].headers, remote.seen[-1].headers
    for name in WITHHELD:  # Folio's own engines still get them
        assert local[name] == CLIENT_HEADERS[name]
        assert name not in seen
    for name in PASSED:
        assert seen[name] == (CLIENT_HEADERS.get(name) or "application/json")
    if api_key:
        assert seen.getall("Authorization") == [f"Bearer {api_key}"]  # the overflow's key, never the client's
    else:
        assert "Authorization" not in seen
    assert "client-key" not in str(seen) and "secret" not in str(seen)


async def test_overflow_without_local_replicas_gets_the_allow_list_too(router: RouterFactory) -> None:
    remote = FakeUpstream("remote")
    async with serving(remote), router(traffic=[{"revision": "r1", "weight": 100}], stable="r1",
                                       overflow={"url": remote.url}) as r:
        resp = await r.complete(**CLIENT_HEADERS)
        assert resp.status_code == 200
    seen = remote.seen[-1].headers
    assert not {"cookie", "x-foo", "x-forwarded-user", "authorization"} & {k.lower() for k in seen}
    assert seen["X-Request-Id"] == "req-123"


def test_the_allow_list_is_lower_case_and_has_no_credentials() -> None:
    assert all(name == name.lower() for name in OVERFLOW_REQUEST_HEADERS)
    assert not {"authorization", "cookie", "proxy-authorization"} & OVERFLOW_REQUEST_HEADERS
