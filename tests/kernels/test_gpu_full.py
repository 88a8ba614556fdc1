"""The same kernel-vs-reference comparisons at production sizes, compiled on a real GPU (marker ``gpu``)."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.decode_attention import paged_decode_attention
from folio.kernels.kv_store import store_kvcache
from folio.kernels.prefill_attention import paged_prefill_attention
from folio.kernels.rms_norm import fused_add_rms_norm
from folio.kernels.rotary import apply_rotary_embedding, rope_cos_sin_cache
from tests.kernels.paged import TOL, make_paged_kv

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
BF16 = torch.bfloat16


@pytest.mark.parametrize(("batch", "max_len", "group"), [(1, 8192, 8), (16, 2048, 8), (64, 2048, 4), (256, 512, 1)])
def test_decode_at_full_size(batch: int, max_len: int, group: int) -> None:
    gen = torch.Generator().manual_seed(batch)
    lens = torch.randint(1, max_len + 1, (batch,), generator=gen).tolist()
    lens[0] = max_len
    kv = make_paged_kv(lens, 16, 4, 128, BF16, CUDA)
    q = torch.randn(batch, 4 * group, 128, device=CUDA, dtype=BF16)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 128**-0.5)
    expected = paged_decode_attention(*args, backend="reference")
    torch.testing.assert_close(paged_decode_attention(*args), expected, **TOL[BF16])            # auto → Triton
    torch.testing.assert_close(paged_decode_attention(*args, max_context_len=max_len), expected, **TOL[BF16])
    torch.testing.assert_close(paged_decode_attention(*args, num_splits=7), expected, **TOL[BF16])


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
def test_prefill_with_cached_prefixes_at_full_size(dtype: torch.dtype) -> None:
    lens = [4096, 3000, 1, 777, 2048, 1500]
    q_lens = [4096, 1000, 1, 17, 512, 1]        # whole prompt, chunk after a prefix, decode, prefix hit
    kv = make_paged_kv(lens, 16, 8, 128, dtype, CUDA)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=CUDA)
    q = torch.randn(sum(q_lens), 32, 128, device=CUDA, dtype=dtype)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables, 128**-0.5)
    torch.testing.assert_close(paged_prefill_attention(*args), paged_prefill_attention(*args, backend="reference"),
                               **TOL[dtype])


def test_store_norm_and_rope_at_full_size() -> None:
    n = 8192
    qkv = torch.randn(n, 48, 128, device=CUDA, dtype=BF16)
    k_cache = torch.zeros(1024, 16, 8, 128, device=CUDA, dtype=BF16)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(1024 * 16, device=CUDA)[:n]
    store_kvcache(qkv[:, 32:40], qkv[:, 40:], k_cache, v_cache, slots)
    assert torch.equal(k_cache.view(-1, 8, 128)[slots], qkv[:, 32:40])
    assert torch.equal(v_cache.view(-1, 8, 128)[slots], qkv[:, 40:])

    x, residual, weight = (torch.randn(n, 4096, device=CUDA, dtype=BF16) for _ in range(3))
    out, res = fused_add_rms_norm(x, residual, weight[0], 1e-5)
    ref_out, ref_res = fused_add_rms_norm(x, residual, weight[0], 1e-5, backend="reference")
    assert torch.equal(res, ref_res)
    torch.testing.assert_close(out, ref_out, **TOL[BF16])

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    cache = rope_cos_sin_cache(128, 131072, 500000.0, scaling, device=CUDA, dtype=BF16)
    positions = torch.randint(0, 131072, (n,), device=CUDA)
    a, b = qkv.clone(), qkv.clone()
    apply_rotary_embedding(positions, a[:, :32], a[:, 32:40], cache)
    apply_rotary_embedding(positions, b[:, :32], b[:, 32:40], cache, backend="reference")
    torch.testing.assert_close(a, b, **TOL[BF16])


def test_decode_replays_in_a_cuda_graph() -> None:
    # The engine captures decode steps: no host sync inside, and new lengths/tables are honoured on replay.
    kv = make_paged_kv([700, 64, 1, 2000], 16, 4, 128, BF16, CUDA)
    q = torch.randn(4, 32, 128, device=CUDA, dtype=BF16)
    lens = kv.context_lens.clone()
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, lens, 128**-0.5)
    bound = kv.block_tables.shape[1] * 16  # the tables' capacity, as the engine's graphs pass max_model_len
    paged_decode_attention(*args, max_context_len=bound)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_decode_attention(*args, max_context_len=bound)
    lens.copy_(torch.tensor([5, 64, 1, 1999], dtype=torch.int32))
    q.normal_()
    graph.replay()
    torch.testing.assert_close(out, paged_decode_attention(*args, backend="reference"), **TOL[BF16])
