"""Speculative decoding with a draft model: the draft's own paged cache kept in step with each sequence,
exact greedy output whatever the draft proposes, seeds, and the start-up checks of the draft."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from folio.engine import LLM, SamplingParams
from folio.engine.config import EngineConfig
from folio.engine.llm_engine import LLMEngine
from folio.engine.loader import load_model_config
from folio.engine.model_runner import kv_bytes_per_block
from folio.engine.sampling_params import SamplingParams as Params
from folio.engine.spec_decode.draft_model import DraftModelError
from folio.engine.spec_decode.speculator import Speculator
from tests.engine.test_families import FAMILIES
from tests.engine.test_spec_decode_engine import repetitive_prompts, run_checked
from tests.support.models import make_tiny_llama


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A target, a smaller draft of another family with the same tokenizer, and drafts the target refuses."""
    made = tmp_path_factory.mktemp("models")
    return {
        "target": make_tiny_llama(made / "target", randomize_norms=True, **FAMILIES["qwen3"]),
        "draft": make_tiny_llama(made / "draft", num_hidden_layers=1, hidden_size=32, seed=3),
        "other_vocab": make_tiny_llama(made / "other_vocab", vocab_size=384, num_hidden_layers=1),
        "short": make_tiny_llama(made / "short", num_hidden_layers=1, max_position_embeddings=64),
    }


def draft_config(path: Path, k: int = 4) -> dict:
    return {"model": str(path), "num_speculative_tokens": k}


@pytest.fixture
def always_speculate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every decoding sequence proposes all it may (a tiny draft costs as much as the tiny target here, so the
    step budget would soon turn proposals off)."""
    monkeypatch.setattr(Speculator, "step_budget", lambda self, n, lengths: sum(lengths))


def greedy_runs(target: Path, draft: Path, **engine: object) -> tuple[list[list[int]], list[list[int]], LLMEngine]:
    prompts = repetitive_prompts(512, seed=2)
    params = [Params(temperature=0.0, max_tokens=n) for n in (40, 7, 33, 40)]
    base = LLMEngine(EngineConfig(str(target), dtype="float32", device="cpu", **engine))
    want = run_checked(base, prompts, params)
    spec = LLMEngine(EngineConfig(str(target), dtype="float32", device="cpu", speculative_config=draft_config(draft),
                                  **engine))  # fmt: skip
    return want, run_checked(spec, prompts, params), spec


def test_the_target_as_its_own_draft_keeps_nearly_every_proposal(models, always_speculate) -> None:
    """The draft's cache follows each sequence exactly: the target proposing for itself is kept at almost every
    position (a shadow reading a stale or a refused proposal's K/V would propose something else), with a
    small KV cache and chunked prefill (prompts over several steps, preemptions) on the way."""
    cfg, _ = load_model_config(models["target"])
    both = 2 * kv_bytes_per_block(cfg, 16, torch.float32)  # a block of the target's cache and of the draft's
    want, got, spec = greedy_runs(models["target"], models["target"], max_num_batched_tokens=24,
                                  kv_cache_memory_gib=8 * both / 2**30)  # fmt: skip
    stats = spec.stats().spec_decode
    assert spec.scheduler.num_preemptions_total > 0
    assert got == want
    assert stats is not None and stats.num_draft_tokens > 40 and stats.acceptance_rate > 0.9, stats


def test_a_smaller_draft_of_another_family_gives_the_targets_greedy_output(models, always_speculate) -> None:
    want, got, spec = greedy_runs(models["target"], models["draft"])
    stats = spec.stats().spec_decode
    assert got == want
    assert stats is not None and stats.num_drafts > 0
    assert spec.draft is not None and not spec.draft._shadows  # finished sequences leave nothing in its cache
    assert spec.draft.block_manager is not None
    assert spec.draft.block_manager.num_free_blocks == len(spec.draft.block_manager.blocks)


def test_a_seeded_sampled_request_gives_the_same_answer_every_run(models, always_speculate) -> None:
    prompt = repetitive_prompts(512)[1]
    params = SamplingParams(temperature=0.9, max_tokens=24, seed=7)
    runs = [LLM(str(models["target"]), dtype="float32", device="cpu",
                speculative_config=draft_config(models["target"])).generate([prompt], params)
            for _ in range(2)]  # fmt: skip
    assert runs[0][0].outputs[0].token_ids == runs[1][0].outputs[0].token_ids
    assert len(runs[0][0].outputs[0].token_ids) == 24


@pytest.mark.parametrize(
    ("draft", "message"),
    [
        ("other_vocab", "has another vocabulary than the target's"),
        ("short", "reads at most 64 positions"),
        ("missing", "does not exist"),
    ],
)
def test_a_draft_the_target_cannot_use_is_a_clear_start_up_error(models, tmp_path: Path, draft: str,
                                                                 message: str) -> None:  # fmt: skip
    path = models.get(draft, tmp_path / "nowhere")
    with pytest.raises(DraftModelError, match=message):
        LLMEngine(EngineConfig(str(models["target"]), device="cpu", max_model_len=256,
                               speculative_config=draft_config(path)))  # fmt: skip
