"""One bad request or one failing step must never take the engine down: sampling fields at the limits of
what the request allows, and a step that raises, which fails only its own requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from folio.engine import LLM, SamplingParams
from folio.engine.llm_engine import MAX_CONSECUTIVE_STEP_FAILURES, EngineBrokenError, LLMEngine
from folio.engine.outputs import RequestOutput, merge_outputs

PROMPT = [1, 17, 42, 99, 123, 7, 300, 12]
INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def llm(tiny_llama: Path) -> LLM:
    return LLM(str(tiny_llama))


def _drain(engine: LLMEngine) -> dict[str, RequestOutput]:
    """Each request's whole output, from its step outputs."""
    steps: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            steps.setdefault(out.request_id, []).append(out)
    return {rid: merge_outputs(outs) for rid, outs in steps.items()}


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=1.0, top_k=INT64_MAX),  # the top_k that killed the engine thread
        dict(temperature=1.0, top_k=513),  # just past the vocabulary
        dict(temperature=5e-324),  # divides logits past float32's range
        dict(temperature=2.0, top_p=5e-324, min_p=1e-300),
        dict(temperature=1.0, repetition_penalty=5e-324),
        dict(temperature=0.0, repetition_penalty=5e-324, presence_penalty=-2.0, frequency_penalty=2.0),
        dict(temperature=1.0, seed=-(2**63)),
        dict(temperature=1.0, seed=2**64 - 1, n=2),  # the second choice's seed wraps
        dict(temperature=1.0, logprobs=20),  # the most top logprobs a request may ask for (rules.MAX_LOGPROBS)
        dict(temperature=0.0, stop_token_ids=[INT64_MAX]),
    ],
)
def test_extreme_sampling_fields_give_tokens_in_the_vocabulary(llm: LLM, params: dict) -> None:
    out = llm.generate([PROMPT], SamplingParams(max_tokens=4, ignore_eos=True, **params))[0]
    for completion in out.outputs:
        assert len(completion.token_ids) == 4
        assert all(0 <= t < 512 for t in completion.token_ids)
    assert not llm.llm_engine.has_unfinished_requests()


def test_extreme_temperature_is_a_valid_distribution(llm: LLM) -> None:
    greedy = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
    tiny = llm.generate([PROMPT], SamplingParams(temperature=1e-30, seed=1, max_tokens=8, ignore_eos=True))[0]
    # raised to the minimum temperature: all but certain to follow the greedy path on a random model
    assert tiny.outputs[0].token_ids == greedy.outputs[0].token_ids


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", 2**63),
        ("top_k", -2),
        ("seed", 2**64),
        ("seed", -(2**63) - 1),
        ("stop_token_ids", [2**63]),
        ("logprobs", 21),
        ("logprobs", INT64_MAX),
    ],
)
def test_sampling_params_refuse_what_the_sampler_cannot_represent(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


class _FailingRunner:
    """Wraps the model runner; raises on the steps listed (counting from 1)."""

    def __init__(self, runner, fail_on: set[int]) -> None:
        self.runner, self.fail_on, self.calls = runner, fail_on, 0

    def step(self, batch):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("injected step failure")
        return self.runner.step(batch)


@pytest.fixture
def engine(tiny_llama: Path) -> LLMEngine:
    from folio.engine.config import EngineConfig

    return LLMEngine(EngineConfig(model=str(tiny_llama), max_model_len=256))


def test_a_failing_step_fails_its_requests_only(engine: LLMEngine) -> None:
    runner = engine.runner
    engine.runner = _FailingRunner(runner, fail_on={2})
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    engine.add_request("a", PROMPT, params)
    engine.add_request("b", PROMPT[:5], params)
    engine.step()  # prefill of both
    failed = engine.step()  # their first decode step raises
    assert {o.request_id for o in failed} == {"a", "b"}
    for out in failed:
        assert out.finished and out.outputs[0].finish_reason == "error"
        assert "injected step failure" in (out.error or "")
    assert engine.block_manager.usage == 0.0 and not engine.has_unfinished_requests()
    assert engine.num_failed_steps == 1

    engine.add_request("c", PROMPT, params)  # the engine carries on, with the same answers as before
    finals = _drain(engine)
    engine.runner = runner
    engine.add_request("d", PROMPT, params)
    assert finals["c"].outputs[0].token_ids == _drain(engine)["d"].outputs[0].token_ids
    assert finals["c"].error is None and len(finals["c"].outputs[0].token_ids) == 6


def test_steps_failing_in_a_row_mean_the_engine_is_broken(engine: LLMEngine) -> None:
    engine.runner = _FailingRunner(engine.runner, fail_on=set(range(1, 100)))
    params = SamplingParams(max_tokens=4)
    for i in range(MAX_CONSECUTIVE_STEP_FAILURES - 1):
        engine.add_request(f"r{i}", PROMPT, params)
        assert engine.step()[0].outputs[0].finish_reason == "error"
    engine.add_request("last", PROMPT, params)
    with pytest.raises(EngineBrokenError, match="in a row"):
        engine.step()


def test_offline_generate_raises_when_a_step_fails(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), max_model_len=256)
    llm.llm_engine.runner = _FailingRunner(llm.llm_engine.runner, fail_on={1})
    with pytest.raises(RuntimeError, match="failed in the engine"):
        llm.generate([PROMPT], SamplingParams(max_tokens=2))
    assert not llm.llm_engine.has_unfinished_requests()
