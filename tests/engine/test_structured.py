"""Structured output in the engine: every constrained answer fits its constraint (checked with jsonschema and
re), greedy and sampled at temperature 1.0, on a random-weight model whose free answers fit nothing; a
logit bias bans or forces tokens; constrained and free requests share steps without changing the free ones."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from folio.engine import LLM, SamplingParams
from folio.engine.rules import RuleError
from folio.engine.structured.params import StructuredOutputsParams

SCHEMAS: dict[str, dict[str, Any]] = {
    "nested objects, enums, optional": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "kind": {"enum": ["cat", "dog", "bird"]},
            "owner": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 99}},
                      "required": ["age"], "additionalProperties": False},
            "nickname": {"type": "string", "maxLength": 4},
        },
        "required": ["name", "kind", "owner"],
        "additionalProperties": False,
    },
    "arrays with bounds, numbers with bounds": {
        "type": "object",
        "properties": {
            "scores": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                       "minItems": 2, "maxItems": 4},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "ok": {"type": "boolean"},
        },
        "required": ["scores", "ratio", "ok"],
        "additionalProperties": False,
    },
    "anyOf, $ref and $defs, patterns": {
        "$defs": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
        "type": "object",
        "properties": {
            "id": {"$ref": "#/$defs/code"},
            "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"},
                                {"type": "string", "enum": ["none"]}]},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/code"}, "maxItems": 2},
        },
        "required": ["id", "value"],
        "additionalProperties": False,
    },
}  # fmt: skip


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def llm(tiny_llama: Path, request: pytest.FixtureRequest) -> LLM:
    """The tiny model under each structured-output backend (``--structured-outputs-backend``)."""
    return LLM(str(tiny_llama), dtype="float32", max_model_len=512, structured_outputs_backend=request.param)


def _texts(llm: LLM, params: list[SamplingParams], prompt: str = "Answer:") -> list[tuple[str, str]]:
    outs = llm.generate([prompt] * len(params), params)
    return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_answer_validates_against_its_schema(llm: LLM, name: str) -> None:
    schema = SCHEMAS[name]
    constraint = StructuredOutputsParams(json=schema)
    params = [SamplingParams(temperature=0.0, max_tokens=200, structured_outputs=constraint)]
    params += [SamplingParams(temperature=1.0, seed=s, max_tokens=200, structured_outputs=constraint) for s in range(6)]
    answers = _texts(llm, params)
    for text, reason in answers:
        if reason == "stop":
            jsonschema.validate(json.loads(text), schema)
        else:  # a bounded number may still run on in zeros (1.000…, llguidance): the limit cuts it
            assert reason == "length" and text.startswith("{"), text
    assert sum(reason == "stop" for _, reason in answers) >= len(answers) - 2, answers


def test_a_free_answer_of_the_same_model_fits_no_schema(llm: LLM) -> None:
    """The check above is not vacuous: unconstrained, this random model writes no JSON at all."""
    for text, _ in _texts(llm, [SamplingParams(temperature=1.0, seed=s, max_tokens=40) for s in range(4)]):
        with pytest.raises(ValueError):
            json.loads(text)


def test_choice_regex_grammar_and_any_json_object(llm: LLM) -> None:
    kinds = {
        "choice": StructuredOutputsParams(choice=("yes", "no", "it depends")),
        "regex": StructuredOutputsParams(regex=r"[a-z]{2,5}-\d{2}"),
        "grammar": StructuredOutputsParams(grammar='root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'),
    }
    for kind, constraint in kinds.items():
        params = [SamplingParams(temperature=1.0, seed=s, max_tokens=120, structured_outputs=constraint)
                  for s in range(5)]  # fmt: skip
        for text, reason in _texts(llm, params):
            assert reason == "stop", (kind, text)
            if kind == "choice":
                assert text in ("yes", "no", "it depends")
            elif kind == "regex":
                assert re.fullmatch(r"[a-z]{2,5}-\d{2}", text), text
            else:
                assert re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", text), text


def test_json_object_is_an_object(llm: LLM) -> None:
    """Any JSON object (OpenAI's json_object; an array or a bare value is not one). A random model's object
    need not close within max_tokens: those cut by the limit are the start of one."""
    constraint = StructuredOutputsParams(json_object=True)
    params = [SamplingParams(temperature=t, seed=s, max_tokens=120, structured_outputs=constraint)
              for t in (0.0, 1.0) for s in range(4)]  # fmt: skip
    answers = _texts(llm, params)
    assert any(reason == "stop" for _, reason in answers)
    for text, reason in answers:
        assert text.startswith("{"), text
        if reason == "stop":
            assert isinstance(json.loads(text), dict), text


@pytest.mark.parametrize("string", [{"type": "string"}, {"type": "string", "maxLength": 5}])
def test_json_strings_take_no_control_characters_and_no_surrogates(llm: LLM, string: dict[str, Any]) -> None:
    """What JSON and UTF-8 forbid in a string (xgrammar's own string rules let them through; see compiler)."""
    grammars = llm.llm_engine.grammars
    compiled = grammars.compile(StructuredOutputsParams(json={"type": "object", "properties": {"s": string}}))
    byte_token = _byte_tokens(llm)

    def inside_a_string() -> Any:
        """A matcher past '{"s": "x' (or '{"s":"x': the backends differ in their separators)."""
        for prefix in (b'{"s": "x', b'{"s":"x'):
            matcher = grammars.matcher(compiled)
            if all(matcher.accept_token(byte_token[b]) for b in prefix):
                return matcher
        raise AssertionError("no separator the grammar takes")

    for bad in (b"\t", b"\x02", b"\xed\xa0"):  # a tab, a control character, a surrogate's first two bytes
        matcher = inside_a_string()
        assert not all(matcher.accept_token(byte_token[b]) for b in bad), bad
    matcher = inside_a_string()
    assert all(matcher.accept_token(byte_token[b]) for b in b"\xc3\xa9")  # é


def _byte_tokens(llm: LLM) -> dict[int, int]:
    """Each byte's own token in the tiny model's byte-level vocabulary."""
    from xgrammar import TokenizerInfo

    info = TokenizerInfo.from_huggingface(llm.get_tokenizer(), vocab_size=llm.llm_engine.model_config.vocab_size)
    return {raw[0]: i for i, raw in enumerate(info.decoded_vocab) if len(raw) == 1}


def test_an_answer_cut_by_max_tokens_ends_with_length(llm: LLM) -> None:
    constraint = StructuredOutputsParams(regex=r"[a-z]{50}")
    ((text, reason),) = _texts(llm, [SamplingParams(temperature=0.0, max_tokens=3, structured_outputs=constraint)])
    assert reason == "length" and re.fullmatch(r"[a-z]+", text)


def test_constrained_and_free_requests_share_steps_and_free_ones_do_not_change(llm: LLM) -> None:
    free = SamplingParams(temperature=0.0, max_tokens=24)
    alone = _texts(llm, [free])
    constraint = StructuredOutputsParams(json=SCHEMAS["nested objects, enums, optional"])
    mixed = _texts(llm, [free, SamplingParams(temperature=0.0, max_tokens=200, structured_outputs=constraint), free])
    assert mixed[0] == mixed[2] == alone[0]
    jsonschema.validate(json.loads(mixed[1][0]), SCHEMAS["nested objects, enums, optional"])


def test_the_bitmask_filled_beside_the_forward_or_after_it_gives_the_same_answers(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    constraint = StructuredOutputsParams(json=SCHEMAS["nested objects, enums, optional"])
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=200, structured_outputs=constraint) for i in range(4)]
    filler = llm.llm_engine.runner.sampler.bitmasks
    answers = {}
    for overlap in (True, False):
        monkeypatch.setattr(filler, "overlap", overlap)
        answers[overlap] = _texts(llm, params)
    assert answers[True] == answers[False]
    assert all(reason == "stop" for _, reason in answers[True])


def test_logit_bias_bans_and_forces_tokens(llm: LLM) -> None:
    free = llm.generate(["Answer:"], SamplingParams(temperature=0.0, max_tokens=8))[0].outputs[0]
    banned = {t: -100.0 for t in set(free.token_ids)}
    again = llm.generate(["Answer:"], SamplingParams(temperature=0.0, max_tokens=8, logit_bias=banned))[0].outputs[0]
    assert not set(again.token_ids) & set(banned)
    forced = llm.generate(["Answer:"], SamplingParams(temperature=1.0, seed=3, max_tokens=6, logit_bias={65: 100.0},
                                                        ignore_eos=True))[0].outputs[0]  # fmt: skip
    assert forced.token_ids == [65] * 6


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (lambda: StructuredOutputsParams(json={"type": "objectx"}), "cannot be compiled"),
        (lambda: StructuredOutputsParams(regex="(ab"), "cannot be compiled"),
        (lambda: StructuredOutputsParams(grammar='root ::= "a" ('), "cannot be compiled"),
        (lambda: StructuredOutputsParams(grammar="\x80"), "cannot be compiled"),  # (xgrammar: UnicodeDecodeError)
        (lambda: StructuredOutputsParams(json="{not json"), "not valid JSON"),
        (lambda: StructuredOutputsParams(regex="a", choice=("a",)), "exactly one of"),
        (lambda: StructuredOutputsParams(), "exactly one of"),
        (lambda: StructuredOutputsParams(choice=()), "non-empty list"),
    ],
)
def test_bad_constraints_are_refused_before_anything_is_queued(llm: LLM, constraint: Any, message: str) -> None:
    with pytest.raises(RuleError, match=message):
        llm.generate(["x"], SamplingParams(max_tokens=4, structured_outputs=constraint()))
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.parametrize(("bias", "message"), [({10_000: 1.0}, "not in the vocabulary"), ({1: 101.0}, "from -100"),
                                                ({1: float("nan")}, "from -100"), ({-1: 1.0}, "keys must be")])
def test_bad_logit_bias_is_refused(llm: LLM, bias: dict[int, float], message: str) -> None:
    with pytest.raises(RuleError, match=message):
        llm.generate(["x"], SamplingParams(max_tokens=4, logit_bias=bias))


def test_a_compile_past_its_bound_is_refused_and_its_grammar_cached_once_done(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A constraint that compiles too slowly is a RuleError (the server's 400) instead of a hang; the compile
    goes on in its thread, so the next request of that constraint finds it compiled."""
    import threading

    engine = llm.llm_engine
    backend = type(engine.grammars)
    grammars = backend(llm.get_tokenizer(), engine.model_config.vocab_size, sorted(engine.eos_token_ids),
                       timeout_s=0.2)  # fmt: skip
    release = threading.Event()
    slow = backend._compile

    def held(self: Any, params: StructuredOutputsParams) -> Any:
        release.wait(30)  # a compile that takes as long as the test says
        return slow(self, params)

    monkeypatch.setattr(backend, "_compile", held)
    constraint = StructuredOutputsParams(regex=r"[0-9]{4}")
    with pytest.raises(RuleError, match=r"did not compile within 0\.2 s") as err:
        grammars.compile(constraint)
    assert err.value.param == "structured_outputs"
    release.set()
    deadline = time.monotonic() + 30
    while grammars.cached(constraint) is None:
        assert time.monotonic() < deadline, "the compile never finished"
        time.sleep(0.01)
    assert grammars.compile(StructuredOutputsParams(regex=r"[0-9]{4}")) is grammars.cached(constraint)
    grammars.close()


def test_the_backends_are_the_flags_choices() -> None:
    from folio.engine.config import STRUCTURED_OUTPUTS_BACKENDS
    from folio.engine.structured.compiler import BACKENDS

    assert tuple(BACKENDS) == STRUCTURED_OUTPUTS_BACKENDS


def test_a_compile_over_before_its_callback_is_added_does_not_deadlock(llm: LLM) -> None:
    """A compile can end (a quick error, say) before `compile` adds its done-callback under the cache's
    lock: the callback then runs at once in that thread, and must not wait for the lock it already holds."""
    import threading
    from concurrent.futures import Future

    engine = llm.llm_engine
    grammars = type(engine.grammars)(llm.get_tokenizer(), engine.model_config.vocab_size, sorted(engine.eos_token_ids))

    def at_once(fn: Any, *args: Any) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args))
        except Exception as exc:
            done.set_exception(exc)
        return done

    grammars._pool.submit = at_once  # type: ignore[method-assign]
    for fits in (True, False):
        outcome: list[Any] = []
        constraint = StructuredOutputsParams(regex=r"[a-z]+" if fits else "(ab")
        caller = threading.Thread(target=lambda c=constraint, out=outcome: out.append(_outcome(grammars.compile, c)),
                                  daemon=True)  # fmt: skip
        caller.start()
        caller.join(30)
        assert not caller.is_alive(), "compile deadlocked on its own lock"
        assert (outcome[0] is not None and grammars.cached(constraint) is outcome[0]) if fits else \
            isinstance(outcome[0], RuleError)  # fmt: skip
    grammars.close()


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except RuleError as exc:
        return exc


def test_offline_chat_hands_the_tools_to_the_chat_template(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = llm.get_tokenizer()
    template = Path(__file__).parents[1] / "support" / "templates" / "qwen2_5_tools.jinja"
    monkeypatch.setattr(tok, "chat_template", template.read_text())
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    messages = [{"role": "user", "content": "Time?"}]
    [out] = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=2), tools=[tool])
    assert "<tools>\n" + json.dumps(tool) in tok.decode(out.prompt_token_ids)
    [plain] = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=2))
    assert "<tools>" not in tok.decode(plain.prompt_token_ids)


def test_the_bitmask_is_filled_beside_the_forward_only_where_a_core_is_free_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    import torch

    from folio.engine.structured.mask import spare_core

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert not spare_core(torch.device("cpu")) and spare_core(torch.device("cuda"))
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert spare_core(torch.device("cpu"))


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_constrained_answers_speculate_and_are_the_same(tiny_llama: Path, backend: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Speculation under grammars and logit biases: each verify row is masked by the grammar's state after the
    proposals before it, so greedy answers are the ones decoded a token at a time, sampled ones fit their
    constraints and repeat under a seed, and the matcher ends where the kept tokens put it."""
    from folio.engine.spec_decode.speculator import Speculator

    monkeypatch.setattr(Speculator, "step_budget", lambda self, n, lengths: sum(lengths))  # propose in every step
    engine = {"dtype": "float32", "max_model_len": 512, "structured_outputs_backend": backend}
    schema = SCHEMAS["arrays with bounds, numbers with bounds"]
    constraints = [StructuredOutputsParams(json=schema), StructuredOutputsParams(regex="(ab|cd|ef){6,12}"),
                   StructuredOutputsParams(json=SCHEMAS["nested objects, enums, optional"])]  # fmt: skip
    greedy = [SamplingParams(temperature=0.0, max_tokens=120, structured_outputs=c) for c in constraints]
    greedy.append(SamplingParams(temperature=0.0, max_tokens=24, logit_bias={65: 8.0, 66: 8.0}))
    nested = SCHEMAS["nested objects, enums, optional"]
    sampled = [SamplingParams(temperature=1.0, seed=i, max_tokens=200, structured_outputs=(constraints[2], constraints[1])[i % 2])
               for i in range(4)]  # fmt: skip  (the nested schema and the regex, in turns: each ends)
    with LLM(str(tiny_llama), **engine) as plain:
        want = _texts(plain, greedy)
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    with LLM(str(tiny_llama), **engine, speculative_config=ngram) as spec:
        assert _texts(spec, greedy[:3]) == want[:3]  # the grammars' alone first: they proposed, and kept some
        stats = spec.llm_engine.stats().spec_decode
        assert stats is not None and stats.num_drafts > 0 and stats.num_accepted_tokens > 0
        assert _texts(spec, greedy) == want
        answers = _texts(spec, sampled)
        assert _texts(spec, sampled) == answers
    for (text, reason), params in zip(answers, sampled, strict=True):
        assert reason == "stop", text
        if params.structured_outputs.json is not None:
            jsonschema.validate(json.loads(text), nested)
        else:
            assert re.fullmatch("(ab|cd|ef){6,12}", text), text
