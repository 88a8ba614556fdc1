"""Multi-LoRA in the engine (CPU, float32, tiny random models): greedy outputs under an adapter equal the
unmerged peft model's, a batch mixing adapters gives each request what it gets alone, adapters wait for a
slot, the prefix cache is per adapter, and the API refuses what it cannot serve."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from folio.engine import LLM, LoRAError, LoRARequest, SamplingParams
from folio.kernels import lora_cpu
from tests.support.lora import make_adapter, peft_greedy
from tests.support.models import make_tiny_llama

FAMILIES = {
    "llama": {},
    "qwen3": {"head_dim": 16},
    "gemma3_text": {"head_dim": 16, "query_pre_attn_scalar": 16},
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Path] = {}

    def build(arch: str) -> Path:
        if arch not in cache:
            cache[arch] = make_tiny_llama(tmp_path_factory.mktemp(arch), arch=arch, **FAMILIES[arch])
        return cache[arch]

    return build


@pytest.fixture(scope="module")
def adapters(models, tmp_path_factory: pytest.TempPathFactory):
    """(arch, rank, seed) → a LoRARequest for a random adapter of that model."""
    cache: dict[tuple[str, int, int], LoRARequest] = {}

    def build(arch: str, r: int = 8, seed: int = 1) -> LoRARequest:
        key = (arch, r, seed)
        if key not in cache:
            path = make_adapter(models(arch), tmp_path_factory.mktemp(f"{arch}-r{r}-s{seed}"), r=r, seed=seed)
            cache[key] = LoRARequest(f"{arch}-r{r}-s{seed}", len(cache) + 1, str(path))
        return cache[key]

    return build


def prompts(n: int, lengths: tuple[int, ...] = (5, 37), seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 512, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_greedy_matches_peft(models, adapters, arch: str) -> None:
    """Ranks 8 and 64 and the base model in one batch, each as peft's unmerged model generates."""
    model_dir = models(arch)
    loras = [adapters(arch, 8), adapters(arch, 64, seed=2), None]
    ps = prompts(6)
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=64)
    per_prompt = [loras[i % 3] for i in range(6)]
    outs = llm.generate(ps, GREEDY, lora_request=per_prompt)
    for lora in loras:
        mine = [i for i in range(6) if per_prompt[i] is lora]
        want = peft_greedy(model_dir, lora, [ps[i] for i in mine], GREEDY.max_tokens)
        assert [outs[i].outputs[0].token_ids for i in mine] == want, lora
        assert all(outs[i].lora_request == lora for i in mine)


def test_mixed_batch_equals_alone(models, adapters) -> None:
    """Four adapters and the base model in one batch (chunked prefills beside decodes) give each request
    exactly what it gets alone."""
    model_dir = models("llama")
    loras = [adapters("llama", 8, seed=s) for s in (1, 2, 3, 4)] + [None]
    ps = prompts(10, lengths=(3, 50, 21, 9, 70))
    per_prompt = [loras[i % 5] for i in range(10)]
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_loras=4, max_lora_rank=8,
              max_num_batched_tokens=64)
    together = tokens(llm.generate(ps, GREEDY, lora_request=per_prompt))
    alone = [tokens(llm.generate([p], GREEDY, lora_request=lora))[0] for p, lora in zip(ps, per_prompt, strict=True)]
    assert together == alone
    assert len({tuple(t) for t in together[:5]}) == 5  # each adapter changes the output


def test_adapter_waits_for_a_slot(models, adapters) -> None:
    """max_loras=1, two adapters: the second waits (the base request behind it does not) and finishes."""
    model_dir = models("llama")
    a, b = adapters("llama", 8, seed=1), adapters("llama", 8, seed=2)
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_loras=1, max_lora_rank=8)
    engine = llm.llm_engine
    engine.add_lora(a)
    engine.add_lora(b)
    assert engine.lora_resident() == [b.lora_name], "read (checked) when added; one host-cache place: the last"
    ps = prompts(3)
    engine.add_request("a", ps[0], GREEDY, lora_request=a)
    engine.add_request("b", ps[1], GREEDY, lora_request=b)
    engine.add_request("base", ps[2], GREEDY)
    done: dict[str, list[int]] = {}
    first = True
    while engine.has_unfinished_requests():
        for out in engine.step():
            done.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
        if first:  # b waits for a's slot; the base request behind it runs
            assert [s.request_id for s in engine.scheduler.running] == ["a", "base"]
            assert engine.lora_state() == ([a.lora_name], [b.lora_name])
            first = False
    assert engine.lora_state() == ([], [])
    # one host-cache place (max_cpu_loras = max_loras = 1): b, read last, is the one in memory now
    assert engine.lora_resident() == [b.lora_name]
    assert done["b"] == tokens(llm.generate([ps[1]], GREEDY, lora_request=b))[0]
    assert done["a"] == tokens(llm.generate([ps[0]], GREEDY, lora_request=a))[0]


def test_prefix_cache_is_per_adapter(models, adapters) -> None:
    model_dir = models("llama")
    a = adapters("llama", 8, seed=1)
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_lora_rank=8, block_size=16)
    engine = llm.llm_engine
    p = prompts(1, lengths=(40,))
    llm.generate(p, GREEDY)  # the base model caches the prompt's two full blocks
    hits = engine.stats().prefix_cache_hits_total
    out = tokens(llm.generate(p, GREEDY, lora_request=a))
    assert engine.stats().prefix_cache_hits_total == hits  # nothing of the base model's is reused
    assert out == peft_greedy(model_dir, a, p, GREEDY.max_tokens)
    assert tokens(llm.generate(p, GREEDY, lora_request=a)) == out
    assert engine.stats().prefix_cache_hits_total == hits + 32  # within one adapter it is


def test_remove_while_running_lets_it_finish(models, adapters) -> None:
    model_dir = models("llama")
    a = adapters("llama", 8, seed=1)
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_lora_rank=8)
    engine = llm.llm_engine
    want = tokens(llm.generate(prompts(1), GREEDY, lora_request=a))[0]
    assert engine.list_loras() == [a]
    engine.add_request("r", prompts(1)[0], GREEDY, lora_request=a)
    got: list[int] = engine.step()[0].outputs[0].token_ids
    assert engine.remove_lora(a.lora_name)
    assert not engine.remove_lora(a.lora_name)
    assert engine.list_loras() == []
    with pytest.raises(LoRAError, match="not loaded"):
        engine.add_request("s", prompts(1)[0], GREEDY, lora_request=a)
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.extend(out.outputs[0].token_ids)
            assert out.lora_request == a
    assert got == want
    assert engine.lora_slots.slot_of(a.lora_int_id) is None  # its slot is free once it finished


def test_refusals(models, adapters, tmp_path: Path) -> None:
    model_dir = models("llama")
    a = adapters("llama", 8, seed=1)
    base_only = LLM(str(model_dir), dtype="float32")
    with pytest.raises(LoRAError, match="not enabled"):
        base_only.llm_engine.add_request("x", [5, 6, 7], GREEDY, lora_request=a)
    with pytest.raises(LoRAError, match="not enabled"):
        base_only.generate([[5, 6, 7]], GREEDY, lora_request=a)
    assert not base_only.llm_engine.has_unfinished_requests()

    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_lora_rank=4)
    engine = llm.llm_engine
    with pytest.raises(LoRAError, match="not loaded"):
        engine.add_request("x", [5, 6, 7], GREEDY, lora_request=a)
    with pytest.raises(LoRAError, match="max-lora-rank"):  # rank 8 > 4: refused, nothing registered
        engine.add_lora(a)
    missing = LoRARequest("missing", 9, str(tmp_path / "nope"))
    with pytest.raises(LoRAError, match="not a folder"):
        engine.add_lora(missing)
    assert engine.list_loras() == [] and not engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LLM(str(model_dir), dtype="float32", enable_lora=True, max_loras=2, max_cpu_loras=1)


def test_adapter_failing_to_load_fails_its_request_only(models, adapters, tmp_path: Path) -> None:
    """An adapter evicted from the host cache whose files then went bad: its request fails with an
    error, the others are served."""
    model_dir = models("llama")
    src = Path(adapters("llama", 8, seed=1).lora_path)
    a = LoRARequest("fragile", 1, str(shutil.copytree(src, tmp_path / "fragile")))
    b = adapters("llama", 8, seed=2)
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_loras=1, max_cpu_loras=1, max_lora_rank=8)
    engine = llm.llm_engine
    engine.add_lora(a)
    engine.add_lora(b)  # evicts a from the host cache
    (tmp_path / "fragile" / "adapter_model.safetensors").write_bytes(b"corrupt")
    engine.add_request("a", [5, 6, 7], GREEDY, lora_request=a)
    engine.add_request("b", [5, 6, 7], GREEDY, lora_request=b)
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert finished["a"].outputs[0].finish_reason == "error" and "fragile" in finished["a"].error
    assert finished["b"].outputs[0].finish_reason == "length"


@pytest.mark.parametrize("native", [True, False], ids=["native kernel", "PyTorch plans"])
def test_decode_graphs_replay_any_mix_of_adapters(models, adapters, monkeypatch, native: bool) -> None:
    """CPU step graphs record decode steps with adapter tokens once and replay them as the adapters in the
    slots and the rows' mix change: tokens as the eager engine's; through the native kernel, and where it
    is not built through the dense plan (graphs) and the grouped plans (eager)."""
    if not native:
        monkeypatch.setattr(lora_cpu, "supports", lambda *args: False)
    elif not lora_cpu.AVAILABLE:
        pytest.skip("the native LoRA kernel is not built here")
    model_dir = models("llama")
    loras = [adapters("llama", 8, seed=s) for s in (1, 2, 3)]
    ps = prompts(2, lengths=(5, 9))
    kwargs = dict(dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    llm = LLM(str(model_dir), **kwargs)
    graphs = llm.llm_engine.runner.decode_graphs
    if graphs is None:
        pytest.skip("no CPU step graphs in this build (the native decode kernel)")
    eager = LLM(str(model_dir), enforce_eager=True, **kwargs)
    for mix in ([loras[0], loras[1]], [loras[1], None], [loras[2], loras[0]], [None, loras[2]], [None, None]):
        assert tokens(llm.generate(ps, params, lora_request=mix)) == tokens(eager.generate(ps, params, lora_request=mix))
    assert (2, True) in graphs._graphs and (2, False) in graphs._graphs


def test_preempted_sequence_keeps_its_slot(models, adapters) -> None:
    """A KV cache too small for both: one is preempted and recomputed under its adapter, holding its
    slot meanwhile (max_loras=2, so neither waits for a slot); both get what they get alone."""
    model_dir = models("llama")
    a, b = adapters("llama", 8, seed=1), adapters("llama", 8, seed=2)
    per_block = 2 * 2 * 16 * 2 * 16 * 4  # layers, K and V, block_size, KV heads, head_dim, float32
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8, block_size=16,
              kv_cache_memory_gib=6 * per_block / 2**30)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ps = prompts(2, lengths=(37, 30))
    together = tokens(llm.generate(ps, params, lora_request=[a, b]))
    engine = llm.llm_engine
    assert engine.stats().num_preemptions_total > 0
    assert together == [tokens(llm.generate([p], params, lora_request=r))[0] for p, r in zip(ps, (a, b), strict=True)]
    assert all(s.refs == 0 for s in engine.lora_slots.slots)


def test_removing_an_adapter_lets_its_queued_requests_finish(models, adapters) -> None:
    """Unloading an adapter refuses new requests for it; those already queued under it (waiting for a slot
    here) still run under it, and it is forgotten after the last; an aborted queued one drops its claim."""
    model_dir = models("llama")
    a, b = adapters("llama", 8, seed=1), adapters("llama", 8, seed=2)
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_loras=1, max_lora_rank=8)
    alone = {r.lora_name: tokens(llm.generate([[5, 6, 7]], GREEDY, lora_request=r))[0] for r in (a, b)}
    engine = llm.llm_engine
    engine.add_request("a", [5, 6, 7], GREEDY, lora_request=a)
    engine.add_request("b", [5, 6, 7], GREEDY, lora_request=b)
    engine.add_request("b-aborted", [5, 6, 7], GREEDY, lora_request=b)
    got: dict[str, list[int]] = {"a": list(engine.step()[0].outputs[0].token_ids), "b": []}
    assert engine.lora_state() == ([a.lora_name], [b.lora_name])  # one slot: b's requests wait
    assert engine.remove_lora(b.lora_name)
    with pytest.raises(LoRAError, match="not loaded"):
        engine.add_request("b-late", [5, 6, 7], GREEDY, lora_request=b)
    engine.abort_request("b-aborted")
    while engine.has_unfinished_requests():
        for out in engine.step():
            got[out.request_id].extend(out.outputs[0].token_ids)
            if out.finished:
                assert out.outputs[0].finish_reason == "length", out.request_id
    assert got == {"a": alone[a.lora_name], "b": alone[b.lora_name]}
    slots = engine.lora_slots
    assert not slots.removed and not +slots.claims and slots.slot_of(b.lora_int_id) is None


def test_moe_model_adapts_its_dense_projections(tmp_path: Path) -> None:
    """Qwen3-MoE: LoRA on attention and the dense MLP layer; the sparse layer's experts run as before."""
    model_dir = make_tiny_llama(tmp_path / "moe", arch="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=32, decoder_sparse_step=2, head_dim=16)
    path = make_adapter(model_dir, tmp_path / "a", r=8, target_modules=["q_proj", "v_proj", "o_proj"], seed=3)
    lora = LoRARequest("moe-a", 1, str(path))
    ps = prompts(2)
    llm = LLM(str(model_dir), dtype="float32", enable_lora=True, max_lora_rank=8)
    assert tokens(llm.generate(ps, GREEDY, lora_request=lora)) == peft_greedy(model_dir, lora, ps, GREEDY.max_tokens)


def test_tensor_parallel_adapters_match_peft(models, adapters) -> None:
    """TP=2 (gloo, two processes): each rank holds its shard of every adapter in the same slot; a batch
    mixing two adapters and the base model, with max_loras=1 so the slots are rewritten mid-run."""
    model_dir = models("llama")
    loras = [adapters("llama", 8, seed=1), adapters("llama", 8, seed=2), None]
    ps = prompts(3)
    llm = LLM(str(model_dir), dtype="float32", max_model_len=256, kv_cache_memory_gib=0.02, enable_lora=True,
              max_loras=1, max_lora_rank=8, tensor_parallel_size=2)
    try:
        outs = tokens(llm.generate(ps, GREEDY, lora_request=loras))
    finally:
        llm.llm_engine.close()
    for i, lora in enumerate(loras):
        assert outs[i] == peft_greedy(model_dir, lora, [ps[i]], GREEDY.max_tokens)[0], lora


def test_smollm2_with_adapters_matches_peft(smollm2_dir: Path, tmp_path: Path) -> None:
    """A real model: SmolLM2-135M with a rank-16 and an rsLoRA rank-8 adapter and the base model in one batch,
    each token for token as peft's unmerged model."""
    a = LoRARequest("smol-a", 1, str(make_adapter(smollm2_dir, tmp_path / "a", r=16, seed=5)))
    b = LoRARequest("smol-b", 2, str(make_adapter(smollm2_dir, tmp_path / "b", r=8, seed=6,
                                                   use_rslora=True, target_modules=["q_proj", "v_proj", "down_proj"])))
    ps = prompts(2)
    llm = LLM(str(smollm2_dir), dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=16)
    got = tokens(llm.generate([ps[0], ps[1], ps[0]], GREEDY, lora_request=[a, b, None]))
    want = [peft_greedy(smollm2_dir, a, ps[:1], GREEDY.max_tokens)[0],
            peft_greedy(smollm2_dir, b, ps[1:], GREEDY.max_tokens)[0],
            peft_greedy(smollm2_dir, None, ps[:1], GREEDY.max_tokens)[0]]
    assert got == want
    assert got[0] != got[2]  # the adapter changed the answer
