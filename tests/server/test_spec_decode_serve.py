"""`folio serve --speculative-config`: streamed and whole answers as without it, several tokens a step,
and vLLM's speculative decoding counters on /metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from folio.engine import LLM, SamplingParams
from tests.server.conftest import start_serve, stop_serve
from tests.server.test_live import metric

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def test_streamed_answers_are_the_same_with_speculation(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat"
    expected = LLM(str(tiny_llama)).generate([prompt], SamplingParams(temperature=0.0, max_tokens=40))[0]
    serve = start_serve(folio_bin, tiny_llama, tmp_path, "--speculative-config", json.dumps(NGRAM))
    try:
        client = serve.client()
        whole = client.completions.create(model="m", prompt=prompt, max_tokens=40, temperature=0)
        chunks = list(client.completions.create(model="m", prompt=prompt, max_tokens=40, temperature=0, stream=True))
        streamed = "".join(c.choices[0].text for c in chunks if c.choices)
        assert whole.choices[0].text == streamed == expected.outputs[0].text
        assert whole.usage.completion_tokens == len(expected.outputs[0].token_ids)
        drafts = metric(serve, "vllm:spec_decode_num_drafts_total")
        kept = metric(serve, "vllm:spec_decode_num_accepted_tokens_total")
        assert drafts > 0 and kept > 0
        # some steps emitted several tokens: fewer chunks than tokens
        assert len([c for c in chunks if c.choices and c.choices[0].text]) < whole.usage.completion_tokens
    finally:
        stop_serve(serve)


def test_a_bad_speculative_config_stops_folio_serve_at_start(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="num_speculative_tokens must be an integer from 1 to 16"):
        start_serve(folio_bin, tiny_llama, tmp_path, "--speculative-config",
                    '{"method": "ngram", "num_speculative_tokens": 64}')  # fmt: skip


def test_a_draft_model_serves_the_same_answers(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    """The model as its own draft (the same tokenizer, by construction): the same greedy text, proposals kept."""
    prompt = "Once upon a time, in a land far away, there lived"
    expected = LLM(str(tiny_llama)).generate([prompt], SamplingParams(temperature=0.0, max_tokens=30))[0]
    draft = {"model": str(tiny_llama), "num_speculative_tokens": 3}
    serve = start_serve(folio_bin, tiny_llama, tmp_path, "--speculative-config", json.dumps(draft))
    try:
        answer = serve.client().completions.create(model="m", prompt=prompt, max_tokens=30, temperature=0)
        assert answer.choices[0].text == expected.outputs[0].text
        assert metric(serve, "vllm:spec_decode_num_accepted_tokens_total") > 0
    finally:
        stop_serve(serve)


def test_a_draft_with_another_vocabulary_stops_folio_serve_at_start(folio_bin: str, tiny_llama: Path,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    from tests.support.models import make_tiny_llama

    other = make_tiny_llama(tmp_path / "other", vocab_size=384, num_hidden_layers=1)
    with pytest.raises(AssertionError, match="has another vocabulary than the target's"):
        start_serve(folio_bin, tiny_llama, tmp_path, "--speculative-config",
                    json.dumps({"model": str(other), "num_speculative_tokens": 3}))  # fmt: skip
