"""`/v1/completions` with ``echo`` and ``logprobs`` (the prompt's log-probabilities, through the official
`openai` client) and Folio's `POST /folio/v1/parity`, on a real tiny model in-process, against transformers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from folio.engine.config import EngineConfig
from folio.engine.llm_engine import LLMEngine
from folio.engine.server.parity import PATH, decode_logits
from tests.server.conftest import MODEL, Running, serving_fake

PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def server(tiny_llama: Path) -> Iterator[Running]:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", max_model_len=256))
    with serving_fake(engine) as running:
        yield running


@pytest.fixture(scope="module")
def hf(tiny_llama: Path):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    return model, tok


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    model, _ = hf
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def test_echo_with_logprobs_returns_the_prompt_log_softmax(server: Running, hf) -> None:
    ids = hf[1](PROMPT).input_ids
    out = server.client().completions.create(
        model=MODEL, prompt=PROMPT, echo=True, logprobs=2, max_tokens=3, temperature=0
    )
    choice = out.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 3 == out.usage.total_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    want = torch.log_softmax(hf_logits(hf, ids), dim=-1)
    for p in range(1, len(ids)):
        assert lp.token_logprobs[p] == pytest.approx(want[p - 1, ids[p]].item(), abs=1e-4)
        assert len(lp.top_logprobs[p]) == 2
        assert max(lp.top_logprobs[p].values()) == pytest.approx(want[p - 1].max().item(), abs=1e-4)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert lp.text_offset[len(ids)] == len(PROMPT)  # the completion's tokens come after the echoed prompt


def test_echo_with_max_tokens_zero_scores_the_prompt_only(server: Running, hf) -> None:
    ids = hf[1](PROMPT).input_ids
    out = server.client().completions.create(model=MODEL, prompt=PROMPT, echo=True, logprobs=0, max_tokens=0)
    choice = out.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == len(ids) and out.usage.completion_tokens == 0
    want = torch.log_softmax(hf_logits(hf, ids), dim=-1)
    total = sum(lp for lp in choice.logprobs.token_logprobs[1:])
    assert total == pytest.approx(sum(want[p - 1, ids[p]].item() for p in range(1, len(ids))), abs=1e-3)


def test_echo_logprobs_stream(server: Running, hf) -> None:
    ids = hf[1](PROMPT).input_ids
    chunks = list(
        server.client().completions.create(
            model=MODEL, prompt=PROMPT, echo=True, logprobs=1, max_tokens=4, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    tokens = [t for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.tokens]
    firsts = [ch.logprobs.token_logprobs[0] for c in chunks for ch in c.choices if ch.logprobs]
    assert len(tokens) == len(ids) + 4 and firsts[0] is None


def test_max_tokens_zero_without_echo_is_a_400(server: Running) -> None:
    r = server.http().post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 0})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens" and r.json()["error"]["type"] == "invalid_request_error"


def test_parity_mean_logits_equal_transformers(server: Running, hf) -> None:
    _, tok = hf
    messages = [{"role": "user", "content": "Say hello."}]
    body = {"prompts": [{"prompt": PROMPT}, {"messages": messages}, {"prompt": "ab"}], "maxTokens": 5}
    r = server.http().post(PATH, json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["vocabSize"] == 512 and data["logitsEncoding"] == "base64-float32-le"
    chat_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    expected_ids = [tok(PROMPT).input_ids, list(chat_ids["input_ids"]), tok("ab").input_ids]
    for result, ids in zip(data["results"], expected_ids, strict=True):
        assert result["promptTokenIds"] == ids
        mean = torch.from_numpy(decode_logits(result["meanLogits"]).copy())
        want = hf_logits(hf, ids).mean(dim=0)
        assert torch.nn.functional.cosine_similarity(mean, want, dim=0).item() >= 0.99999
        # the greedy continuation is transformers' own
        model, _ = hf
        with torch.inference_mode():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)[0, len(ids):].tolist()
        assert result["tokenIds"] == gen[: len(result["tokenIds"])]
        # (a trailing partial multi-byte character is held back, as in every answer)
        assert result["text"] == tok.decode(result["tokenIds"], skip_special_tokens=True).rstrip("\ufffd")


def test_parity_is_repeatable(server: Running) -> None:
    body = {"prompts": [{"prompt": f"{i} plus {i} is"} for i in range(6)], "maxTokens": 3}
    a, b = (server.http().post(PATH, json=body).json() for _ in range(2))
    for x, y in zip(a["results"], b["results"], strict=True):
        assert np.array_equal(decode_logits(x["meanLogits"]), decode_logits(y["meanLogits"]))
        assert x["tokenIds"] == y["tokenIds"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompts": []}, "prompts"),
        ({"prompts": [{}]}, "prompts.0"),
        ({"prompts": [{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}]}, "prompts.0"),
        ({"prompts": [{"prompt": ""}]}, "prompts.0.prompt"),
        ({"prompts": [{"prompt": "a"}], "maxTokens": 0}, "maxTokens"),
        ({"prompts": [{"prompt": "a " * 400}]}, "prompts.0"),
        ({"prompts": "a"}, "prompts"),
    ],
)
def test_bad_parity_requests_are_400s(server: Running, body, param: str) -> None:
    r = server.http().post(PATH, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert (error["param"] or "").startswith(param)


def test_parity_unknown_model_is_a_404(server: Running) -> None:
    r = server.http().post(PATH, json={"model": "nope", "prompts": [{"prompt": "a"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_parity_malformed_json_is_a_400(server: Running) -> None:
    r = server.http().post(PATH, content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
