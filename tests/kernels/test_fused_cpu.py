"""The native CPU elementwise ops (kernels/csrc/fused_cpu.c) against the PyTorch code they replace.

The rotary embedding, the residual add and the KV scatter must be bit-identical in both dtypes. The norm and
SiLU round where PyTorch rounds, but their float32 statistic and exponential may differ in the last bit:
float32 within an ulp or two; bfloat16 bit-identical on these inputs, whose values never put such a
difference on a rounding boundary (a rounding at the wrong place would show up on them at once). Each test
runs on each vector path this CPU has.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from folio.engine.layers.mlp import GatedMLP
from folio.engine.layers.norm import RMSNorm
from folio.engine.layers.rotary import rotate
from folio.kernels import fused_cpu
from folio.kernels.kv_store import store_kvcache_ref
from folio.kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from tests.kernels.conftest import each_simd_width

pytestmark = pytest.mark.skipif(not fused_cpu.VECTOR_DTYPES, reason="this CPU has neither AVX-512 nor AVX2")
simd_width = each_simd_width(fused_cpu._cpu_fused)  # AVX-512 and AVX2, where the CPU has them
DTYPES = [pytest.param(d, marks=pytest.mark.skipif(d not in fused_cpu.VECTOR_DTYPES, reason=f"no {d} path here"))
          for d in (torch.float32, torch.bfloat16)]
F32_TOL = {"rtol": 3e-7, "atol": 1e-7}


def assert_same(got: torch.Tensor, expected: torch.Tensor, exact: bool) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if exact:
        assert torch.equal(got, expected), f"{(got != expected).sum().item()} of {got.numel()} values differ"
    else:
        torch.testing.assert_close(got, expected, **F32_TOL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [576, 64, 204])  # 204: a row tail past the last vector (16 or 8 lanes)
def test_rms_norm_matches_transformers_rounding(dtype: torch.dtype, hidden: int) -> None:
    g = torch.Generator().manual_seed(hidden)
    wide = (torch.randn(37, hidden + 24, generator=g) * 3).to(dtype)
    x = wide[:, :hidden]  # rows further apart than they are long, as a slice of a wider output
    residual = torch.randn(37, hidden, generator=g).to(dtype)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    exact = dtype == torch.bfloat16
    assert_same(fused_cpu.rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), exact)
    out, summed = fused_cpu.rms_norm(x, weight, 1e-6, residual)
    expected, expected_sum = fused_add_rms_norm_ref(x, residual, weight, 1e-6)
    assert_same(summed, expected_sum, exact=True)  # the add rounds once, as PyTorch's does
    assert_same(out, expected, exact)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1536, 44])  # 44: a tail at 16 lanes and at 8
def test_silu_and_mul_matches_pytorch(dtype: torch.dtype, width: int) -> None:
    g = torch.Generator().manual_seed(width)
    gate_up = (torch.randn(19, 2 * width, generator=g) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    assert_same(fused_cpu.silu_and_mul(gate_up), F.silu(gate) * up, exact=dtype == torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_at_the_edges_of_the_exponential(dtype: torch.dtype) -> None:
    gate = torch.tensor([-1e4, -200.0, -104.0, -88.8, -88.0, -50.0, -1e-30, 0.0, -0.0, 1e-30, 3.0, 88.8, 100.0,
                         1e4, float("inf"), float("-inf"), float("nan")] * 2)[:32].to(dtype)
    gate_up = torch.cat([gate, torch.ones_like(gate)])[None]
    got, expected = fused_cpu.silu_and_mul(gate_up)[0], F.silu(gate)
    assert torch.equal(got.isnan(), expected.isnan())
    finite = ~expected.isnan()
    torch.testing.assert_close(got[finite], expected[finite], rtol=3e-7, atol=1e-30)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "head_dim", "half"), [(12, 64, 32), (3, 128, 64), (4, 64, 8), (2, 80, 20)])
def test_rotary_in_place_is_bit_identical_to_the_engine_rotate(
    dtype: torch.dtype, heads: int, head_dim: int, half: int
) -> None:
    g = torch.Generator().manual_seed(heads * head_dim + half)
    qkv = torch.randn(21, (heads + 2) * head_dim, generator=g).to(dtype)
    x = qkv[:, : heads * head_dim].view(21, heads, head_dim)  # strided rows, as the fused QKV output gives
    angles = torch.rand(21, 1, half, generator=g) * 100
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    expected = rotate(x, cos, sin)
    untouched = qkv[:, heads * head_dim :].clone()
    got = fused_cpu.rotate_(x, cos, sin)
    assert got.data_ptr() == x.data_ptr()
    assert_same(got, expected, exact=True)  # partial rotary included: the dimensions past 2 * half stay
    assert torch.equal(qkv[:, heads * head_dim :], untouched)


def test_bfloat16_subnormals_round_as_pytorch_does() -> None:
    if torch.bfloat16 not in fused_cpu.VECTOR_DTYPES:
        pytest.skip("no bfloat16 path here")
    tiny = torch.tensor([1e-39, -3e-39, 5e-41, 1.2e-38, 2e-39, 7e-40, 1.0, 3e38] * 4)
    x = torch.stack([tiny, tiny.flip(0)]).reshape(1, 1, 64).to(torch.bfloat16)
    cos, sin = torch.full((1, 1, 32), 0.5).to(torch.bfloat16), torch.full((1, 1, 32), 0.25).to(torch.bfloat16)
    expected = rotate(x, cos, sin)
    assert (expected != 0).sum() > 40  # the products are subnormal, and PyTorch keeps them
    assert torch.equal(fused_cpu.rotate_(x.clone(), cos, sin), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_store_kv_matches_the_reference_scatter(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.zeros(6, 16, 2, 64, dtype=dtype), torch.zeros(6, 16, 2, 64, dtype=dtype)
    qkv = torch.randn(5, 8 * 64, generator=g).to(dtype)
    key, value = qkv[:, 4 * 64 : 6 * 64].view(5, 2, 64), qkv[:, 6 * 64 :].view(5, 2, 64)
    slots = torch.tensor([3, 95, -1, 17, 40])
    assert fused_cpu.can_store(key, value)
    assert not fused_cpu.can_store(key.transpose(1, 2), value)  # heads not contiguous: the engine's fallback
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kvcache_ref(key, value, k_ref, v_ref, slots)
    fused_cpu.store_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_store_kv_refuses_a_slot_outside_the_cache_and_writes_nothing() -> None:
    k_cache, v_cache = torch.zeros(2, 16, 1, 64), torch.zeros(2, 16, 1, 64)
    key = torch.ones(3, 1, 64)
    with pytest.raises(ValueError, match=r"slot_mapping values must lie in \[-1, 32\), got 32 for token 2"):
        fused_cpu.store_kv(key, key, k_cache, v_cache, torch.tensor([0, 5, 32]))
    with pytest.raises(ValueError, match="got -2 for token 0"):
        fused_cpu.store_kv(key, key, k_cache, v_cache, torch.tensor([-2, 5, 6]))
    assert not k_cache.any() and not v_cache.any()


def spaced_rows(rows: int, width: int, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Random ``[rows, width]`` logits whose rows lie further apart than they are long, as a slice of a wider
    output (the same values for the same width)."""
    g = torch.Generator().manual_seed(width)
    return (torch.randn(rows, width + 7, generator=g) * scale).to(dtype)[:, :width]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [49152, 1003, 5])  # 1003 and 5: a row tail past the last vector
def test_argmax_is_the_first_maximum_as_max_finds_it(dtype: torch.dtype, vocab: int) -> None:
    x = spaced_rows(8, vocab, 5.0, dtype)
    x[1] = x[1].max()  # all tied: the first
    x[2, vocab // 2] = x[2, -1] = 1e4  # a tie between a vector lane and (for odd widths) the tail
    x[3] = -torch.inf  # nothing larger than -inf
    x[4, vocab - 1] = torch.nan  # a NaN is the maximum, wherever it is
    x[5, vocab // 3], x[5, vocab - 1] = torch.nan, torch.nan  # the first NaN
    x[6, -1] = 1e4  # the maximum in the tail
    got = fused_cpu.argmax(x)
    assert got.dtype == torch.int64
    assert torch.equal(got, x.float().max(dim=-1).indices)
    assert got[1] == 0 and got[2] == vocab // 2 and got[3] == 0 and got[4] == vocab - 1 and got[5] == vocab // 3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [49152, 1003, 5])  # 1003 and 5: a row tail past the last vector
def test_columns_reaching_are_the_nonzeros_of_the_bound(dtype: torch.dtype, vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab + 1)
    x = spaced_rows(6, vocab, 3.0, dtype)
    x[1, vocab - 1] = torch.nan  # NaN never reaches anything
    x[2] = 7.0  # every column, more than the cap holds
    col = torch.rand(vocab, generator=g) * 2
    floor = torch.tensor([2.5, 2.5, 7.0, float("inf"), -float("inf"), 4.0])
    slope = torch.tensor([0.5, 0.0, 0.0, 1.0, 0.0, 0.25])
    cap = 16
    idx, counts = fused_cpu.columns_reaching(x, floor, slope, col, 0.01, cap)
    v = x.float()
    hits = v + 0.01 * v.abs() + slope.unsqueeze(1) * col >= floor.unsqueeze(1)
    assert torch.equal(counts, hits.sum(1))
    for row in range(6):
        expected = hits[row].nonzero().flatten()[:cap]
        assert torch.equal(idx[row, : len(expected)], expected)
    assert counts[2] == vocab and counts[3] == 0 and counts[4] == vocab


def test_bad_inputs_are_value_errors() -> None:
    weight = torch.ones(64)
    with pytest.raises(ValueError, match="native CPU ops run"):
        fused_cpu.rms_norm(torch.ones(2, 64, dtype=torch.float16), weight.half(), 1e-6)
    with pytest.raises(ValueError, match=r"x must be \[rows, 64\]"):
        fused_cpu.rms_norm(torch.ones(2, 32), weight, 1e-6)
    with pytest.raises(ValueError, match="residual must match x"):
        fused_cpu.rms_norm(torch.ones(2, 64), weight, 1e-6, torch.ones(3, 64))
    with pytest.raises(ValueError, match="V >= 1"):
        fused_cpu.argmax(torch.ones(2, 0))
    with pytest.raises(ValueError, match="contiguous rows"):
        fused_cpu.argmax(torch.ones(64, 2).t())
    with pytest.raises(ValueError, match=r"col must be float32 \[8\]"):
        fused_cpu.columns_reaching(torch.ones(2, 8), torch.ones(2), torch.ones(2), torch.ones(9), 0.0, 4)
    with pytest.raises(ValueError, match="gate_up must be"):
        fused_cpu.silu_and_mul(torch.ones(2, 63))
    with pytest.raises(ValueError, match="cos/sin"):
        fused_cpu.rotate_(torch.ones(2, 1, 64), torch.ones(2, 1, 40), torch.ones(2, 1, 40))
    with pytest.raises(ValueError, match="slot_mapping must be int64"):
        fused_cpu.store_kv(torch.ones(2, 1, 64), torch.ones(2, 1, 64), torch.zeros(2, 16, 1, 64),
                           torch.zeros(2, 16, 1, 64), torch.tensor([0, 1], dtype=torch.int32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_layers_take_the_native_ops_and_give_what_their_pytorch_code_gives(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    norm = RMSNorm(128, 1e-5)
    norm.weight.data = (torch.rand(128) + 0.5).to(dtype)
    mlp = GatedMLP(128, 256)
    mlp.gate_up_weight.data, mlp.down_weight.data = torch.randn(512, 128).to(dtype), torch.randn(128, 256).to(dtype)
    x, residual = torch.randn(9, 128).to(dtype), torch.randn(9, 128).to(dtype)
    calls: list[str] = []
    for name in ("rms_norm", "silu_and_mul"):
        real = getattr(fused_cpu, name)
        monkeypatch.setattr(fused_cpu, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    native = (norm(x), norm(x, residual), mlp(x))
    assert calls == ["rms_norm", "rms_norm", "silu_and_mul"]
    monkeypatch.setattr(fused_cpu, "AVAILABLE", False)
    python = (norm(x), norm(x, residual), mlp(x))
    exact = dtype == torch.bfloat16
    assert_same(native[0], python[0], exact)
    assert_same(native[1][0], python[1][0], exact)
    assert_same(native[1][1], python[1][1], exact=True)
    if exact:
        assert_same(native[2], python[2], exact=True)
    else:
        torch.testing.assert_close(native[2], python[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [2, 3])
def test_threads_split_the_rows_without_changing_results(dtype: torch.dtype, threads: int) -> None:
    # enough rows that every op splits them (prefill-sized), an odd count so the ranges are uneven
    g = torch.Generator().manual_seed(threads)
    x, residual = (torch.randn(301, 576, generator=g).to(dtype) for _ in range(2))
    weight = (torch.rand(576, generator=g) + 0.5).to(dtype)
    gate_up = torch.randn(301, 2 * 1536, generator=g).to(dtype)
    qk = torch.randn(301, 12, 64, generator=g).to(dtype)
    cos, sin = torch.randn(301, 1, 32, generator=g).to(dtype), torch.randn(301, 1, 32, generator=g).to(dtype)
    kv = torch.randn(301, 3, 64, generator=g).to(dtype)
    slots = torch.randperm(64 * 16, generator=g)[:301]
    slots[7] = -1  # padding is skipped on any thread

    def run() -> tuple[torch.Tensor, ...]:
        caches = torch.zeros(64, 16, 3, 64, dtype=dtype), torch.zeros(64, 16, 3, 64, dtype=dtype)
        fused_cpu.store_kv(kv, kv, *caches, slots)
        out, summed = fused_cpu.rms_norm(x, weight, 1e-6, residual)
        return (out, summed, fused_cpu.silu_and_mul(gate_up), fused_cpu.rotate_(qk.clone(), cos, sin), *caches)

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = run()
        torch.set_num_threads(threads)
        multi = run()
    finally:
        torch.set_num_threads(before)
    for a, b in zip(single, multi, strict=True):
        assert torch.equal(a, b)
    written = torch.zeros(64 * 16, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    assert torch.equal(single[4].view(-1, 3 * 64).any(dim=1), written)  # those slots and no others


@pytest.mark.parametrize("vocab", [49152, 1003, 5])  # 1003 and 5: a last word only partly used
def test_bitmask_sets_the_clear_bits_columns_to_minus_inf_as_its_twin_and_xgrammar_do(vocab: int) -> None:
    import xgrammar

    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=g)
    words = -(-vocab // 32)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (5, words), dtype=torch.int32, generator=g)
    bitmask[1] = -1  # every token allowed: the row is left as it is
    bitmask[2] = 0  # none: all -inf
    bitmask[3, ::2] = -1  # whole words of each kind between mixed ones
    bitmask[3, 1::4] = 0
    rows = [0, 1, 2, 3]  # row 4 is not constrained
    native, twin, upstream = logits.clone(), logits.clone(), logits.clone()
    fused_cpu.apply_bitmask(native, bitmask, rows)
    fused_cpu.apply_bitmask_ref(twin, bitmask, rows)
    xgrammar.apply_token_bitmask_inplace(upstream, bitmask, indices=rows)
    assert torch.equal(native, twin) and torch.equal(native, upstream)
    assert torch.equal(native[1], logits[1]) and torch.equal(native[4], logits[4]) and native[2].isneginf().all()
    kept = ~native[0].isneginf()
    assert 0 < kept.sum() < vocab and torch.equal(native[0][kept], logits[0][kept])


@pytest.mark.parametrize(
    ("logits", "bitmask", "rows", "words"),
    [
        (torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(2, 2, dtype=torch.int32), [0], "CPU float32"),
        (torch.zeros(2, 64), torch.zeros(2, 1, dtype=torch.int32), [0], ">= 2"),
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int64), [0], "int32"),
        (torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32), [2], "rows must lie"),
        (torch.zeros(64, 2).t(), torch.zeros(2, 2, dtype=torch.int32), [0], "contiguous rows"),
    ],
)
def test_bitmask_refuses_what_it_cannot_read(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int],
                                             words: str) -> None:  # fmt: skip
    with pytest.raises(ValueError, match=words):
        fused_cpu.apply_bitmask(logits, bitmask, rows)
