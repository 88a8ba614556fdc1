"""Prompt log-probabilities and mean prompt logits equal transformers' over the same prompt (CPU, float32),
whatever the prefill chunking and the prefix cache; the logit-noise fault changes answers, fails nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from folio.engine import LLM, SamplingParams
from tests.engine.test_hf_equivalence import random_prompts

LENGTHS = (1, 2, 9, 40, 150)


@pytest.fixture(scope="module")
def hf_logits(tiny_llama: Path):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()

    def logits(prompt: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model(torch.tensor([prompt])).logits[0].float()

    return logits


def check_prompt_logprobs(prompt: list[int], got: list[dict[int, float] | None], want: torch.Tensor, k: int) -> None:
    assert len(got) == len(prompt) and got[0] is None
    logprobs = torch.log_softmax(want, dim=-1)
    for p in range(1, len(prompt)):
        entry = got[p]
        assert entry is not None
        assert entry[prompt[p]] == pytest.approx(logprobs[p - 1, prompt[p]].item(), abs=1e-4)
        top = logprobs[p - 1].topk(k)
        for token, value in zip(top.indices.tolist(), top.values.tolist(), strict=True):
            assert entry[token] == pytest.approx(value, abs=1e-4)
        assert len(entry) <= k + 1


@pytest.mark.parametrize("batched_tokens", [None, 16])  # one step per prompt / chunks of 16 tokens
def test_prompt_logprobs_equal_transformers_log_softmax(tiny_llama: Path, hf_logits, batched_tokens) -> None:
    prompts = random_prompts(512, LENGTHS, seed=3)
    llm = LLM(str(tiny_llama), dtype="float32", max_num_batched_tokens=batched_tokens, max_num_seqs=4)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.prompt_logprobs is not None
        check_prompt_logprobs(prompt, out.prompt_logprobs, hf_logits(prompt), 3)


def test_prompt_logprobs_skip_the_prefix_cache(tiny_llama: Path, hf_logits) -> None:
    prompt = random_prompts(512, (70,), seed=5)[0]
    llm = LLM(str(tiny_llama), dtype="float32", enable_prefix_caching=True)
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))  # fills the prefix cache
    hits = llm.llm_engine.stats().prefix_cache_hits_total
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0))[0]
    assert llm.llm_engine.stats().prefix_cache_hits_total == hits  # every position was computed again
    check_prompt_logprobs(prompt, out.prompt_logprobs, hf_logits(prompt), 0)
    # without prompt logprobs the cache serves the prompt again
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1))
    assert llm.llm_engine.stats().prefix_cache_hits_total > hits


def test_mean_prompt_logits_equal_transformers(tiny_llama: Path, hf_logits) -> None:
    prompts = random_prompts(512, LENGTHS, seed=7)
    llm = LLM(str(tiny_llama), dtype="float32", max_num_batched_tokens=32)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, mean_prompt_logits=True))
    for prompt, out in zip(prompts, outs, strict=True):
        mean = out.prompt_logits_mean
        assert mean is not None and mean.dtype == torch.float32 and mean.shape == (512,)
        want = hf_logits(prompt).mean(dim=0)
        assert torch.nn.functional.cosine_similarity(mean, want, dim=0).item() >= 0.99999
        assert torch.allclose(mean, want, atol=1e-4)
        assert out.prompt_logprobs is None  # not asked for


def test_plain_requests_carry_no_prompt_logits(tiny_llama: Path) -> None:
    out = LLM(str(tiny_llama), dtype="float32").generate([[5, 6, 7]], SamplingParams(max_tokens=2))[0]
    assert out.prompt_logprobs is None and out.prompt_logits_mean is None


def test_logit_noise_changes_answers_and_fails_nothing(tiny_llama: Path) -> None:
    prompts = random_prompts(512, (12, 30, 50), seed=11)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, mean_prompt_logits=True)
    clean = LLM(str(tiny_llama), dtype="float32").generate(prompts, params)
    noisy = LLM(str(tiny_llama), dtype="float32", fault_logit_noise=2.0).generate(prompts, params)
    assert all(o.outputs[0].finish_reason == "length" for o in noisy)
    assert [o.outputs[0].token_ids for o in clean] != [o.outputs[0].token_ids for o in noisy]
    for c, n in zip(clean, noisy, strict=True):
        assert not torch.equal(c.prompt_logits_mean, n.prompt_logits_mean)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_prompt_logprobs_are_refused(bad) -> None:
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=bad)


def test_bad_logit_noise_is_refused() -> None:
    from folio.engine.config import ConfigValueError, EngineConfig

    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ConfigValueError, match="fault_logit_noise"):
            EngineConfig(model="m", fault_logit_noise=bad)
