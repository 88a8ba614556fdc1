"""The `folio.kernels` path (what CUDA runs) gives the same tokens as the PyTorch CPU path.

The kernels dispatch CPU tensors to their PyTorch reference twins, so the engine's kernel wiring
(slot mapping, block tables, cu_seqlens, context lengths, in-place rotary, fused norms) is checked here
without a GPU.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from folio.engine import LLM, SamplingParams
from folio.engine.layers import linear
from tests.support.models import make_tiny_llama

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def test_kernel_path_matches_cpu_path(tiny_variant) -> None:
    path: Path = tiny_variant("llama-gqa3-tied")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 512, (int(n),), generator=g).tolist() for n in (1, 5, 17, 40, 70, 33)]
    prompts.append(prompts[3] + [7, 8, 9])  # a prefix-cache hit: a prefill segment after cached blocks
    llm = LLM(str(path), max_num_batched_tokens=48)  # chunked prefill mixed with decodes
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    runner = llm.llm_engine.runner
    runner.use_kernels = True
    runner.model.use_kernels(True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == expected
    assert llm.llm_engine.stats().prefix_cache_hits_total > 0


def test_native_cpu_decode_matches_the_gather_path(tiny_variant) -> None:
    """The CPU decode path's two implementations: the C kernel over block tables, gather + SDPA in buckets."""
    from folio.kernels import decode_attention_cpu

    if not decode_attention_cpu.AVAILABLE:
        pytest.skip("the C extension was not built")
    path: Path = tiny_variant("llama-gqa4")
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 512, (int(n),), generator=g).tolist() for n in (1, 4, 16, 17, 45, 90, 31, 8)]
    llm = LLM(str(path), max_num_batched_tokens=40, block_size=16)
    runner = llm.llm_engine.runner
    assert runner.native_decode  # float32 on the CPU with the extension built
    native = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    runner.native_decode = False
    gathered = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert native == gathered


@pytest.mark.parametrize("variant", ["llama-gqa3-tied", "mistral-window"])
def test_native_cpu_prefill_matches_sdpa(tiny_variant, tmp_path, monkeypatch, variant: str) -> None:
    """The CPU prefill path's two implementations, over whole prompts, chunks after cached tokens (chunked
    prefill; the second run's prefix-cache hits) and a sliding window shorter than the prompts: the C kernel
    and SDPA give the same tokens."""
    from folio.kernels import prefill_attention_cpu

    if not prefill_attention_cpu.AVAILABLE:
        pytest.skip("no native prefill kernel here")
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 512, (int(n),), generator=g).tolist() for n in (1, 6, 19, 47, 80, 33)]
    prompts.append(prompts[4] + [11, 12, 13, 14])  # a prefix-cache hit
    path = (make_tiny_llama(tmp_path, arch="mistral", sliding_window=24) if variant == "mistral-window"
            else tiny_variant(variant))
    llm = LLM(str(path), max_num_batched_tokens=32, block_size=16)
    calls: list[tuple[int, int | None]] = []
    real = prefill_attention_cpu.prefill_attention_cpu
    monkeypatch.setattr(prefill_attention_cpu, "prefill_attention_cpu",
                        lambda q, *a, **k: calls.append((q.shape[0], k.get("window"))) or real(q, *a, **k))
    native = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert calls and max(n for n, _ in calls) <= 32
    assert {w for _, w in calls} == ({24} if variant == "mistral-window" else {None})
    monkeypatch.setattr(prefill_attention_cpu, "AVAILABLE", False)
    sdpa = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert native == sdpa
    assert llm.llm_engine.stats().prefix_cache_hits_total > 0


def test_float32_cpu_projections_change_no_token(tiny_variant, monkeypatch) -> None:
    """float32 CPU projections run on oneDNN's matmul over the row-major weights (where torch has oneDNN),
    else on MKL with the weights stored column-major: either way the tokens of plain row-major `F.linear`."""
    path: Path = tiny_variant("llama-gqa2")
    prompts = [[5, 9, 200, 31, 7], list(range(3, 40))]
    llm = LLM(str(path))
    model = llm.llm_engine.runner.model
    layer = model.layers[0]
    for weight in (layer.self_attn.qkv_weight, layer.self_attn.o_weight, layer.mlp.gate_up_weight,
                   layer.mlp.down_weight):
        assert weight.is_contiguous() if linear.ONEDNN else weight.t().is_contiguous()
    assert model.embed_tokens.is_contiguous()  # row lookups stay on rows
    fast = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    monkeypatch.setattr(linear, "ONEDNN", False)
    for param in model.parameters():
        param.data = param.data.contiguous()
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == fast


@pytest.mark.skipif(not linear.ONEDNN_BF16, reason="this CPU has no bfloat16 instructions for oneDNN")
def test_bfloat16_cpu_projections_are_prepacked_and_change_no_token(tiny_variant) -> None:
    """Where oneDNN has bfloat16 instructions the projections and the LM head are prepacked for it; the
    tokens are those of `F.linear` over the plain row-major weights (the same GEMM, re-laid-out per call)."""
    llm = LLM(str(tiny_variant("llama-gqa2")), dtype="bfloat16")
    model = llm.llm_engine.runner.model
    layer = model.layers[0]
    packed = [layer.self_attn.qkv_weight, layer.self_attn.o_weight, layer.mlp.gate_up_weight,
              layer.mlp.down_weight, model.lm_head]
    assert all(w.is_mkldnn and w.dtype == torch.bfloat16 for w in packed)
    prompts = [[5, 9, 200, 31, 7], list(range(3, 40))]
    fast = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    plain = LLM(str(tiny_variant("llama-gqa2")), dtype="bfloat16")
    unpack = plain.llm_engine.runner.model
    for module in unpack.modules():  # back to row-major dense weights: F.linear
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_mkldnn:
                setattr(module, name, torch.nn.Parameter(param.to_dense(), requires_grad=False))
    assert not any(p.is_mkldnn for p in unpack.parameters())
    assert [o.outputs[0].token_ids for o in plain.generate(prompts, GREEDY)] == fast


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_matches_f_linear(dtype) -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 32, generator=g).to(dtype)
    bias = torch.randn(48, generator=g).to(dtype)
    x = torch.randn(7, 64, generator=g).to(dtype)[:, ::2]  # a strided input, as chunk() views are
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0, "rtol": 0}
    torch.testing.assert_close(linear.linear(x, weight, bias), F.linear(x, weight, bias), **tol)
    torch.testing.assert_close(linear.linear(x, weight), F.linear(x, weight), **tol)
    torch.testing.assert_close(linear.linear(x, weight.t().contiguous().t()), F.linear(x, weight), **tol)
    assert linear.linear(x[:0], weight).shape == (0, 48)




def test_mixed_steps_send_decode_rows_to_the_decode_kernel(tiny_variant, monkeypatch: pytest.MonkeyPatch) -> None:
    """With chunked prefill, a step's decode rows go through the decode kernel (split-K, a tile sized for
    one query), not through the prefill kernel's 128-row query tile."""
    from folio.engine.layers import attention

    calls: list[tuple[str, int, int]] = []  # kernel, query rows, sequences
    real_prefill, real_decode = attention.paged_prefill_attention, attention.paged_decode_attention

    def prefill(q, k_cache, v_cache, cu, lens, *args, **kwargs):
        calls.append(("prefill", q.shape[0], lens.shape[0]))
        assert int(cu[-1]) == q.shape[0]  # the prefill rows, nothing else
        return real_prefill(q, k_cache, v_cache, cu, lens, *args, **kwargs)

    def decode(q, k_cache, v_cache, tables, lens, *args, **kwargs):
        calls.append(("decode", q.shape[0], lens.shape[0]))
        return real_decode(q, k_cache, v_cache, tables, lens, *args, **kwargs)

    monkeypatch.setattr(attention, "paged_prefill_attention", prefill)
    monkeypatch.setattr(attention, "paged_decode_attention", decode)
    llm = LLM(str(tiny_variant("llama-gqa3-tied")), max_num_batched_tokens=16, enable_prefix_caching=False)
    expected = [o.outputs[0].token_ids for o in llm.generate([[5] * 3, [6] * 40], GREEDY)]
    runner = llm.llm_engine.runner
    runner.use_kernels = True
    runner.model.use_kernels(True)
    calls.clear()
    got = [o.outputs[0].token_ids for o in llm.generate([[5] * 3, [6] * 40], GREEDY)]
    assert got == expected
    # the 40-token prompt is prefilled in chunks while the 3-token one decodes: mixed steps
    # (a layer of such a step calls the prefill kernel for the 40-token prompt's chunk alone, then the decode
    # kernel for the other's one token)
    assert any(a == "prefill" and a_seqs == 1 and a_rows > 1 and b == "decode" and b_rows == b_seqs == 1
               for (a, a_rows, a_seqs), (b, b_rows, b_seqs) in itertools.pairwise(calls)), calls
