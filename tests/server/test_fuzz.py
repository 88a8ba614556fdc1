"""Fuzzing: valid and invalid requests alike must never produce a 5xx, nor take the engine down.

Schemathesis walks the OpenAPI schema (against the fake engine: fast, many examples, and against a real
`folio serve`); a hypothesis strategy sends every sampling field at the integer and float extremes JSON
can carry to the real engine, whose /health must stay 200 throughout.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from folio.engine.server.app import build_app
from folio.engine.server.serving import ServingConfig
from tests.server.conftest import Running, Serve, serving_fake, start_serve, stop_serve
from tests.server.fake_engine import FakeEngine


def _engine() -> FakeEngine:
    return FakeEngine(step_delay=0, max_model_len=64, num_blocks=4096)


# The schema comes from the app itself (no server needed at collection); requests go to a live one.
schema = schemathesis.openapi.from_dict(
    build_app(_engine(), ServingConfig(served_model_name="fake", model_path="/m", max_model_len=64)).openapi()
)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    with serving_fake(engine=_engine()) as running:
        yield running


@pytest.fixture(scope="module")
def real(folio_bin: str, tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    # the served name is the one the schema's examples use, so positive cases reach the engine
    serve = start_serve(
        folio_bin, tiny_llama, tmp_path_factory.mktemp("fuzz"), "--max-model-len", "256",
        "--max-num-seqs", "8", "--served-model-name", "fake",
    )  # fmt: skip
    yield serve
    stop_serve(serve)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_makes_a_server_error(case: schemathesis.Case, server: Running) -> None:
    response = case.call(base_url=server.url, timeout=30)
    assert response.status_code < 500, response.text


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_makes_a_server_error_on_the_real_engine(case: schemathesis.Case, real: Serve) -> None:
    response = case.call(base_url=real.url, timeout=60)
    assert response.status_code < 500, response.text
    assert httpx.get(f"{real.url}/health", timeout=10).status_code == 200


# Integers at and past int64's limits, floats at the edges of float64 (NaN and infinities included: Python's
# JSON reader, like many clients' writers, accepts them), and small ordinary values.
INTS = st.sampled_from([0, 1, -1, -2, 2, 4, 7, 8, 9, 20, 21, 256, 513, 2**31, 2**53 + 1, 2**63 - 1, 2**63,
                        2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**40])  # fmt: skip
EDGE_FLOATS = [0.0, -0.0, 5e-324, 1e-300, 1e-30, 1e-5, 0.5, 1.0, 1.5, 2.0, 2.0000001, 10.0, 10.5, 1e300,
               1.7976931348623157e308, math.inf, -math.inf, math.nan, -1.0, -2.0, -2.5]  # fmt: skip
FLOATS = st.one_of(st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=True, allow_infinity=True))
NUMBER = st.one_of(INTS, FLOATS)
SAMPLING_FIELDS = {
    "n": INTS,
    "temperature": FLOATS,
    "top_p": FLOATS,
    "top_k": INTS,
    "min_p": FLOATS,
    "max_tokens": st.one_of(st.integers(1, 4), INTS),
    "seed": INTS,
    "presence_penalty": FLOATS,
    "frequency_penalty": FLOATS,
    "repetition_penalty": FLOATS,
    "stop_token_ids": st.lists(INTS, max_size=3),
    "logit_bias": st.dictionaries(st.sampled_from(["1", "2", "x"]), NUMBER, max_size=2),
    "ignore_eos": st.booleans(),
}
COMPLETION_ONLY = {"logprobs": INTS, "best_of": INTS, "echo": st.booleans(), "prompt": st.one_of(
    st.just("hi"), st.lists(INTS, min_size=1, max_size=3), st.lists(st.just("a b"), min_size=1, max_size=3))}
CHAT_ONLY = {"logprobs": st.booleans(), "top_logprobs": INTS, "max_completion_tokens": INTS}


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    chat = draw(st.booleans())
    fields = {**SAMPLING_FIELDS, **(CHAT_ONLY if chat else COMPLETION_ONLY)}
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=6))
    body: dict[str, Any] = {"model": "fake", "max_tokens": 2, "stream": draw(st.booleans())}
    body["messages" if chat else "prompt"] = [{"role": "user", "content": "hi"}] if chat else "hi"
    body.update({name: draw(fields[name]) for name in chosen})
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


@given(request=requests())
@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
def test_extreme_sampling_values_never_break_the_real_engine(real: Serve, request: tuple[str, dict]) -> None:
    path, body = request
    raw = json.dumps(body)  # writes NaN / Infinity for non-finite floats, as Python clients do
    resp = httpx.post(f"{real.url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert resp.status_code in (200, 400), f"{resp.status_code} for {raw}: {resp.text}"
    if resp.status_code == 400:
        assert resp.json()["error"]["type"] == "invalid_request_error"
    elif body.get("stream"):
        assert resp.text.rstrip().endswith("data: [DONE]") and '"error"' not in resp.text, resp.text
    health = httpx.get(f"{real.url}/health", timeout=10)
    assert health.status_code == 200, f"the engine went down after {raw}: {health.text}"


def test_the_top_k_that_killed_the_engine(real: Serve) -> None:
    """The request of the hardening report, as sent with curl: a 400 naming top_k, and the engine lives."""
    for path, extra in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):  # fmt: skip
        body = '{"model":"fake","max_tokens":2,"top_k":9223372036854775808,' + json.dumps(extra)[1:]
        resp = httpx.post(f"{real.url}{path}", content=body, headers={"content-type": "application/json"}, timeout=30)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "top_k", resp.text
    # (sampled: ignore_eos, else an end-of-sequence token drawn first would make a shorter, valid answer)
    ok = httpx.post(f"{real.url}/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 2,
                                                        "top_k": 2**63 - 1, "ignore_eos": True}, timeout=30)  # fmt: skip
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    assert httpx.get(f"{real.url}/health", timeout=10).status_code == 200
