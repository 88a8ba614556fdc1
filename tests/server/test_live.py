"""`folio serve` as a subprocess on real models, driven by the official `openai` client."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.server.conftest import Serve, free_port, start_serve, stop_serve

CHAT = [{"role": "user", "content": "Tell me about the quick brown fox."}]


def metric(serve: Serve, name: str) -> float:
    text = httpx.get(f"{serve.url}/metrics").text
    match = re.search(rf'^{re.escape(name)}{{model_name="m"}} (\S+)$', text, re.M)
    assert match, f"{name} missing"
    return float(match.group(1))


@pytest.fixture(scope="module")
def tiny(folio_bin: str, tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    serve = start_serve(folio_bin, tiny_llama, tmp_path_factory.mktemp("serve"), "--max-num-seqs", "8")
    yield serve
    stop_serve(serve)


@pytest.fixture(scope="module")
def tokenizer(tiny_llama: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama))


def test_completions_stream_and_usage_match_the_tokenizer(tiny: Serve, tokenizer) -> None:
    client = tiny.client()
    prompt = "Paris is the capital of"
    whole = client.completions.create(
        model="m", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert whole.usage.prompt_tokens == len(tokenizer(prompt).input_ids)
    assert whole.usage.completion_tokens == 12 and whole.choices[0].finish_reason == "length"
    chunks = list(
        client.completions.create(
            model="m",
            prompt=prompt,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_chat_stream_and_whole_agree(tiny: Serve, tokenizer) -> None:
    client = tiny.client()
    kwargs = dict(model="m", messages=CHAT, max_tokens=10, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    templated = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert whole.usage.prompt_tokens == len(tokenizer(templated, add_special_tokens=False).input_ids)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_stop_string_cuts_the_text(tiny: Serve) -> None:
    client = tiny.client()
    kwargs = dict(
        model="m", prompt="The quick brown", temperature=0, max_tokens=24, extra_body={"ignore_eos": True}
    )
    full = client.completions.create(**kwargs).choices[0].text
    stop = next(full[i : i + 2] for i in range(4, len(full) - 2) if full[i : i + 2].strip())
    cut = client.completions.create(**kwargs, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.find(stop)]


def test_seeds_reproduce(tiny: Serve) -> None:
    client = tiny.client()

    def texts(**kw: object) -> list[str]:
        out = client.completions.create(model="m", prompt="Once", max_tokens=16, temperature=1.0, **kw)
        return [c.text for c in sorted(out.choices, key=lambda c: c.index)]

    assert texts(seed=11) == texts(seed=11)
    pair = texts(seed=11, n=2)
    assert pair[0] == texts(seed=11)[0] and pair[1] == texts(seed=12)[0]


def test_greedy_logprobs_rank_the_chosen_token_first(tiny: Serve) -> None:
    out = tiny.client().chat.completions.create(
        model="m", messages=CHAT, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    content = out.choices[0].logprobs.content
    assert len(content) == 6
    for token in content:
        assert len(token.top_logprobs) == 3
        assert token.logprob == pytest.approx(token.top_logprobs[0].logprob)
        assert token.top_logprobs[0].logprob >= token.top_logprobs[1].logprob >= token.top_logprobs[2].logprob


def test_errors_on_a_real_tokenizer(tiny: Serve) -> None:
    client = tiny.client()
    with pytest.raises(openai.BadRequestError, match="maximum context length is 1024 tokens"):
        client.completions.create(model="m", prompt="fox " * 1500)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="hi")
    bad = httpx.post(f"{tiny.url}/v1/completions", content=b"{", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_disconnect_frees_kv_blocks(tiny: Serve) -> None:
    idle = metric(tiny, "vllm:kv_cache_usage_perc")
    body = {"model": "m", "prompt": "hi", "max_tokens": 1000, "stream": True, "ignore_eos": True}
    with (
        httpx.Client(base_url=tiny.url, timeout=30) as http,
        http.stream("POST", "/v1/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        for _ in range(5):
            next(ln for ln in lines if ln)
        assert metric(tiny, "vllm:kv_cache_usage_perc") > idle
    deadline = time.monotonic() + 20
    while metric(tiny, "vllm:num_requests_running") or metric(tiny, "vllm:kv_cache_usage_perc") != idle:
        assert time.monotonic() < deadline, "blocks were not freed"
        time.sleep(0.05)


VLLM_NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
              "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:e2e_request_latency_seconds")


def test_metrics_port_serves_metrics_alone(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    """`--metrics-port`: /metrics (the API's text, vLLM names) on a port of its own, and nothing of the
    API there; the API port keeps its /metrics; SIGTERM's drain stops both and exits 0."""
    port = free_port()
    serve = start_serve(folio_bin, tiny_llama, tmp_path, "--metrics-port", str(port))
    metrics_url = f"http://127.0.0.1:{port}"
    try:
        out = serve.client().completions.create(model="m", prompt="hi", max_tokens=3, extra_body={"ignore_eos": True})
        assert out.usage is not None and out.usage.completion_tokens == 3
        alone = httpx.get(f"{metrics_url}/metrics", timeout=10)
        assert alone.status_code == 200 and alone.headers["content-type"].startswith("text/plain")
        for name in VLLM_NAMES:
            assert re.search(rf'^{re.escape(name)}(_count)?{{model_name="m"}} ', alone.text, re.M), name
        # the same engine's figures: the tokens just generated
        assert re.search(r'^vllm:generation_tokens_total\{model_name="m"\} 3\.0$', alone.text, re.M)
        api = httpx.get(f"{serve.url}/metrics", timeout=10)
        assert api.status_code == 200 and 'vllm:generation_tokens_total{model_name="m"} 3.0' in api.text
        for path in ("/v1/models", "/health", "/ready", "/docs"):  # nothing of the API on the metrics port
            assert httpx.get(f"{metrics_url}{path}", timeout=10).status_code == 404, path
        assert httpx.post(f"{metrics_url}/v1/completions", json={"model": "m", "prompt": "hi"}).status_code in (404, 405)
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(30) == 0, serve.output()
        assert "Traceback" not in serve.output()
        with pytest.raises(httpx.TransportError):  # the metrics port closed with the server
            httpx.get(f"{metrics_url}/metrics", timeout=5)
    finally:
        stop_serve(serve)


def test_a_taken_metrics_port_fails_the_start(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    """Like a taken API port: uvicorn logs why and the process exits non-zero (its startup failure code)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(AssertionError, match=r"exited with [1-9](?s:.*)already in use"):
            start_serve(folio_bin, tiny_llama, tmp_path, "--metrics-port", str(port))


def test_sigterm_drains_in_flight_requests(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    serve = start_serve(folio_bin, tiny_llama, tmp_path, "--shutdown-timeout", "60")
    body = {"model": "m", "prompt": "hi", "max_tokens": 400, "stream": True, "ignore_eos": True}
    started = threading.Barrier(4)
    finish: list[str | None] = []

    def stream() -> None:
        with (
            httpx.Client(base_url=serve.url, timeout=60) as http,
            http.stream("POST", "/v1/completions", json=body) as r,
        ):
            lines = (ln for ln in r.iter_lines() if ln)
            next(lines)
            started.wait()
            events = list(lines)
        assert events[-1] == "data: [DONE]"
        finish.append(openai.types.Completion.model_validate_json(events[-2][6:]).choices[0].finish_reason)

    threads = [threading.Thread(target=stream) for _ in range(3)]
    try:
        for t in threads:
            t.start()
        started.wait(30)
        serve.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(f"{serve.url}/ready").status_code != 503:
            assert time.monotonic() < deadline
        refused = httpx.post(f"{serve.url}/v1/completions", json={"model": "m", "prompt": "hi"})
        assert refused.status_code == 503 and "retry-after" in refused.headers
        assert (
            serve.proc.poll() is None and metric(serve, "vllm:num_requests_running") == 3
        )  # still serving them
        for t in threads:
            t.join(60)
        assert serve.proc.wait(30) == 0
    finally:
        stop_serve(serve)
    assert finish == ["length"] * 3, serve.output()


@pytest.fixture(scope="module")
def smollm2(folio_bin: str, smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    serve = start_serve(
        folio_bin, smollm2_dir, tmp_path_factory.mktemp("smol"), "--max-model-len", "2048",
        "--enable-auto-tool-choice", timeout=240,  # the llama family's parser: llama3_json
    )  # fmt: skip
    yield serve
    stop_serve(serve)


def test_smollm2_knows_the_capital_of_france(smollm2: Serve) -> None:
    client = smollm2.client()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    answer = client.chat.completions.create(model="m", messages=messages, max_tokens=24, temperature=0)
    assert "Paris" in answer.choices[0].message.content
    streamed = client.chat.completions.create(
        model="m", messages=messages, max_tokens=24, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == answer.choices[0].message.content


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER_TOOL: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.", "parameters": WEATHER}}  # fmt: skip


def test_smollm2_calls_tools_through_its_chat_template(smollm2: Serve) -> None:
    client = smollm2.client()
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    for tool_choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        answer = client.chat.completions.create(model="m", messages=ask, tools=[WEATHER_TOOL], tool_choice=tool_choice,
                                                max_tokens=40, temperature=0)  # fmt: skip
        [call] = answer.choices[0].message.tool_calls or []
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, WEATHER)
        assert call.function.name == "get_weather" and answer.choices[0].finish_reason == "tool_calls"
    # the call and its result go back through the template; "auto" (the default): SmolLM2 answers in words
    conversation: Any = [*ask, answer.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}]  # fmt: skip
    reply = client.chat.completions.create(model="m", messages=conversation, tools=[WEATHER_TOOL], max_tokens=30,
                                           temperature=0)  # fmt: skip
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].message.content


@pytest.fixture(scope="module")
def gemma3(folio_bin: str, gemma3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    serve = start_serve(
        folio_bin, gemma3_dir, tmp_path_factory.mktemp("gemma3"), "--max-model-len", "1024", timeout=240
    )
    yield serve
    stop_serve(serve)


@pytest.mark.slow
def test_gemma3_270m_serves_completions(gemma3: Serve) -> None:
    client = gemma3.client()
    answer = client.completions.create(
        model="m", prompt="The Eiffel Tower is located in the city of", max_tokens=8, temperature=0
    )
    assert "Paris" in answer.choices[0].text
    assert answer.usage.completion_tokens <= 8
    # a base model: no chat template, so chat completions are refused with a clear 400
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        client.chat.completions.create(model="m", messages=CHAT, max_tokens=4)


def test_a_priority_is_a_400_naming_it_on_an_fcfs_engine(tiny: Serve) -> None:
    with pytest.raises(openai.BadRequestError, match="--scheduling-policy priority") as refused:
        tiny.client().completions.create(model="m", prompt="hi", max_tokens=2, extra_body={"priority": 3})
    assert refused.value.body["param"] == "priority"  # type: ignore[index]
    answer = tiny.client().completions.create(model="m", prompt="hi", max_tokens=2, extra_body={"priority": 0})
    assert answer.choices[0].finish_reason == "length"
