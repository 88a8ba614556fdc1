"""Rotary embedding: the cos/sin cache and in-place neox rotation against transformers' Llama."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from folio.kernels.rotary import apply_rotary_embedding, rope_cos_sin_cache, rope_inv_freq
from tests.kernels.paged import TOL

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _config(head_dim: int, scaling: dict | None, theta: float = 500000.0) -> LlamaConfig:
    rope = {"rope_type": "default", "rope_theta": theta} if scaling is None else {**scaling, "rope_theta": theta}
    return LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                       max_position_embeddings=4096, rope_parameters=rope)


@pytest.mark.parametrize("scaling", [None, LLAMA3, {"type": "linear", "factor": 2.0}],
                         ids=["default", "llama3", "linear"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_inv_freq_is_transformers(scaling: dict | None, head_dim: int) -> None:
    # "type" is the legacy spelling of "rope_type"; transformers' config wants the new one.
    hf_scaling = None if scaling is None else {"rope_type": scaling.get("rope_type", scaling.get("type")), **scaling}
    hf = LlamaRotaryEmbedding(_config(head_dim, hf_scaling))
    assert hf.attention_scaling == 1.0
    assert torch.equal(rope_inv_freq(head_dim, 500000.0, scaling), hf.inv_freq)


@pytest.mark.parametrize("scaling", [None, LLAMA3], ids=["default", "llama3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_matches_transformers_llama(scaling: dict | None, dtype: torch.dtype) -> None:
    head_dim, positions = 64, torch.tensor([0, 1, 63, 64, 65, 200, 2047, 5])
    config = _config(head_dim, scaling)
    q = torch.randn(len(positions), 4, head_dim).to(dtype)
    k = torch.randn(len(positions), 2, head_dim).to(dtype)
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(q, positions[None])
    cache = rope_cos_sin_cache(head_dim, 2048 + 1, 500000.0, scaling, dtype=dtype)
    cos, sin = cache[positions].chunk(2, dim=-1)
    assert torch.equal(torch.cat((cos, cos), -1), hf_cos[0])
    assert torch.equal(torch.cat((sin, sin), -1), hf_sin[0])
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], hf_cos, hf_sin)
    apply_rotary_embedding(positions, q, k, cache)
    # transformers rounds each product to the dtype; the kernels round once, from float32.
    torch.testing.assert_close(q, hf_q[0].transpose(0, 1), **TOL[dtype])
    torch.testing.assert_close(k, hf_k[0].transpose(0, 1), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim", "rotary_dim"),
                         [(4, 1, 64, 64), (9, 3, 128, 128), (8, 8, 128, 64)])
def test_triton_matches_reference_in_place_on_fused_qkv(
    device: torch.device, dtype: torch.dtype, q_heads: int, kv_heads: int, head_dim: int, rotary_dim: int
) -> None:
    cache = rope_cos_sin_cache(rotary_dim, 300, 10000.0, LLAMA3, device=device, dtype=dtype)
    positions = torch.tensor([0, 299, 7, 7, 64, 1], device=device)
    qkv = torch.randn(len(positions), q_heads + 2 * kv_heads, head_dim, device=device).to(dtype)
    results = {}
    for backend in ("reference", "triton"):
        t = qkv.clone()
        q, k = t[:, :q_heads], t[:, q_heads : q_heads + kv_heads]   # strided views, rotated in place
        apply_rotary_embedding(positions, q, k, cache, backend=backend)  # type: ignore[arg-type]
        results[backend] = t
    torch.testing.assert_close(results["triton"], results["reference"], **TOL[dtype])
    values = results["triton"][:, q_heads + kv_heads :]
    assert torch.equal(values, qkv[:, q_heads + kv_heads :])                    # V untouched
    assert torch.equal(results["triton"][0], qkv[0])                            # position 0: identity
    if rotary_dim < head_dim:
        assert torch.equal(results["triton"][..., rotary_dim:], qkv[..., rotary_dim:])


def test_llama3_scaling_covers_all_three_bands() -> None:
    # With original_max_position_embeddings=64, some frequencies are kept, some divided by the
    # factor and some smoothly interpolated, so the equality with transformers above checks each band.
    ratio = rope_inv_freq(64, 500000.0) / rope_inv_freq(64, 500000.0, LLAMA3)
    assert (ratio == 1.0).any() and (ratio == 8.0).any() and ((ratio > 1.0) & (ratio < 8.0)).any()


@pytest.mark.parametrize(("scaling", "message"), [
    ({"rope_type": "yarn", "factor": 4.0}, "unsupported rope_scaling type 'yarn'"),
    ({"rope_type": "llama3", "factor": 8.0}, "llama3 rope_scaling needs"),
])
def test_unsupported_scaling_is_a_clear_error(scaling: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rope_cos_sin_cache(64, 16, 10000.0, scaling)
