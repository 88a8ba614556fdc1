"""The native CPU prefill-attention kernel (kernels/csrc/prefill_attention_cpu.c) against the PyTorch reference.

The engine runs it for every prompt segment on the CPU, so the cases are the engine's: a whole prompt
(L = n), a chunk after cached tokens (L > n), sliding windows, grouped-query attention with group sizes that
do and do not divide the kernel's 16-vector tiles, head_dims 64/128 and a generic one, queries that are a
view of a fused QKV output, and threads; on each vector path this CPU has.
"""

from __future__ import annotations

import pytest
import torch

from folio.kernels import prefill_attention_cpu
from folio.kernels.attention_reference import prefill_attention_ref
from tests.kernels.conftest import each_simd_width
from tests.kernels.paged import TOL, make_paged_kv

pytestmark = pytest.mark.skipif(not prefill_attention_cpu.AVAILABLE, reason="no AVX-512 or AVX2 here")
simd_width = each_simd_width(prefill_attention_cpu._cpu_prefill)  # AVX-512 and AVX2, where the CPU has them


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None) -> torch.Tensor:
    """The paged reference over one sequence whose context is exactly k/v."""
    block = 16
    kv = make_paged_kv([k.shape[0]], block, k.shape[1], k.shape[2], k.dtype, "cpu")
    kv.k_cache.view(-1, k.shape[1], k.shape[2])[: k.shape[0]] = k  # one sequence: lay it out in slot order
    kv.v_cache.view(-1, k.shape[1], k.shape[2])[: k.shape[0]] = v
    blocks = -(-k.shape[0] // block)
    tables = torch.arange(blocks, dtype=torch.int32)[None]
    lens = torch.tensor([k.shape[0]], dtype=torch.int32)
    cu = torch.tensor([0, q.shape[0]], dtype=torch.int32)
    return prefill_attention_ref(q, kv.k_cache, kv.v_cache, cu, lens, tables, scale, window)


CASES = [  # (n queries, L keys, heads, kv_heads, head_dim, window)
    (37, 37, 9, 3, 64, None),      # SmolLM2's heads, a whole prompt: groups of 3 straddle the tiles
    (5, 300, 8, 2, 128, None),     # a chunk after 295 cached tokens
    (64, 64, 4, 4, 64, None),      # no grouping
    (20, 90, 16, 2, 64, 24),       # a window shorter than the context, groups of 8
    (1, 1, 2, 1, 80, None),        # one token; a head_dim the generic path runs
    (33, 50, 6, 1, 256, 7),
]


@pytest.mark.parametrize(("n", "length", "heads", "kv_heads", "head_dim", "window"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_reference(n: int, length: int, heads: int, kv_heads: int, head_dim: int, window: int | None,
                               dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(n * length + heads)
    q = (torch.randn(n, heads, head_dim, generator=g) * 2).to(dtype)
    k = (torch.randn(length, kv_heads, head_dim, generator=g) * 2).to(dtype)
    v = torch.randn(length, kv_heads, head_dim, generator=g).to(dtype)
    scale = head_dim**-0.5
    got = prefill_attention_cpu.prefill_attention_cpu(q, k, v, scale, window=window)
    assert got.dtype == dtype and got.shape == q.shape
    torch.testing.assert_close(got, reference(q, k, v, scale, window), **TOL[dtype])


def test_strided_views_of_a_fused_qkv_output_and_an_output_slice() -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim, n = 9, 3, 64, 45
    qkv = torch.randn(n, heads + 2 * kv_heads, dim)
    q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
    out = torch.full((n + 10, heads, dim), float("nan"))
    prefill_attention_cpu.prefill_attention_cpu(q, k, v, 0.125, out=out[5 : n + 5])
    torch.testing.assert_close(out[5 : n + 5], reference(q, k, v, 0.125, None), **TOL[torch.float32])
    assert out[:5].isnan().all() and out[n + 5 :].isnan().all()  # nothing written outside the slice


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_split_the_tiles_without_changing_results(threads: int) -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(400, 8, 64, generator=g), torch.randn(400, 2, 64, generator=g),
               torch.randn(400, 2, 64, generator=g))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = prefill_attention_cpu.prefill_attention_cpu(q, k, v, 0.125)
        torch.set_num_threads(threads)
        multi = prefill_attention_cpu.prefill_attention_cpu(q, k, v, 0.125)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(single, multi)  # each tile is computed by one thread, the same way


def test_bad_inputs_are_value_errors() -> None:
    q, kv = torch.randn(4, 4, 64), torch.randn(4, 2, 64)
    with pytest.raises(ValueError, match="head_dim a multiple of 16"):
        prefill_attention_cpu.prefill_attention_cpu(torch.randn(4, 4, 40), kv, kv, 1.0)
    with pytest.raises(ValueError, match="each token's heads contiguous"):
        prefill_attention_cpu.prefill_attention_cpu(q, kv.transpose(0, 1), kv.transpose(0, 1), 1.0)
    with pytest.raises(ValueError, match="5 queries over 4 keys"):
        prefill_attention_cpu.prefill_attention_cpu(torch.randn(5, 4, 64), kv, kv, 1.0)
    with pytest.raises(ValueError, match="with 3 heads over 2 KV heads"):
        prefill_attention_cpu.prefill_attention_cpu(torch.randn(4, 3, 64), kv, kv, 1.0)
    with pytest.raises(ValueError, match="window must be positive"):
        prefill_attention_cpu.prefill_attention_cpu(q, kv, kv, 1.0, window=0)
