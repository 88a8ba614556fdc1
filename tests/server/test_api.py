"""The OpenAI API surface, driven by the official `openai` client against the app on a fake engine."""

from __future__ import annotations

import json

import pytest

from tests.server.fake_engine import BOS, OFFSET, SCRIPT

GREEDY = {"temperature": 0}


def test_completion_counts_usage_and_length(fake_server) -> None:
    client = fake_server().client()
    out = client.completions.create(model="fake", prompt="hi", max_tokens=10, **GREEDY)
    assert out.object == "text_completion" and out.model == "fake"
    assert out.choices[0].text == SCRIPT[:10]
    assert out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (3, 10, 13)


def test_completion_defaults_to_16_tokens(fake_server) -> None:
    out = fake_server().client().completions.create(model="fake", prompt="hi", **GREEDY)
    assert out.usage.completion_tokens == 16


def test_token_prompts_and_several_prompts_fan_out(fake_server) -> None:
    client = fake_server().client()
    ids = [BOS, *(b + OFFSET for b in b"hi")]
    out = client.completions.create(model="fake", prompt=[ids, ids + ids[1:]], n=2, max_tokens=4, **GREEDY)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert all(c.text == SCRIPT[:4] for c in out.choices)
    assert out.usage.prompt_tokens == 3 + 5  # each prompt counted once, not once per choice
    assert out.usage.completion_tokens == 16


def test_echo_prepends_the_prompt(fake_server) -> None:
    out = (
        fake_server()
        .client()
        .completions.create(model="fake", prompt="hi", max_tokens=3, echo=True, **GREEDY)
    )
    assert out.choices[0].text == "hi" + SCRIPT[:3]


def test_streamed_completion_matches_the_whole_one(fake_server) -> None:
    client = fake_server().client()
    whole = client.completions.create(model="fake", prompt="hi", max_tokens=12, **GREEDY)
    chunks = list(
        client.completions.create(
            model="fake",
            prompt="hi",
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_stream_ends_with_done_and_usage_only_when_asked(fake_server) -> None:
    server = fake_server()
    body = {"model": "fake", "prompt": "hi", "max_tokens": 3, "stream": True}
    with server.http() as http:
        lines = [ln for ln in http.post("/v1/completions", json=body).text.splitlines() if ln]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]
    assert all(e["usage"] is None for e in events)


def test_multibyte_text_streams_whole_characters(fake_server) -> None:
    chunks = (
        fake_server()
        .client()
        .completions.create(model="fake", prompt="x", max_tokens=len(SCRIPT.encode()), stream=True, **GREEDY)
    )
    pieces = [c.choices[0].text for c in chunks]
    assert "".join(pieces) == SCRIPT
    assert "é" in pieces  # the two bytes of é arrive as one piece, never half of it


def test_chat_completion(fake_server) -> None:
    client = fake_server().client()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    out = client.chat.completions.create(model="fake", messages=messages, max_completion_tokens=5, **GREEDY)
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == SCRIPT[:5]
    prompt = "<s><system>be brief\n<user>hi\n<assistant>"
    assert out.usage.prompt_tokens == len(prompt.encode())  # the template holds the BOS; none is added


def test_chat_stream_starts_with_the_role_and_ends_with_usage(fake_server) -> None:
    chunks = list(
        fake_server()
        .client()
        .chat.completions.create(
            model="fake",
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == SCRIPT[:6]
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 6


def test_chat_defaults_to_the_rest_of_the_context(fake_server) -> None:
    out = (
        fake_server()
        .client()
        .chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}], **GREEDY)
    )
    assert out.usage.total_tokens == 256  # the fake's max_model_len


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_ends_the_choice(fake_server, include: bool) -> None:
    out = (
        fake_server()
        .client()
        .completions.create(
            model="fake",
            prompt="hi",
            max_tokens=40,
            stop=["fox"],
            extra_body={"include_stop_str_in_output": include},
            **GREEDY,
        )
    )
    assert out.choices[0].text == "The quick brown " + ("fox" if include else "")
    assert out.choices[0].finish_reason == "stop"


def test_seed_reproduces_and_choices_use_seed_plus_index(fake_server) -> None:
    client = fake_server().client()

    def texts(**kw: object) -> list[str]:
        out = client.completions.create(model="fake", prompt="hi", max_tokens=12, temperature=1.0, **kw)
        return [c.text for c in sorted(out.choices, key=lambda c: c.index)]

    first, second = texts(seed=7, n=2), texts(seed=7, n=2)
    assert first == second
    assert first[0] != first[1]
    assert texts(seed=8) == [first[1]]


def test_logprobs_in_both_shapes(fake_server) -> None:
    client = fake_server().client()
    out = client.completions.create(model="fake", prompt="hi", max_tokens=3, logprobs=2, **GREEDY)
    lp = out.choices[0].logprobs
    assert lp.tokens == list(SCRIPT[:3])
    assert lp.token_logprobs == [-0.25] * 3
    assert lp.text_offset == [0, 1, 2]
    assert all(len(top) == 2 for top in lp.top_logprobs)

    chat = client.chat.completions.create(
        model="fake",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        logprobs=True,
        top_logprobs=1,
        **GREEDY,
    )
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == list(SCRIPT[:3])
    assert all(c.logprob == -0.25 and len(c.top_logprobs) == 1 for c in content)
    assert content[0].bytes == list(SCRIPT[0].encode())


def test_models_card_and_probes(fake_server) -> None:
    server = fake_server(revision="0123456789abcdef0123456789abcdef01234567", digest="sha256:" + "ab" * 32)
    models = server.client().models.list().data
    assert [m.id for m in models] == ["fake"]
    card = models[0].model_dump()
    assert card["revision"] == "0123456789abcdef0123456789abcdef01234567"
    assert card["digest"] == "sha256:" + "ab" * 32
    assert card["max_model_len"] == 256
    with server.http() as http:
        assert http.get("/health").status_code == 200
        assert http.get("/ready").status_code == 200
        assert http.get("/version").json()["version"]


def test_metrics_use_vllm_names(fake_server) -> None:
    server = fake_server()
    server.client().completions.create(model="fake", prompt="hi", max_tokens=5, **GREEDY)
    with server.http() as http:
        text = http.get("/metrics").text
    label = '{model_name="fake"}'
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ):
        assert f"{name}{label}" in text, name
    assert f"vllm:prompt_tokens_total{label} 3.0" in text
    assert f"vllm:generation_tokens_total{label} 5.0" in text
    assert 'vllm:request_success_total{finished_reason="length",model_name="fake"} 1.0' in text
    assert f"vllm:inter_token_latency_seconds_count{label} 4.0" in text  # 5 tokens, 4 gaps
    assert "process_resident_memory_bytes" in text
