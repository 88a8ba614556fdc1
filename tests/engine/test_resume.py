"""Continuing a request after the output tokens a client already has (`folio.engine.resume`): at every cut
point, the tokens and text before the seam plus those after it are exactly the uninterrupted run's."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from folio.engine import SamplingParams
from folio.engine.config import EngineConfig
from folio.engine.llm_engine import LLMEngine
from folio.engine.outputs import CompletionOutput
from folio.engine.resume import Replay
from folio.engine.rules import RuleError

PROMPT = [1, 17, 42, 99, 123, 7, 300, 12]
_ids = itertools.count()


@pytest.fixture(scope="module")
def engine(tiny_llama: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_llama), max_model_len=256))


def run(engine: LLMEngine, params: SamplingParams, resume: Replay | None = None) -> list[CompletionOutput]:
    """The request's step outputs, in order."""
    rid = f"r{next(_ids)}"
    engine.add_request(rid, PROMPT, params, resume=resume)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o.outputs[0] for o in engine.step() if o.request_id == rid]
    assert outs[-1].finished
    return outs


def assert_resumes_exactly(engine: LLMEngine, params: SamplingParams) -> list[CompletionOutput]:
    """Cut the uninterrupted run after every token; each continuation ends the answer as it ended."""
    full = run(engine, params)
    tokens = [t for o in full for t in o.token_ids]
    assert all(len(o.token_ids) == 1 for o in full)  # one token per step: every k is an output boundary
    text = "".join(o.text for o in full)
    for k in range(len(tokens)):
        replay = engine.replay(PROMPT, params, tokens[:k])
        assert not replay.finished
        assert replay.sent_text == "".join(o.text for o in full[:k]), f"the client's text at cut {k}"
        rest = run(engine, params, replay)
        assert tokens[:k] + [t for o in rest for t in o.token_ids] == tokens, f"tokens at cut {k}"
        assert replay.sent_text + "".join(o.text for o in rest) == text, f"text at cut {k}"
        assert (rest[-1].finish_reason, rest[-1].stop_reason) == (full[-1].finish_reason, full[-1].stop_reason)
    finished = engine.replay(PROMPT, params, tokens)  # the whole answer: finished as it was, text whole
    assert finished.finish == (full[-1].finish_reason, full[-1].stop_reason)
    assert finished.sent_text == text
    return full


def test_greedy_resumes_exactly_at_every_cut(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    full = assert_resumes_exactly(engine, params)
    tokens = [t for o in full for t in o.token_ids]
    # some cut falls inside a multi-byte character: the replay holds its bytes back as the run did
    assert any(engine.tokenizer.decode(tokens[:k]).endswith("\ufffd") for k in range(len(tokens)))


def test_stop_string_across_the_seam(engine: LLMEngine) -> None:
    base = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    text = "".join(o.text for o in run(engine, base))
    at = next(i for i in range(8, len(text) - 3) if text.find(text[i : i + 3]) == i)  # first seen there
    for include in (False, True):
        params = SamplingParams(
            temperature=0.0, max_tokens=40, ignore_eos=True, stop=[text[at : at + 3]], include_stop_str_in_output=include
        )
        full = assert_resumes_exactly(engine, params)
        assert full[-1].stop_reason == text[at : at + 3]


def test_penalties_see_the_tokens_before_the_seam(engine: LLMEngine) -> None:
    params = SamplingParams(
        temperature=0.0, max_tokens=24, ignore_eos=True, presence_penalty=0.7, frequency_penalty=0.4,
        repetition_penalty=1.3,
    )  # fmt: skip
    assert_resumes_exactly(engine, params)


def test_seeded_sampling_continues_its_random_stream(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=1.0, top_k=50, seed=4321, max_tokens=20, ignore_eos=True)
    assert_resumes_exactly(engine, params)


def test_prompt_logprobs_of_a_resumed_sequence(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=2)
    rid = f"r{next(_ids)}"
    engine.add_request(rid, PROMPT, params)
    first = []
    while engine.has_unfinished_requests():
        first += [o for o in engine.step() if o.request_id == rid]
    tokens = [t for o in first for t in o.outputs[0].token_ids]
    rid = f"r{next(_ids)}"
    engine.add_request(rid, PROMPT, params, resume=engine.replay(PROMPT, params, tokens[:3]))
    again = []
    while engine.has_unfinished_requests():
        again += [o for o in engine.step() if o.request_id == rid]
    got, want = again[0].prompt_logprobs, first[0].prompt_logprobs
    assert got is not None and want is not None and len(got) == len(want) == len(PROMPT) and got[0] is None
    for g, w in zip(got[1:], want[1:], strict=True):
        assert g is not None and w is not None and g.keys() == w.keys()
        assert list(g.values()) == pytest.approx(list(w.values()), abs=1e-5)
    assert tokens[:3] + [t for o in again for t in o.outputs[0].token_ids] == tokens


def test_a_continuation_must_have_room_left(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    tokens = [t for o in run(engine, params) for t in o.token_ids]
    finished = engine.replay(PROMPT, params, tokens)
    assert finished.finish == ("length", None)
    with pytest.raises(RuleError, match="no room") as err:
        engine.add_request("full", PROMPT, params, resume=finished)
    assert err.value.param == "folio_resume"
    with pytest.raises(ValueError, match="after the choice finished"):
        engine.replay(PROMPT, params, [*tokens, tokens[0]])
    with pytest.raises(RuleError, match="token ids") as err:
        engine.replay(PROMPT, params, [engine.model_config.vocab_size])
    assert err.value.param == "folio_resume"
    assert not engine.has_unfinished_requests()


def test_a_constrained_answer_resumes_exactly_its_grammar_past_the_seam(engine: LLMEngine) -> None:
    """The continuation's grammar starts where the carried tokens left it (not at its start), so the answer
    is the uninterrupted one and still fits the schema; tokens that do not fit the constraint are refused."""
    import json

    from folio.engine.structured.params import StructuredOutputsParams

    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                               "b": {"enum": ["x", "yy"]}}, "required": ["a", "b"]}  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=schema))
    full = assert_resumes_exactly(engine, params)
    answer = json.loads("".join(o.text for o in full))
    assert set(answer) == {"a", "b"} and answer["b"] in ("x", "yy")
    free = [t for o in run(engine, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)) for t in o.token_ids]
    with pytest.raises(RuleError, match="do not fit the answer's structured-output constraint"):
        engine.add_request("misfit", PROMPT, params, resume=engine.replay(PROMPT, params, free))
    assert not engine.has_unfinished_requests()
