"""RMSNorm and fused residual-add + RMSNorm: Triton vs reference, and the reference vs transformers."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from folio.kernels.rms_norm import fused_add_rms_norm, rms_norm
from tests.kernels.paged import TOL

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(rows: int, hidden: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(hidden)
    x, residual = (torch.randn(rows, hidden, generator=gen).to(dtype).to(device) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype).to(device)
    return x, residual, weight


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 576, 1000])
def test_triton_matches_reference(device: torch.device, dtype: torch.dtype, hidden: int) -> None:
    x, residual, weight = _inputs(7, hidden, dtype, device)
    torch.testing.assert_close(rms_norm(x, weight, 1e-5, backend="triton"),
                               rms_norm(x, weight, 1e-5, backend="reference"), **TOL[dtype])
    out, res_out = fused_add_rms_norm(x, residual, weight, 1e-5, backend="triton")
    ref_out, ref_res = fused_add_rms_norm(x, residual, weight, 1e-5, backend="reference")
    torch.testing.assert_close(out, ref_out, **TOL[dtype])
    if dtype == torch.bfloat16 and device.type != "cuda":
        # The interpreter truncates float32 → bfloat16 where the GPU rounds to nearest.
        torch.testing.assert_close(res_out, ref_res, **TOL[dtype])
    else:
        assert torch.equal(res_out, ref_res)
    assert torch.equal(x, _inputs(7, hidden, dtype, device)[0])  # inputs are left alone


def test_leading_dimensions_and_strided_rows(device: torch.device) -> None:
    x = torch.randn(2, 3, 128, device=device)
    wide = torch.randn(6, 256, device=device)
    weight = torch.randn(128, device=device)
    torch.testing.assert_close(rms_norm(x, weight, 1e-6, backend="triton"), rms_norm(x, weight, 1e-6))
    rows = wide[:, :128]  # a row stride of 256
    torch.testing.assert_close(rms_norm(rows, weight, 1e-6, backend="triton"), rms_norm(rows, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_matches_transformers(dtype: torch.dtype) -> None:
    x, residual, weight = _inputs(5, 96, dtype, torch.device("cpu"))
    hf = LlamaRMSNorm(96, eps=1e-6).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(weight)
        assert torch.equal(rms_norm(x, weight, 1e-6), hf(x))
        out, res = fused_add_rms_norm(x, residual, weight, 1e-6)
        assert torch.equal(res, x + residual)
        assert torch.equal(out, hf(x + residual))
