"""The greedy LM head's bfloat16 screen (folio.engine.layers.greedy_head) against the float32 logits' first
maximum, which it must give whatever the inputs: random heads at several scales, exact ties, rows the screen
cannot narrow, non-finite hidden states; and the engine's greedy outputs with and without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from folio.engine import LLM, SamplingParams
from folio.engine.layers import greedy_head
from folio.engine.layers.greedy_head import GreedyScreen

needs_bf16 = pytest.mark.skipif(not greedy_head.available(torch.float32),
                                reason="no bfloat16 GEMMs on this CPU: float32 models take no screen")


def first_max(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x @ weight.T).max(dim=1).indices


@pytest.mark.parametrize("vocab, hidden", [(49152, 576), (5003, 96)])
@pytest.mark.parametrize("scale", [0.05, 1.0, 30.0])
def test_the_screen_gives_the_first_maximum_of_the_float32_logits(vocab: int, hidden: int, scale: float) -> None:
    g = torch.Generator().manual_seed(vocab + int(scale * 100))
    weight = torch.randn(vocab, hidden, generator=g) * 0.1
    x = torch.randn(64, hidden, generator=g) * scale
    assert torch.equal(GreedyScreen(weight)(x), first_max(x, weight))


def test_exact_ties_go_to_the_first_token_and_a_flat_row_to_the_first_column() -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(2000, 64, generator=g)
    weight[1500] = weight[700]  # the same row twice: equal float32 logits, the first wins
    x = torch.stack([weight[700] * 4, torch.zeros(64), weight[1999] * 4])  # the zero row ties everywhere
    tokens = GreedyScreen(weight)(x)
    assert tokens.tolist() == [700, 0, 1999]
    assert torch.equal(tokens, first_max(x, weight))


def test_a_non_finite_hidden_state_leaves_the_choice_to_the_float32_logits() -> None:
    weight = torch.randn(300, 32)
    x = torch.randn(3, 32)
    x[1, 5] = torch.nan
    assert GreedyScreen(weight)(x) is None
    x[1, 5] = torch.inf
    assert GreedyScreen(weight)(x) is None


@needs_bf16
def test_the_engine_decodes_the_same_tokens_with_the_screen(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM(str(tiny_llama), dtype="float32", max_model_len=256, kv_cache_memory_gib=0.05)
    model = llm.llm_engine.runner.model
    screen = model.greedy_screen
    assert screen is not None
    calls: list[int] = []
    real = screen.__call__

    def counted(x: torch.Tensor) -> torch.Tensor | None:
        calls.append(x.shape[0])
        return real(x)

    monkeypatch.setattr(model, "greedy_screen", counted)
    prompts = [[(11 * i + j) % 500 + 3 for i in range(5 + 7 * j)] for j in range(12)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    screened = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
    assert calls and max(calls) > 1  # batched steps went through the screen
    monkeypatch.setattr(model, "greedy_screen", None)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == screened
    calls.clear()
    monkeypatch.setattr(model, "greedy_screen", counted)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, logprobs=2))
    assert not calls  # log-probabilities need the logits
