"""Every way a request can be refused, in the OpenAI error shape and with the right status."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from folio.engine.rules import BOUNDS
from folio.engine.sampling_params import SamplingParams
from folio.engine.server.admission import Faults
from folio.engine.server.openai_errors import ErrorCode
from tests.server.conftest import Running, serving_fake
from tests.server.fake_engine import FakeEngine

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "fake", "prompt": "hi"}


@pytest.fixture(scope="module")
def shared() -> Iterator[Running]:
    """One server for the tests that only send requests it refuses."""
    with serving_fake() as running:
        yield running


def assert_error(
    response: httpx.Response, status: int, param: str | None = None, code: ErrorCode | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    ErrorCode(error["code"])  # every answer's code is one of the table's, never a free string or None
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {**COMPLETION, "temperature": -1}, "temperature"),
        ("/v1/completions", {**COMPLETION, "top_p": 0}, "top_p"),
        ("/v1/completions", {**COMPLETION, "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {**COMPLETION, "n": 9}, "n"),
        ("/v1/completions", {**COMPLETION, "n": 0}, "n"),
        ("/v1/completions", {**COMPLETION, "stop": [""]}, None),
        ("/v1/completions", {**COMPLETION, "seed": 2**64}, "seed"),
        ("/v1/completions", {**COMPLETION, "logprobs": 21}, "logprobs"),
        ("/v1/completions", {**COMPLETION, "logit_bias": {"5": 101.0}}, "logit_bias"),
        ("/v1/completions", {**COMPLETION, "logit_bias": {"five": 1.0}}, "logit_bias"),
        ("/v1/completions", {**COMPLETION, "best_of": 3}, "best_of"),
        ("/v1/completions", {**COMPLETION, "suffix": "x"}, "suffix"),
        ("/v1/completions", {**COMPLETION, "prompt": 5}, "prompt"),
        ("/v1/completions", {**COMPLETION, "prompt": []}, "prompt"),
        ("/v1/completions", {**COMPLETION, "prompt": [5, 100000]}, "prompt"),
        ("/v1/completions", {"model": "fake"}, "prompt"),
        ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]},
            "messages.0.role",
        ),
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": "assistant", "content": "hi"}]}, "messages"),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -3}, "max_completion_tokens"),
        ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools.0.function"),
        ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, "tool_choice"),
        ("/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}, "response_format.type"),
        ("/v1/completions", {**COMPLETION, "guided_choice": ["a"], "guided_regex": "a"}, "guided_choice"),
        ("/v1/chat/completions", {**CHAT, "stream_options": "yes"}, "stream_options"),
    ],
)
def test_bad_parameters_are_400(shared: Running, path: str, body: dict[str, Any], param: str | None) -> None:
    with shared.http() as http:
        assert_error(http.post(path, json=body), 400, param)


# the same bodies the router refuses (tests/router/test_proxy.py), with the same code
MALFORMED_BODIES = [b"{not json", b"[1, 2]", b"", b'"text"', b"null", b"\xff\xfe"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/folio/v1/parity"])
@pytest.mark.parametrize("content", MALFORMED_BODIES)
def test_malformed_bodies_are_400_invalid_json(shared: Running, path: str, content: bytes) -> None:
    with shared.http() as http:
        response = http.post(path, content=content, headers={"content-type": "application/json"})
        assert_error(response, 400, code=ErrorCode.INVALID_JSON)


def test_a_wrong_field_in_a_json_object_is_not_invalid_json(shared: Running) -> None:
    with shared.http() as http:
        error = assert_error(http.post("/v1/completions", json={"model": "fake"}), 400, "prompt")
    assert error["code"] == ErrorCode.INVALID_VALUE


# A value just outside each field's bound, as JSON carries it; SamplingParams gets the same value.
OUT_OF_BOUNDS = [
    ("n", 0),
    ("temperature", 2.5),  # was accepted by SamplingParams, refused over HTTP: one bound now
    ("temperature", -0.5),
    ("top_p", 0.0),
    ("top_k", -2),
    ("min_p", 1.5),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", 10.5),  # likewise
    ("presence_penalty", 2.5),
    ("frequency_penalty", -3.0),
    ("seed", 2**64),
    ("logprobs", 21),  # SamplingParams took any k
    ("stop", [""]),
    ("stop", ["s"] * 17),  # SamplingParams took any number
    ("stop_token_ids", [-1]),
]


@pytest.mark.parametrize(("field", "value"), OUT_OF_BOUNDS)
def test_a_field_has_one_bound_and_one_message(shared: Running, field: str, value: Any) -> None:
    """The HTTP API and the offline SamplingParams refuse the same value in the same words."""
    with pytest.raises(ValueError) as offline:
        SamplingParams(**{field: value})
    with shared.http() as http:
        error = assert_error(http.post("/v1/completions", json={**COMPLETION, field: value}), 400, field)
    assert error["message"] == str(offline.value)
    assert error["code"] == ErrorCode.INVALID_VALUE


@pytest.mark.parametrize(("field", "same_as"), [("max_completion_tokens", "max_tokens"), ("top_logprobs", "logprobs")])
def test_openai_names_share_the_bound_of_the_engines_field(shared: Running, field: str, same_as: str) -> None:
    bound = BOUNDS[same_as]
    with shared.http() as http:
        for value, ok in ((bound.low - 1, False), (bound.high + 1, False), (bound.low, True)):
            body = {**CHAT, field: value, "logprobs": True, "max_tokens": None}
            response = http.post("/v1/chat/completions", json=body)
            if ok:
                assert response.status_code == 200, response.text
            else:
                message = assert_error(response, 400, field)["message"]
                assert message == f"{field} must be {bound.describe()}, got {value}"


def test_the_empty_prompt_rule_is_worded_once(shared: Running) -> None:
    from pathlib import Path

    from folio.engine import rules

    with pytest.raises(ValueError) as rule:
        rules.check_not_empty([])
    with shared.http() as http:
        for prompt in ([], [[]], [[5], []]):  # no prompt at all; a prompt of no tokens
            response = http.post("/v1/completions", json={**COMPLETION, "prompt": prompt})
            assert assert_error(response, 400, "prompt")["message"] == str(rule.value)
    engine = Path(rules.__file__).parent
    said = [p for p in engine.rglob("*.py") if "prompt must not be empty" in p.read_text()]
    assert said == [Path(rules.__file__)]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt"),
        ("/v1/completions", b'{"prompt": "hi", "stop": ["\\udfff"]}', "stop.0"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "\\ud83d"}]}',
            "messages.0.content",
        ),
    ],
)
def test_lone_surrogates_are_400(shared: Running, path: str, body: bytes, param: str) -> None:
    """Valid JSON, but not text a tokenizer (or a UTF-8 response) can hold."""
    with shared.http() as http:
        response = http.post(path, content=body, headers={"content-type": "application/json"})
    assert "surrogate" in assert_error(response, 400, param)["message"]


def test_over_long_prompt_states_the_context_and_the_request(shared: Running) -> None:
    client = shared.client()
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="fake", prompt="x" * 300, max_tokens=10)
    message = err.value.body["message"]
    assert "maximum context length is 256 tokens" in message
    assert "311 tokens (301 in the prompt, 10 for the completion)" in message
    assert err.value.body["code"] == "context_length_exceeded"
    assert err.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256") as err:
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "y" * 300}])
    assert err.value.body["param"] == "messages"  # the prompt alone does not fit


def test_engine_refusal_is_a_400(fake_server) -> None:
    """Whatever the engine rejects in add_request reaches the client as a 400 with its message."""
    engine = FakeEngine()
    engine.add_request = lambda *a: (_ for _ in ()).throw(ValueError("the cache holds only 64 tokens"))  # type: ignore[method-assign]
    with fake_server(engine=engine).http() as http:
        error = assert_error(http.post("/v1/completions", json=COMPLETION), 400)
    assert "64 tokens" in error["message"]


def test_unknown_model_is_404(shared: Running) -> None:
    client = shared.client()
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert err.value.body["code"] == "model_not_found"
    assert err.value.body["param"] == "model"


def test_unknown_route_and_method_keep_the_shape(shared: Running) -> None:
    with shared.http() as http:
        assert_error(http.get("/v1/nope"), 404)
        assert_error(http.get("/v1/completions"), 405)


def test_full_queue_is_503_with_retry_after(fake_server) -> None:
    # One sequence runs at a time: a second long stream waits, and the limit is one waiting.
    server = fake_server(engine=FakeEngine(max_num_seqs=1, step_delay=0.01), max_queued_requests=1)
    engine = server.app.state.server.engine
    long = {**COMPLETION, "max_tokens": 150, "stream": True}
    done: list[int] = []

    def stream() -> None:
        with server.http() as http, http.stream("POST", "/v1/completions", json=long) as r:
            r.read()
            done.append(r.status_code)

    def wait_for(condition: Any) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline
            time.sleep(0.005)

    threads = [threading.Thread(target=stream) for _ in range(2)]
    threads[0].start()
    wait_for(lambda: engine.stats.num_running == 1)
    threads[1].start()
    wait_for(lambda: engine.stats.num_waiting == 1)
    with server.http() as http:
        response = http.post("/v1/completions", json=COMPLETION)
    assert_error(response, 503)
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "server_overloaded"
    for t in threads:
        t.join(30)
    assert done == [200, 200]  # the admitted ones were not hurt


def test_injected_faults_are_500s_in_the_openai_shape(fake_server) -> None:
    server = fake_server(faults=Faults(error_rate=1.0))
    with server.http() as http:
        error = assert_error(http.post("/v1/completions", json=COMPLETION), 500)
        assert error["code"] == "fault_injected"
        assert http.get("/health").status_code == 200  # probes are never faulted
        assert http.get("/metrics").status_code == 200


def test_fault_error_rate_is_a_fraction(fake_server) -> None:
    server = fake_server(faults=Faults(error_rate=0.5, seed=1))
    with server.http() as http:
        codes = [
            http.post("/v1/completions", json={**COMPLETION, "max_tokens": 1}).status_code for _ in range(40)
        ]
    assert set(codes) == {200, 500}
    assert 8 <= codes.count(500) <= 32


def test_fault_latency_delays_responses(fake_server) -> None:
    server = fake_server(faults=Faults(latency_ms=300))
    with server.http() as http:
        start = time.monotonic()
        assert http.post("/v1/completions", json={**COMPLETION, "max_tokens": 1}).status_code == 200
        assert time.monotonic() - start >= 0.3
        start = time.monotonic()
        assert http.get("/health").status_code == 200
        assert time.monotonic() - start < 0.3  # probes are not delayed


def test_faults_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="error rate"):
        Faults(error_rate=1.5)
    with pytest.raises(ValueError, match="latency"):
        Faults(latency_ms=-1)


def test_a_dead_engine_fails_requests_and_health(fake_server) -> None:
    server = fake_server(engine=FakeEngine(fail_at_step=3))
    with server.http() as http:
        error = assert_error(http.post("/v1/completions", json={**COMPLETION, "max_tokens": 20}), 503)
        assert error["code"] == "engine_unavailable"
        assert http.get("/health").status_code == 503
        assert http.get("/ready").status_code == 503
        assert_error(http.post("/v1/completions", json=COMPLETION), 503)


@pytest.mark.parametrize("status", [400, 401, 404, 405, 413, 499, 500, 502, 503])
@pytest.mark.parametrize("code", [None, ErrorCode.UPSTREAM_TIMEOUT])
def test_the_router_answers_in_the_engines_vocabulary(status: int, code: ErrorCode | None) -> None:
    import json

    from folio.engine.server.errors import OpenAIError
    from folio.operator.router.errors import error_body

    engine = OpenAIError(status, "refused", code=code, param="p").body()
    assert json.loads(error_body(status, "refused", code, "p")) == engine
    assert engine["error"]["type"] == ("invalid_request_error" if status < 500 else "server_error")
    defaults = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large", 500: "internal_error"}
    fallback = "invalid_value" if status < 500 else "internal_error"
    assert engine["error"]["code"] == (code or defaults.get(status, fallback))


def test_a_code_outside_the_table_is_refused() -> None:
    from folio.engine.server.errors import OpenAIError
    from folio.operator.router.errors import error_body

    with pytest.raises(ValueError, match="some_code"):
        error_body(400, "refused", "some_code")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="some_code"):
        OpenAIError(400, "refused", code="some_code").body()  # type: ignore[arg-type]


def test_the_codes_clients_rely_on_keep_their_strings() -> None:
    relied_on = {
        "invalid_json", "body_too_large", "invalid_api_key", "model_not_found", "context_length_exceeded",
        "too_many_sequences", "server_overloaded", "engine_unavailable", "shutting_down", "fault_injected",
        "internal_error", "not_found", "method_not_allowed", "no_ready_replica", "no_upstream",
        "upstream_unreachable", "upstream_timeout",
    }  # fmt: skip
    assert relied_on <= {c.value for c in ErrorCode}


@pytest.fixture(scope="module")
def small_body() -> Iterator[Running]:
    with serving_fake(max_request_body_bytes=4096) as running:
        yield running


# (method, path, body: JSON, raw bytes or None, status, code): one of every refusal a request can meet
REFUSALS = [
    ("POST", "/v1/completions", b"{", 400, ErrorCode.INVALID_JSON),
    ("POST", "/v1/completions", b"[]", 400, ErrorCode.INVALID_JSON),
    ("POST", "/v1/completions", {"model": "fake"}, 400, ErrorCode.INVALID_VALUE),
    ("POST", "/v1/completions", {**COMPLETION, "temperature": 3}, 400, ErrorCode.INVALID_VALUE),
    ("POST", "/v1/completions", {**COMPLETION, "n": 9}, 400, ErrorCode.INVALID_VALUE),
    ("POST", "/v1/completions", {**COMPLETION, "top_k": 1.5}, 400, ErrorCode.INVALID_VALUE),
    ("POST", "/v1/completions", {**COMPLETION, "prompt": [5, 100000]}, 400, ErrorCode.INVALID_VALUE),
    ("POST", "/v1/completions", b'{"prompt": "a\\ud800"}', 400, ErrorCode.INVALID_VALUE),
    ("POST", "/v1/completions", {**COMPLETION, "max_tokens": 0}, 400, ErrorCode.INVALID_VALUE),
    ("POST", "/v1/completions", {**COMPLETION, "suffix": "x"}, 400, ErrorCode.UNSUPPORTED_PARAMETER),
    ("POST", "/v1/completions", {**COMPLETION, "best_of": 2}, 400, ErrorCode.UNSUPPORTED_PARAMETER),
    ("POST", "/v1/completions", {**COMPLETION, "logit_bias": {"x": 1}}, 400, ErrorCode.INVALID_VALUE),
    ("POST", "/v1/completions", {**COMPLETION, "max_tokens": 300}, 400, ErrorCode.CONTEXT_LENGTH_EXCEEDED),
    ("POST", "/v1/completions", {**COMPLETION, "n": 8, "prompt": ["a"] * 9}, 400, ErrorCode.TOO_MANY_SEQUENCES),
    ("POST", "/v1/completions", {**COMPLETION, "model": "gpt-9"}, 404, ErrorCode.MODEL_NOT_FOUND),
    ("POST", "/v1/completions", {**COMPLETION, "prompt": "x" * 5000}, 413, ErrorCode.BODY_TOO_LARGE),
    ("POST", "/v1/chat/completions", {**CHAT, "tools": [{}]}, 400, ErrorCode.INVALID_VALUE),
    ("POST", "/v1/chat/completions", {**CHAT, "top_logprobs": 1}, 400, ErrorCode.INVALID_VALUE),
    ("POST", "/v1/chat/completions", {**CHAT, "messages": [{"role": "assistant", "content": "x"}]}, 400,
     ErrorCode.INVALID_VALUE),
    ("POST", "/folio/v1/parity", {"prompts": [{}]}, 400, ErrorCode.INVALID_VALUE),
    ("POST", "/folio/v1/parity", {"prompts": [{"prompt": "x"}], "maxTokens": 257}, 400, ErrorCode.INVALID_VALUE),
    ("GET", "/v1/completions", None, 405, ErrorCode.METHOD_NOT_ALLOWED),
    ("GET", "/v1/nope", None, 404, ErrorCode.NOT_FOUND),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), REFUSALS)
def test_every_refusal_carries_a_code_from_the_table(
    small_body: Running, method: str, path: str, body: Any, status: int, code: ErrorCode
) -> None:
    kwargs: dict[str, Any] = {"content": body, "headers": {"content-type": "application/json"}}
    if not isinstance(body, bytes):
        kwargs = {"json": body}
    with small_body.http() as http:
        assert_error(http.request(method, path, **kwargs), status, code=code)


def test_the_shared_vocabulary_pulls_in_no_web_framework() -> None:
    import subprocess
    import sys

    probe = ("import sys, folio.operator.router.errors; "
             "print([m for m in ('fastapi', 'starlette', 'torch') if m in sys.modules])")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "[]\n"
