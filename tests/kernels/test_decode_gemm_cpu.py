"""The CPU decode-step projection kernel (kernels/csrc/decode_gemm_cpu.c) against its float64 product.

It sums in another order than oneDNN, so neither is bit-exact against the other; both must lie within the
float32 summation bound of the exact product (bfloat16: the exact product rounded once, within one
bfloat16 step). Where the engine takes it (`folio.engine.layers.linear`) and where oneDNN keeps the batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from folio.engine.layers import linear as linear_mod
from folio.engine.layers.linear import add_decode_panels, linear, pack_for_onednn, packs
from folio.kernels import decode_gemm_cpu
from folio.kernels.decode_gemm_cpu import MAX_ROWS, decode_gemm, decode_gemm_ref, pack

pytestmark = pytest.mark.skipif(not decode_gemm_cpu.AVAILABLE, reason="this CPU has no AVX-512F")
DTYPES = [torch.float32, torch.bfloat16]
# bfloat16 on AVX512-BF16's dot products where the CPU has them, and widened to float32 (every CPU)
PATHS = [pytest.param(True, id="dot"), pytest.param(False, id="widened")]


@pytest.fixture(params=PATHS)
def bf16_path(request: pytest.FixtureRequest) -> Iterator[bool]:
    dot = request.param
    if dot and not decode_gemm_cpu.bf16_dot():
        pytest.skip("this CPU has no AVX512-BF16")
    decode_gemm_cpu.bf16_dot(dot)
    try:
        assert decode_gemm_cpu.bf16_dot() == dot
        yield dot
    finally:
        decode_gemm_cpu.bf16_dot(True)


def assert_near_exact(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Within the float32 bound of a K-term sum (2K units of float32 rounding on sum |x||w|), and for
    bfloat16 one more bfloat16 step for the final rounding."""
    exact = x.double() @ w.double().T + (0 if bias is None else bias.double())
    magnitude = x.double().abs() @ w.double().abs().T + (0 if bias is None else bias.double().abs())
    bound = 2 * (x.shape[1] + 1) * 2.0**-24 * magnitude
    if got.dtype == torch.bfloat16:
        bound = bound + exact.abs() * 2.0**-8
    excess = (got.double() - exact).abs() - bound
    assert excess.max().item() <= 0, f"{(excess > 0).sum().item()} of {got.numel()} values outside the bound"


def check_exact_product(dtype: torch.dtype, n: int, k: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    panels = pack(w)
    # One row, two-panel tiles of up to eight; from nine on one-panel tiles of up to 16, later passes short
    # (17, 23, 47) or full (32, 64)
    for m in (1, 2, 3, 4, 5, 8, 9, 13, 16, 17, 23, 32, 47, MAX_ROWS):
        wide = torch.randn(m, k + 5, generator=g).to(dtype)
        x = wide[:, 2 : 2 + k]  # rows further apart than they are long
        got = decode_gemm(x, panels, bias)
        assert got.dtype == dtype and got.shape == (m, n) and got.is_contiguous()
        assert_near_exact(got, x, w, bias)


SHAPES = [(576, 576), (1728, 576), (576, 1536), (37, 100), (16, 7), (33, 1)]  # odd K: the last pair half zero


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_float32_matches_the_exact_product(n: int, k: int, with_bias: bool) -> None:
    check_exact_product(torch.float32, n, k, with_bias)


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_bfloat16_matches_the_exact_product(bf16_path: bool, n: int, k: int, with_bias: bool) -> None:
    check_exact_product(torch.bfloat16, n, k, with_bias)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [6, 20])  # two-panel tiles, one-panel tiles
def test_the_split_over_threads_does_not_change_the_result(dtype: torch.dtype, rows: int) -> None:
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(1000, 576, generator=g).to(dtype), torch.randn(rows, 576, generator=g).to(dtype)
    panels = pack(w)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = decode_gemm(x, panels)
        torch.set_num_threads(3)  # 63 panels: 32 pairs, the last one short, over three threads
        assert torch.equal(decode_gemm(x, panels), one)
    finally:
        torch.set_num_threads(threads)


def test_panels_hold_the_rows_sixteen_at_a_time_with_zero_padding() -> None:
    w = torch.arange(37 * 3, dtype=torch.float32).reshape(37, 3)
    panels = pack(w)
    assert panels.data.shape == (3, 3, 16) and (panels.out_features, panels.in_features) == (37, 3)
    assert torch.equal(panels.data[1, 2], w[16:32, 2])  # panel 1, k = 2: rows 16..31
    assert torch.equal(panels.data[2, :, :5].T, w[32:]) and not panels.data[2, :, 5:].any()


def test_bfloat16_panels_hold_pairs_of_k_for_sixteen_rows() -> None:
    w = torch.arange(20 * 5, dtype=torch.float32).reshape(20, 5).to(torch.bfloat16)
    panels = pack(w)
    assert panels.data.shape == (2, 3, 16, 2) and (panels.out_features, panels.in_features) == (20, 5)
    assert torch.equal(panels.data[0, 1], w[:16, 2:4])  # panel 0, pair 1: k = 2 and 3 of rows 0..15
    assert torch.equal(panels.data[1, 2, :4, 0], w[16:, 4]) and not panels.data[1, 2, :, 1].any()  # K odd
    assert not panels.data[1, :, 4:].any()  # rows past N


def test_bad_inputs_raise_before_running() -> None:
    w = torch.randn(32, 64)
    panels = pack(w)
    with pytest.raises(ValueError, match="must be"):
        decode_gemm(torch.randn(2, 63), panels)  # K differs
    with pytest.raises(ValueError, match="must be"):
        decode_gemm(torch.randn(MAX_ROWS + 1, 64), panels)
    with pytest.raises(ValueError, match="must be"):
        decode_gemm(torch.randn(2, 64).to(torch.bfloat16), panels)
    with pytest.raises(ValueError, match="must be"):
        decode_gemm(torch.randn(64, 2).T, panels)  # columns not contiguous
    with pytest.raises(ValueError, match="bias"):
        decode_gemm(torch.randn(2, 64), panels, torch.randn(31))
    with pytest.raises(ValueError, match="weight must be"):
        pack(torch.randn(4, 4, 4))


@pytest.mark.parametrize("dtype", [d for d in DTYPES if packs(d)])
def test_linear_takes_the_kernel_for_few_rows_and_onednn_for_more(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(7)
    w = torch.randn(96, 64, generator=g).to(dtype)
    packed = pack_for_onednn(w)
    plain = pack_for_onednn(w)
    add_decode_panels(packed, w)
    assert isinstance(packed.decode_panels, decode_gemm_cpu.Panels)
    few = decode_gemm_cpu.FASTER_UP_TO[dtype]
    for m in (1, few):
        x = torch.randn(m, 64, generator=g).to(dtype)
        assert torch.equal(linear(x, packed), decode_gemm(x, packed.decode_panels))
        assert_near_exact(linear(x, plain), x, w, None)  # oneDNN: the same product, in its own order
    x = torch.randn(few + 1, 64, generator=g).to(dtype)
    assert torch.equal(linear(x, packed), linear(x, plain))  # more rows: oneDNN's GEMM


def test_no_panels_when_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(linear_mod, "DECODE_PANELS", False)
    w = torch.randn(32, 64)
    packed = pack_for_onednn(w)
    add_decode_panels(packed, w)
    assert getattr(packed, "decode_panels", None) is None


def test_reference_is_the_float32_product() -> None:
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    torch.testing.assert_close(decode_gemm_ref(x, w, b), x @ w.T + b)
