"""Answers that survive their replica: continued elsewhere after the first byte, token-exact, one answer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from folio.engine.server.continuation import RESPONSE_ID_HEADER, RESUMABLE_HEADER, RESUME_FIELD
from folio.engine.server.openai_errors import ErrorCode
from folio.operator import metric_names as m
from tests.router.conftest import RouterFactory, RouterUnderTest
from tests.router.upstreams import FakeUpstream, dead_url, expected_stream, serving, token, whole_answer
from tests.support.wait import until

pytestmark = pytest.mark.timeout(60)

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


def one_revision(*replicas: FakeUpstream | str, **config: Any) -> dict[str, Any]:
    """r1 alone on ``replicas`` in this order; the first request goes to the first (least loaded, in turn)."""
    urls = [r if isinstance(r, str) else r.url for r in replicas]
    return {
        "traffic": [{"revision": "r1", "weight": 100}], "stable": "r1", "endpoints": {"r1": urls},
        "loadBalancing": {"strategy": "LeastLoaded"},
        # one failure ejects: the proof that outlier detection was told
        "outlierDetection": {"consecutiveErrors": 1, "maxEjectionPercent": 100, "baseEjectionTime": "300s"},
        **config,
    }  # fmt: skip


def request(path: str, stream: bool = True, **extra: Any) -> dict[str, Any]:
    if path == CHAT:
        return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra}
    return {"model": "m", "prompt": "hi", "stream": stream, **extra}


async def stream(r: RouterUnderTest, path: str, body: dict[str, Any]) -> tuple[httpx.Response, bytes]:
    async with r.client.stream("POST", path, json=body) as resp:
        return resp, b"".join([chunk async for chunk in resp.aiter_raw()])


def migrations(r: RouterUnderTest, revision: str, reason: str, outcome: str) -> float:
    return r.metric(m.MIGRATIONS, revision=revision, reason=reason, outcome=outcome)


def error_event(body: bytes) -> dict[str, Any]:
    """The OpenAI-shaped error event that ends an answer that could not go on, before [DONE]."""
    events = [e for e in body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]", body
    error = json.loads(events[-2].removeprefix(b"data: "))["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    ErrorCode(error["code"])
    return error


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
@pytest.mark.parametrize(
    ("fault", "reason", "code"),
    [({"die_after": 2}, m.MIGRATION_RESET, "error"), ({"fail_after": 2}, m.MIGRATION_ENGINE_ERROR, "error"),
     ({"stall_after": 2}, m.MIGRATION_TIMEOUT, m.TIMEOUT)],
)  # fmt: skip
async def test_a_stream_is_continued_on_another_replica_token_exact(
    router: RouterFactory, path: str, fault: dict[str, int], reason: str, code: str
) -> None:
    dying, healthy = FakeUpstream("a", resumable=True, **fault), FakeUpstream("b", resumable=True)
    migration = {"maxAttempts": 3, "interChunkTimeout": "0.2s"}
    async with serving(dying, healthy), router(**one_revision(dying, healthy, migration=migration)) as r:
        body = request(path)
        resp, received = await stream(r, path, body)
        assert resp.status_code == 200
        assert received == expected_stream(body, path)  # one unbroken answer, no record, no seam
        assert b"folio-resume" not in received
        assert RESPONSE_ID_HEADER not in resp.headers and RESUMABLE_HEADER not in resp.headers
        assert dying.seen[0].headers[RESUMABLE_HEADER] == "1"
        assert RESUME_FIELD not in json.loads(dying.seen[0].body)
        # what the client had, and only that, went to the continuation: two events' tokens (chat: an opening
        # without tokens first)
        delivered = [token(0, 0), token(0, 1)] if path == COMPLETIONS else [token(0, 0)]
        assert healthy.resumes == [{"id": "cmpl-0", "created": 1_700_000_000, "choices": [
            {"index": 0, "token_ids": delivered, "finish_reason": None, "stop_reason": None}]}]  # fmt: skip
        assert {k: v for k, v in json.loads(healthy.seen[0].body).items() if k != RESUME_FIELD} == body
        assert migrations(r, "r1", reason, m.MIGRATION_CONTINUED) == 1
        assert r.metric(f"{m.MIGRATION_GAP}_count", revision="r1") == 1
        assert r.metric(m.REQUESTS, revision="r1", code=code) == 1  # the dead attempt, charged as such
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 1  # the continuation
        assert r.metric(m.EJECTIONS, revision="r1", replica=dying.url) == 1  # outlier detection saw it fail
        if "stall_after" in fault:
            await until(lambda: dying.cancelled == 1, what="the stalled answer dropped upstream")


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
async def test_an_unstreamed_answer_is_continued_out_of_sight(router: RouterFactory, path: str) -> None:
    dying, healthy = FakeUpstream("a", resumable=True, die_after=2), FakeUpstream("b", resumable=True)
    async with serving(dying, healthy), router(**one_revision(dying, healthy)) as r:
        body = request(path, stream=False, logprobs=True)
        resp = await r.client.post(path, json=body)
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/json")
        assert resp.json() == whole_answer(body, path, (4,))  # whole, its logprobs carried across the seam
        resumed = healthy.resumes[0]["choices"][0]
        assert resumed["token_ids"] == ([token(0, 0), token(0, 1)] if path == COMPLETIONS else [token(0, 0)])
        assert [entry[0][0] for entry in resumed["logprobs"]] == resumed["token_ids"]
        assert migrations(r, "r1", m.MIGRATION_RESET, m.MIGRATION_CONTINUED) == 1
        assert r.metric(f"{m.MIGRATION_GAP}_count", revision="r1") == 1
        assert RESPONSE_ID_HEADER not in resp.headers


async def test_a_choice_finished_before_the_seam_is_continued_as_finished(router: RouterFactory) -> None:
    # choice 0 has one token, choice 1 four: the answer breaks after (0, 0) finished, (1, 0) and (1, 1)
    lengths = (1, 4)
    dying = FakeUpstream("a", resumable=True, die_after=3, lengths=lengths)
    healthy = FakeUpstream("b", resumable=True, lengths=lengths)
    async with serving(dying, healthy), router(**one_revision(dying, healthy)) as r:
        body = request(COMPLETIONS, n=2)
        _, received = await stream(r, COMPLETIONS, body)
        assert received == expected_stream(body, COMPLETIONS, lengths)
        assert healthy.resumes[0]["choices"] == [
            {"index": 0, "token_ids": [token(0, 0)], "finish_reason": "length", "stop_reason": None},
            {"index": 1, "token_ids": [token(1, 0), token(1, 1)], "finish_reason": None, "stop_reason": None},
        ]


async def test_continuations_are_bounded_and_end_with_an_error_event(router: RouterFactory) -> None:
    replicas = [FakeUpstream(name, resumable=True, die_after=1) for name in "abcd"]
    async with serving(*replicas), router(**one_revision(*replicas, migration={"maxAttempts": 2})) as r:
        body = request(COMPLETIONS)
        resp, received = await stream(r, COMPLETIONS, body)
        assert resp.status_code == 200
        # one event from each of the three attempts, then a clean end: never a silent cut
        assert received.startswith(b"".join(expected_stream(body, COMPLETIONS).split(b"\n\n")[i] + b"\n\n"
                                            for i in range(3)))
        events = [e for e in received.split(b"\n\n") if e]
        assert len(events) == 5 and b"folio-resume" not in received
        error = error_event(received)
        assert error["type"] == "server_error" and error["code"] == ErrorCode.UPSTREAM_UNREACHABLE
        assert [len(up.seen) for up in replicas] == [1, 1, 1, 0]
        assert [[len(c["token_ids"]) for c in resume["choices"]] for up in replicas[1:3] for resume in up.resumes] \
            == [[1], [2]]  # fmt: skip
        assert migrations(r, "r1", m.MIGRATION_RESET, m.MIGRATION_CONTINUED) == 2
        assert migrations(r, "r1", m.MIGRATION_RESET, m.MIGRATION_FAILED) == 1
        assert r.metric(m.REQUESTS, revision="r1", code="error") == 3


async def test_no_replica_left_ends_with_an_error_event(router: RouterFactory) -> None:
    lone = FakeUpstream("a", resumable=True, die_after=2)
    async with serving(lone), router(**one_revision(lone)) as r:
        _, received = await stream(r, COMPLETIONS, request(COMPLETIONS))
        assert error_event(received)["code"] == ErrorCode.UPSTREAM_UNREACHABLE
        assert migrations(r, "r1", m.MIGRATION_RESET, m.MIGRATION_NO_REPLICA) == 1
        assert r.metric(f"{m.MIGRATION_GAP}_count", revision="r1") == 0
        # unstreamed: a 502 in OpenAI's shape (504 after a stall)
        lone.die_after, lone.stall_after = None, 1
        async with router(**one_revision(lone, migration={"interChunkTimeout": "0.2s"})) as r:
            resp = await r.client.post(COMPLETIONS, json=request(COMPLETIONS, stream=False))
            assert resp.status_code == 504 and resp.json()["error"]["code"] == ErrorCode.UPSTREAM_TIMEOUT
            assert migrations(r, "r1", m.MIGRATION_TIMEOUT, m.MIGRATION_NO_REPLICA) == 1
            assert r.metric(m.REQUESTS, revision="r1", code=m.TIMEOUT) == 1


async def test_a_continuation_failing_before_its_first_byte_counts_and_the_next_is_tried(
    router: RouterFactory,
) -> None:
    dying, busy, healthy = (FakeUpstream("a", resumable=True, die_after=2), FakeUpstream("b", status=503),
                            FakeUpstream("c", resumable=True))  # fmt: skip
    async with serving(dying, busy, healthy), router(**one_revision(dying, busy, dead_url(), healthy)) as r:
        body = request(COMPLETIONS)
        _, received = await stream(r, COMPLETIONS, body)
        assert received == expected_stream(body, COMPLETIONS)
        assert len(busy.seen) == 1 and len(healthy.resumes) == 1
        assert migrations(r, "r1", m.MIGRATION_RESET, m.MIGRATION_CONTINUED) == 1
        assert r.metric(m.REQUESTS, revision="r1", code="503") == 1

    # the same with a budget of two: the busy one and the dead one take it, nothing is left to try
    dying.die_after = 2
    async with serving(dying, busy, healthy), router(
        **one_revision(dying, busy, dead_url(), healthy, migration={"maxAttempts": 2})
    ) as r:
        _, received = await stream(r, COMPLETIONS, request(COMPLETIONS))
        error_event(received)
        assert migrations(r, "r1", m.MIGRATION_RESET, m.MIGRATION_FAILED) == 1


async def test_a_dying_canary_is_continued_on_stable(router: RouterFactory) -> None:
    stable, canary = FakeUpstream("r1", resumable=True), FakeUpstream("r2", resumable=True, die_after=2)
    async with serving(stable, canary), router(
        traffic=[{"revision": "r1", "weight": 0}, {"revision": "r2", "weight": 100}], stable="r1", canary="r2",
        endpoints={"r1": [stable.url], "r2": [canary.url]},
    ) as r:
        body = request(CHAT)
        resp, received = await stream(r, CHAT, body)
        assert received == expected_stream(body, CHAT)
        assert resp.headers["x-folio-revision"] == "r2"  # the status line was the canary's
        assert len(stable.resumes) == 1
        assert migrations(r, "r2", m.MIGRATION_RESET, m.MIGRATION_CONTINUED) == 1
        assert r.metric(f"{m.MIGRATION_GAP}_count", revision="r2") == 1
        # the canary is charged: analysis sees its error though its client saw none
        assert r.metric(m.REQUESTS, revision="r2", code="error") == 1
        assert r.metric(m.REQUESTS, revision="r2", code="200") == 0
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 1


async def test_migration_off_asks_for_no_records_and_still_ends_cleanly(router: RouterFactory) -> None:
    up = FakeUpstream("a", resumable=True, break_stream=True)
    async with serving(up), router(**one_revision(up, migration={"maxAttempts": 0})) as r:
        async with r.client.stream(
            "POST", COMPLETIONS, json=request(COMPLETIONS), headers={RESUMABLE_HEADER: "1"}
        ) as resp:
            received = b"".join([chunk async for chunk in resp.aiter_raw()])
        assert RESUMABLE_HEADER not in up.seen[0].headers  # neither the router's nor the client's
        assert b'"n": 1' in received  # the plain answer, as it came, up to the break
        assert error_event(received)["code"] == ErrorCode.UPSTREAM_UNREACHABLE
        assert r.metric(m.REQUESTS, revision="r1", code="error") == 1
        assert r.metric(m.MIGRATIONS, revision="r1", reason=m.MIGRATION_RESET, outcome=m.MIGRATION_FAILED) == 0


async def test_a_client_may_not_send_folio_resume(router: RouterFactory) -> None:
    up = FakeUpstream("a", resumable=True)
    async with serving(up), router(**one_revision(up)) as r:
        resp = await r.client.post(COMPLETIONS, json={**request(COMPLETIONS), RESUME_FIELD: {"id": "x"}})
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["param"] == RESUME_FIELD and error["type"] == "invalid_request_error"
        ErrorCode(error["code"])
        assert up.seen == []
