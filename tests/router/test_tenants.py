"""spec.access in the router: tenants by API key from a Secret, their quotas, priorities and metering."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from folio.engine.rules import PRIORITY_HEADER
from folio.operator import metric_names as m
from folio.operator.router.quota import Bucket, Limits, TenantQuota, duration
from folio.operator.router.secrets import FolderSecrets, decode_secret
from folio.operator.router.tenants import Meter, TenantKeys, presented_key
from tests.router.conftest import RouterFactory, RouterUnderTest
from tests.router.upstreams import FakeUpstream, serving
from tests.support.wait import until

TRAFFIC = {"traffic": [{"revision": "r1", "weight": 100}], "stable": "r1"}


# ------------------------------------------------------------------------------------------- quotas


def test_a_bucket_bursts_a_minute_then_refills_at_its_rate() -> None:
    bucket = Bucket(60, now=0.0)  # one a second
    for _ in range(60):
        bucket.take(1)
    assert not bucket.can_take(1, 0.0) and bucket.wait(1, 0.0) == pytest.approx(1.0)
    assert bucket.can_take(1, 1.0) and not bucket.can_take(2, 1.0)
    assert bucket.until_full(1.0) == pytest.approx(59.0)
    assert bucket.level(1000.0) == 60  # never more than a minute's worth


def test_tokens_are_reserved_then_settled_from_the_usage() -> None:
    quota = TenantQuota(Limits(tokens_per_minute=600), now=0.0)
    assert quota.tokens is not None
    quota.admit(500)
    assert quota.refusal(200, 0.0) is not None  # 100 left of the 600
    quota.settle(500, 50, 0.0)  # the answer used 50: 450 given back
    assert quota.tokens.level(0.0) == pytest.approx(550) and quota.in_flight == 0
    quota.admit(100)
    quota.settle(100, 700, 0.0)  # more than reserved: the bucket goes into debt, waited out later
    assert quota.tokens.level(0.0) == pytest.approx(-150)
    refusal = quota.refusal(10, 0.0)
    assert refusal is not None and refusal.retry_after == pytest.approx(16.0)  # 160 tokens at 10 a second


def test_a_request_larger_than_a_minute_goes_from_a_full_bucket_only() -> None:
    quota = TenantQuota(Limits(tokens_per_minute=100), now=0.0)
    assert quota.refusal(1000, 0.0) is None  # never refused for ever
    quota.admit(1000)
    assert quota.refusal(1, 0.0) is not None


def test_in_flight_and_the_routers_share() -> None:
    quota = TenantQuota(Limits(max_in_flight=5, requests_per_minute=10), now=0.0, share=0.5)
    assert quota.max_in_flight == 2 and quota.requests is not None and quota.requests.capacity == 5
    quota.admit(0)
    quota.admit(0)
    refusal = quota.refusal(0, 0.0)
    assert refusal is not None and "maxInFlight" in refusal.message
    quota.settle(0, 0, 0.0)
    assert quota.refusal(0, 0.0) is None
    # a new share keeps what was used, as a fraction: 2 of 5 used is 4 of 10
    assert quota.requests.level(0.0) == 3
    wider = quota.reshare(quota.limits, 1.0, 0.0)
    assert wider.requests is not None and wider.requests.level(0.0) == pytest.approx(6) and wider.in_flight == 1


def test_headers_in_openai_form() -> None:
    quota = TenantQuota(Limits(requests_per_minute=60, tokens_per_minute=1000), now=0.0)
    quota.admit(400)
    assert dict(quota.headers(0.0)) == {
        "x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s", "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "600", "x-ratelimit-reset-tokens": "24s",
    }  # fmt: skip
    assert TenantQuota(Limits(max_in_flight=3), now=0.0).headers(0.0) == []
    assert [duration(s) for s in (0.2501, 1.0, 59.2, 360.0)] == ["251ms", "1s", "1m0s", "6m0s"]


# --------------------------------------------------------------------------------------------- keys


def test_keys_name_their_tenant_and_a_shared_key_names_none() -> None:
    keys = TenantKeys({"search": ["k1", "k2"], "batch": ["k3", "shared"], "eval": ["shared"]}, ["search", "ghost"])
    assert keys.identify(b"k1") == keys.identify(b"k2") == "search" and keys.identify(b"k3") == "batch"
    assert keys.identify(b"shared") is None and keys.identify(b"k") is None and keys.identify(b"") is None
    assert keys.tenants == {"search", "batch"}
    assert any("batch, eval" in p for p in keys.problems) and any("'ghost'" in p for p in keys.problems)
    assert "shared" not in repr(keys.problems) and "k1" not in repr(vars(keys))  # digests only


def test_a_key_is_presented_as_a_bearer_token_or_an_api_key_header() -> None:
    assert presented_key("Bearer sk-1", None) == b"sk-1" and presented_key("bearer  sk-1 ", None) == b"sk-1"
    assert presented_key(None, "sk-2") == b"sk-2" and presented_key("Basic xyz", "sk-2") == b"sk-2"
    assert presented_key("Basic xyz", None) is None and presented_key("Bearer ", "") is None


def test_a_secret_is_decoded_line_by_line() -> None:
    import base64

    data = {"search": base64.b64encode(b"k1\n# old\n\n k2 \n").decode(), "bad": "%%%"}
    assert decode_secret({"data": data}) == {"search": ["k1", "k2"]}


def test_the_reservation_counts_prompt_and_budget() -> None:
    body = b'{"prompt": "' + b"x" * 396 + b'", "max_tokens": 50, "n": 2}'
    meter = Meter.reserve("t", "/v1/completions", body, {"max_tokens": 50, "n": 2})
    assert meter.prompt_estimate == len(body) // 4 + 1 and meter.reserved == meter.prompt_estimate + 100
    chat = Meter.reserve("t", "/v1/chat/completions", b"{}", {})
    assert chat.reserved == chat.prompt_estimate + 256
    assert chat.used == chat.reserved  # nothing seen: the reservation stands
    chat.read_usage(b'{"usage": {"prompt_tokens": 7, "completion_tokens": 3}}')
    assert chat.used == 10


# ------------------------------------------------------------------------------------------- router


def write_secret(root: Path, name: str, keys: dict[str, str]) -> None:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    for tenant, value in keys.items():
        (folder / tenant).write_text(value)


def access(**fields: Any) -> dict[str, Any]:
    return {"apiKeysSecret": "llm-keys", **fields}


async def post(r: RouterUnderTest, key: str | None = None, *, extra: dict[str, str] | None = None, **body: Any) -> Any:
    headers = {**({} if key is None else {"Authorization": f"Bearer {key}"}), **(extra or {})}
    return await r.client.post("/v1/completions", json={"model": "m", "prompt": "hi", **body}, headers=headers)


async def test_keys_from_the_secret_decide_who_is_served(router: RouterFactory, tmp_path: Path) -> None:
    write_secret(tmp_path, "llm-keys", {"search": "sk-search\n", "batch": "sk-batch"})
    up = FakeUpstream("r1")
    tenants = [{"name": "search", "priority": "Critical"}, {"name": "batch", "priority": "Sheddable"}]
    async with serving(up), router(endpoints={"r1": [up.url]}, access=access(tenants=tenants), **TRAFFIC,
                                   app_options={"secrets": FolderSecrets(tmp_path, 0.05)}) as r:  # fmt: skip
        await until(lambda: r.app.state.tenants is not None and r.app.state.tenants.keys.tenants)
        resp = await post(r)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
        assert (await post(r, "sk-wrong")).status_code == 401
        assert (await post(r, "sk-search", extra={PRIORITY_HEADER: "-5"})).status_code == 200
        assert up.seen[-1].headers[PRIORITY_HEADER] == "-1"  # Critical, whatever the client said
        assert (await post(r, extra={"api-key": "sk-batch", PRIORITY_HEADER: "-9"})).status_code == 200
        assert up.seen[-1].headers[PRIORITY_HEADER] == "1"  # Sheddable
        assert not {"authorization", "api-key"} & {k.lower() for k in up.seen[-1].headers}  # keys stay here
        assert r.metric(m.TENANT_REQUESTS, tenant="search", code="200") == 1
        assert r.metric(m.TENANT_REQUESTS, tenant="batch", code="200") == 1
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 2  # 401s reach no upstream counter
        assert "sk-" not in r.app.metrics.render().decode()

        # Rotation: a second key first, then the old one removed; neither restarts anything.
        write_secret(tmp_path, "llm-keys", {"search": "sk-search\nsk-search-2\n", "batch": "sk-batch"})
        await until(lambda: r.app.state.tenants is not None and r.app.state.tenants.keys.identify(b"sk-search-2"))
        assert (await post(r, "sk-search")).status_code == 200 and (await post(r, "sk-search-2")).status_code == 200
        write_secret(tmp_path, "llm-keys", {"search": "sk-search-2\n", "batch": "sk-batch"})
        await until(lambda: r.app.state.tenants is not None and not r.app.state.tenants.keys.identify(b"sk-search"))
        assert (await post(r, "sk-search")).status_code == 401 and (await post(r, "sk-search-2")).status_code == 200


async def test_over_quota_is_a_429_with_when_to_retry(router: RouterFactory, tmp_path: Path) -> None:
    write_secret(tmp_path, "llm-keys", {"search": "sk-search", "batch": "sk-batch"})
    up = FakeUpstream("r1", usage={"prompt_tokens": 5, "completion_tokens": 7})
    tenants = [{"name": "batch", "requestsPerMinute": 2, "tokensPerMinute": 100000}]
    async with serving(up), router(endpoints={"r1": [up.url]}, access=access(tenants=tenants), **TRAFFIC,
                                   app_options={"secrets": FolderSecrets(tmp_path, 0.05)}) as r:  # fmt: skip
        await until(lambda: r.app.state.tenants is not None and r.app.state.tenants.keys.tenants)
        first = await post(r, "sk-batch", max_tokens=10)
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-requests"] == "2" and first.headers["x-ratelimit-remaining-requests"] == "1"
        assert first.headers["x-ratelimit-limit-tokens"] == "100000"
        assert (await post(r, "sk-batch")).status_code == 200
        over = await post(r, "sk-batch")
        assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(over.headers["Retry-After"]) >= 1 and over.headers["x-ratelimit-remaining-requests"] == "0"
        assert "requests per minute" in over.json()["error"]["message"]
        assert (await post(r, "sk-search")).status_code == 200  # another tenant is not held back
        assert "x-ratelimit-limit-requests" not in (await post(r, "sk-search")).headers  # it has no limits
        assert r.metric(m.TENANT_REQUESTS, tenant="batch", code="429") == 1
        assert r.metric(m.REQUESTS, revision="r1", code="429") == 0  # never the canary's error
        # the answers' usage settles the reservations and is metered
        assert r.metric(m.TENANT_TOKENS, tenant="batch", kind="prompt") == 10
        assert r.metric(m.TENANT_TOKENS, tenant="batch", kind="completion") == 14
        tokens = r.app.state.tenants.quotas["batch"].tokens
        assert tokens is not None and tokens.level(0) >= 100000 - 24 - 1


async def test_max_in_flight_refuses_the_one_too_many(router: RouterFactory, tmp_path: Path) -> None:
    write_secret(tmp_path, "llm-keys", {"batch": "sk-batch"})
    up = FakeUpstream("r1", hold=asyncio.Event())
    async with serving(up), router(endpoints={"r1": [up.url]}, **TRAFFIC,
                                   access=access(tenants=[{"name": "batch", "maxInFlight": 1}]),
                                   app_options={"secrets": FolderSecrets(tmp_path, 0.05)}) as r:  # fmt: skip
        await until(lambda: r.app.state.tenants is not None and r.app.state.tenants.keys.tenants)
        first = asyncio.create_task(post(r, "sk-batch"))
        await until(lambda: len(up.seen) == 1)
        second = await post(r, "sk-batch")
        assert second.status_code == 429 and "maxInFlight" in second.json()["error"]["message"]
        assert up.hold is not None
        up.hold.set()
        assert (await first).status_code == 200
        assert (await post(r, "sk-batch")).status_code == 200  # its place was given back


async def test_no_secret_serves_nobody_and_says_why(router: RouterFactory, tmp_path: Path) -> None:
    up = FakeUpstream("r1")
    async with serving(up), router(endpoints={"r1": [up.url]}, access=access(tenants=[{"name": "search"}]),
                                   **TRAFFIC, app_options={"secrets": FolderSecrets(tmp_path, 0.05)}) as r:  # fmt: skip
        await until(lambda: r.app.state.access_problems)
        assert (await post(r, "anything")).status_code == 401 and (await post(r)).status_code == 401
        problems = (await r.client.get("/health")).json()["configProblems"]
        assert any("'llm-keys' is missing" in p for p in problems)
        # the Secret appears: its tenants are served; the tenant it lacks is reported
        write_secret(tmp_path, "llm-keys", {"batch": "sk-batch"})
        await until(lambda: r.app.state.tenants is not None and r.app.state.tenants.keys.tenants)
        assert (await post(r, "sk-batch")).status_code == 200
        problems = (await r.client.get("/health")).json()["configProblems"]
        assert problems == ["tenant 'search' has no API key in the Secret"]
    assert len(up.seen) == 1


async def test_anonymous_callers_are_a_tenant_of_their_own(router: RouterFactory) -> None:
    up = FakeUpstream("r1")
    limits = [{"name": "anonymous", "requestsPerMinute": 1, "priority": "Sheddable"}]
    async with serving(up), router(endpoints={"r1": [up.url]}, **TRAFFIC,
                                   access={"anonymous": True, "tenants": limits}) as r:  # fmt: skip
        assert (await post(r)).status_code == 200 and up.seen[-1].headers[PRIORITY_HEADER] == "1"
        assert (await post(r)).status_code == 429
        assert (await post(r, "sk-unknown")).status_code == 401  # a wrong key is not anonymous
        assert r.metric(m.TENANT_REQUESTS, tenant="anonymous", code="429") == 1


async def test_without_access_nothing_changes(router: RouterFactory) -> None:
    up = FakeUpstream("r1")
    async with serving(up), router(endpoints={"r1": [up.url]}, **TRAFFIC) as r:
        resp = await post(r, extra={PRIORITY_HEADER: "-1"})
        assert resp.status_code == 200 and "x-ratelimit-limit-requests" not in resp.headers
        assert PRIORITY_HEADER not in up.seen[-1].headers  # a client never sets it


async def test_a_tenants_bad_request_is_metered_as_its_own(router: RouterFactory, tmp_path: Path) -> None:
    write_secret(tmp_path, "llm-keys", {"search": "sk-search"})
    up = FakeUpstream("r1")
    async with serving(up), router(endpoints={"r1": [up.url]}, access=access(), **TRAFFIC,
                                   app_options={"secrets": FolderSecrets(tmp_path, 0.05)}) as r:  # fmt: skip
        await until(lambda: r.app.state.tenants is not None and r.app.state.tenants.keys.tenants)
        resp = await r.client.post("/v1/completions", content=b"[1]", headers={"Authorization": "Bearer sk-search"})
        assert resp.status_code == 400 and r.metric(m.TENANT_REQUESTS, tenant="search", code="400") == 1
    assert not up.seen


async def test_the_router_tells_each_tenants_usage(router: RouterFactory, tmp_path: Path) -> None:
    write_secret(tmp_path, "llm-keys", {"batch": "sk-batch"})
    up = FakeUpstream("r1", usage={"prompt_tokens": 5, "completion_tokens": 7})
    async with serving(up), router(endpoints={"r1": [up.url]}, **TRAFFIC,
                                   access=access(tenants=[{"name": "batch", "requestsPerMinute": 1}]),
                                   app_options={"secrets": FolderSecrets(tmp_path, 0.05)}) as r:  # fmt: skip
        await until(lambda: r.app.state.tenants is not None and r.app.state.tenants.keys.tenants)
        assert (await post(r, "sk-batch")).status_code == 200 and (await post(r, "sk-batch")).status_code == 429
        usage = (await r.client.get("/folio/v1/tenants")).json()["tenants"]
        assert usage["batch"]["minute"] == usage["batch"]["hour"] == {
            "requests": 2, "rate_limited": 1, "errors": 0, "prompt_tokens": 5, "completion_tokens": 7}
        assert "sk-" not in str(usage)


@pytest.mark.parametrize(
    ("body", "used"),
    [
        (b'{"choices":[{"text":"say \\"usage\\": {\\"prompt_tokens\\": 99}"}],"usage":{"prompt_tokens":7,'
         b'"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}', 10),  # quoted in the text
        (b'{"usage":{"prompt_tokens":1,"completion_tokens":2},"id":"x"}', 3),  # not last
        (b'{"choices": [], "usage" : {"prompt_tokens": 4, "completion_tokens": 4}}', 8),  # spaced
        (b'{"choices":[],"usage":null}', 50),  # none: the reservation stands
        (b'{"usage":{"prompt_tokens":1,', 50),  # cut short
        (b'not json', 50),
    ],
)
def test_the_usage_is_read_wherever_the_answer_puts_it(body: bytes, used: int) -> None:
    meter = Meter("t", prompt_estimate=10, reserved=50)
    meter.read_usage(body)
    assert meter.used == used
