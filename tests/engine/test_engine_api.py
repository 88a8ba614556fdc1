"""The engine API: bad input is a clear ValueError that leaves nothing behind; abort; digests; stepping."""

from __future__ import annotations

from pathlib import Path

import pytest

from folio.engine import LLM, SamplingParams
from folio.engine.config import EngineConfig
from folio.engine.digest import DigestMismatchError, compute_digest
from folio.engine.llm_engine import LLMEngine
from folio.engine.outputs import merge_outputs
from folio.engine.tokenizer.detokenizer import IncrementalDetokenizer

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_llama: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_llama), max_model_len=256, kv_cache_memory_gib=0.00005))


def assert_idle(engine: LLMEngine) -> None:
    assert not engine.has_unfinished_requests()
    assert engine.stats().kv_cache_usage == 0.0


def test_prompt_longer_than_max_model_len(engine: LLMEngine) -> None:
    # the HTTP API's words (`folio.engine.rules.check_context`); max_tokens is cut to fit, but one token must
    words = r"maximum context length is 256 tokens\. However, you requested 301 tokens \(300 in the prompt"
    with pytest.raises(ValueError, match=words):
        engine.add_request("long", [5] * 300, GREEDY)
    assert_idle(engine)


def test_request_that_can_never_fit_the_kv_cache(engine: LLMEngine) -> None:
    capacity = engine.block_manager.num_blocks * engine.block_manager.block_size
    assert capacity == 96  # 6 blocks of 16 tokens in 0.00005 GiB
    with pytest.raises(ValueError, match=rf"holds only {capacity} tokens"):
        engine.add_request("huge", [5] * 50, SamplingParams(max_tokens=100))
    assert_idle(engine)


@pytest.mark.parametrize(
    ("prompt", "match"),
    [([], "empty"), ([5, 512], r"\[0, 512\), got 512"), ([5, -1], "got -1")],
)
def test_bad_prompts(engine: LLMEngine, prompt: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", prompt, GREEDY)
    assert_idle(engine)


def test_duplicate_request_id_and_n(engine: LLMEngine) -> None:
    # only a caller inside Folio can break these (LLM and the server number sequences and fan n out)
    engine.add_request("dup", [5, 6, 7], GREEDY)
    with pytest.raises(AssertionError, match="already in use"):
        engine.add_request("dup", [5, 6, 7], GREEDY)
    with pytest.raises(AssertionError, match="n=2"):
        engine.add_request("many", [5, 6, 7], SamplingParams(n=2))
    engine.abort_request("dup")
    assert_idle(engine)


def test_abort_frees_blocks(engine: LLMEngine) -> None:
    engine.add_request("a", list(range(3, 40)), SamplingParams(max_tokens=40, ignore_eos=True))
    engine.step()
    assert engine.stats().kv_cache_usage > 0 and engine.stats().num_running == 1
    engine.abort_request("a")
    engine.abort_request("unknown")  # a no-op
    assert_idle(engine)


def test_step_outputs_are_deltas(engine: LLMEngine, tiny_llama: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    engine.add_request("s", "naïve café 日本語 😀", params)
    deltas = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == "s" and out.prompt == "naïve café 日本語 😀"
            assert out.first_token_time is not None and out.first_token_time >= out.arrival_time
            deltas.append(out)
    # each step hands over its own token (and its logprobs) only; together they are the whole output
    assert [len(o.outputs[0].token_ids) for o in deltas] == [1] * 12
    assert [len(o.outputs[0].logprobs or []) for o in deltas] == [1] * 12
    assert [o.finished for o in deltas] == [False] * 11 + [True]
    seen = [merge_outputs(deltas[: i + 1]) for i in range(len(deltas))]
    assert [len(o.outputs[0].token_ids) for o in seen] == list(range(1, 13))
    for o in seen:
        assert not o.outputs[0].text.endswith("\ufffd")
    whole = LLM(str(tiny_llama), max_model_len=256).generate("naïve café 日本語 😀", params)[0].outputs[0]
    assert (whole.text, whole.token_ids) == (seen[-1].outputs[0].text, seen[-1].outputs[0].token_ids)
    assert_idle(engine)


@pytest.mark.parametrize("stop", [[], ["never there", "x" * 12]])
def test_a_long_stream_hands_over_each_token_and_character_once(tiny_llama: Path, stop: list[str]) -> None:
    # what a stream costs: every step hands over its own token and new text, never what came before
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), max_model_len=1024))
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=900, ignore_eos=True, logprobs=1, stop=stop)
    engine.add_request("long", [5, 6, 7], params)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step()
    assert len(deltas) == 900 and all(len(d.outputs[0].token_ids) == 1 for d in deltas)
    assert all(len(d.outputs[0].logprobs or ()) == 1 for d in deltas)
    assert all(d.prompt_token_ids is deltas[0].prompt_token_ids for d in deltas)  # shared, not copied
    texts = [d.outputs[0].text for d in deltas]
    tokens = [t for d in deltas for t in d.outputs[0].token_ids]
    # every character handed over once (with stop strings, some only at the end: held back, never resent)
    # (a random model's bytes may end in half a character, which the engine never hands over)
    assert "".join(texts) == engine.tokenizer.decode(tokens, skip_special_tokens=True).rstrip("\ufffd")
    assert len("".join(texts)) > 900 and max(map(len, texts)) <= len("".join(texts)) // 20


def test_generate_with_one_bad_prompt_schedules_nothing(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), max_model_len=64)
    with pytest.raises(ValueError, match="maximum context length is 64 tokens"):
        llm.generate([[5, 6], [7] * 100], GREEDY)
    assert_idle(llm.llm_engine)
    assert len(llm.generate([[5, 6]], GREEDY)[0].outputs[0].token_ids) == 8


def test_digest_checked_before_loading(tiny_llama: Path) -> None:
    good = compute_digest(tiny_llama)
    LLMEngine(EngineConfig(model=str(tiny_llama), digest=good, kv_cache_memory_gib=0.001))
    with pytest.raises(DigestMismatchError, match="do not match the pinned digest"):
        LLMEngine(EngineConfig(model=str(tiny_llama), digest="sha256:" + "0" * 64))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": "float8"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"block_size": 12}, "block_size"),
        ({"kv_cache_memory_gib": 0}, "kv_cache_memory_gib"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy"),
    ],
)
def test_bad_engine_config(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineConfig(model="unused", **kwargs)


def test_priority_needs_the_priority_policy_and_then_orders_the_queue(engine: LLMEngine, tiny_llama: Path) -> None:
    with pytest.raises(ValueError, match="priority 1 needs the priority scheduling policy") as refused:
        engine.add_request("p", [1, 5, 6], GREEDY, priority=1)
    assert refused.value.param == "priority"  # type: ignore[attr-defined]
    assert_idle(engine)
    llm = LLM(str(tiny_llama), max_model_len=256, max_num_seqs=1, scheduling_policy="priority")
    prompts = [[1, 5, 6], [1, 7, 8], [1, 9, 10]]
    outs = llm.generate(prompts, GREEDY, priority=[2, 0, 1])
    first = sorted(range(3), key=lambda i: outs[i].first_token_time or 0)
    assert first == [1, 2, 0]  # one at a time (max_num_seqs 1), lowest priority value first
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


def test_max_model_len_above_the_model_limit(tiny_llama: Path) -> None:
    with pytest.raises(ValueError, match="max_model_len 4096 exceeds the model's max_position_embeddings 1024"):
        LLMEngine(EngineConfig(model=str(tiny_llama), max_model_len=4096))


def test_detokenizer_never_splits_multibyte_characters(engine: LLMEngine) -> None:
    tok = engine.tokenizer
    text = "naïve café — ünïcödé 日本語 テキスト 😀 emoji ✓"
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) > len(text.split())  # multi-byte characters span several tokens
    detok = IncrementalDetokenizer(tok, [])
    pieces = []
    for t in ids:
        pieces.append(detok.add(t))
        assert not "".join(pieces).endswith("\ufffd")
    assert "".join(pieces) == text


def test_sharded_safetensors_load_the_same_model(tiny_llama: Path, tmp_path: Path) -> None:
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    for f in tiny_llama.iterdir():
        if f.name.startswith("tokenizer") or f.name == "chat_template.jinja":
            shutil.copy(f, tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    prompts = [[5, 6, 7, 8], list(range(3, 50))]
    want = [o.outputs[0].token_ids for o in LLM(str(tiny_llama)).generate(prompts, GREEDY)]
    assert [o.outputs[0].token_ids for o in LLM(str(tmp_path)).generate(prompts, GREEDY)] == want


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_dtypes_run(tiny_llama: Path, dtype: str) -> None:
    llm = LLM(str(tiny_llama), dtype=dtype)
    assert str(llm.llm_engine.dtype) == f"torch.{dtype}"
    out = llm.generate([[5, 6, 7], list(range(3, 40))], GREEDY)
    assert [len(o.outputs[0].token_ids) for o in out] == [8, 8]
