"""Bad inputs to the kernel wrappers are clear ValueErrors, raised before anything is launched."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from folio.kernels._backend import ensure_launchable
from folio.kernels.decode_attention import paged_decode_attention
from folio.kernels.kv_store import store_kvcache
from folio.kernels.prefill_attention import paged_prefill_attention
from folio.kernels.rms_norm import fused_add_rms_norm, rms_norm
from folio.kernels.rotary import apply_rotary_embedding

D = 64
K = torch.zeros(4, 16, 2, D)
V = torch.zeros(4, 16, 2, D)
TABLES = torch.zeros(2, 4, dtype=torch.int32)
LENS = torch.tensor([3, 5], dtype=torch.int32)
Q = torch.zeros(2, 4, D)
CU = torch.tensor([0, 1, 2], dtype=torch.int32)


def decode(**changes: object) -> Callable[[], object]:
    args = {"q": Q, "k_cache": K, "v_cache": V, "block_tables": TABLES, "context_lens": LENS, "scale": 0.1}
    return lambda: paged_decode_attention(**{**args, **changes})  # type: ignore[arg-type]


def prefill(**changes: object) -> Callable[[], object]:
    args = {"q": Q, "k_cache": K, "v_cache": V, "cu_seqlens_q": CU, "context_lens": LENS,
            "block_tables": TABLES, "scale": 0.1}
    return lambda: paged_prefill_attention(**{**args, **changes})  # type: ignore[arg-type]


def store(**changes: object) -> Callable[[], object]:
    args = {"key": torch.zeros(3, 2, D), "value": torch.zeros(3, 2, D), "k_cache": K.clone(),
            "v_cache": V.clone(), "slot_mapping": torch.tensor([0, -1, 5])}
    return lambda: store_kvcache(**{**args, **changes})  # type: ignore[arg-type]


CASES = {
    "q dtype": (decode(q=Q.half()), "q must be float32"),
    "q rank": (decode(q=Q[0]), "q must be 3-D"),
    "head_dim": (decode(q=torch.zeros(2, 4, 32)), "head_dim 32 does not match the cache's 64"),
    "gqa": (decode(q=torch.zeros(2, 3, D)), r"query heads \(3\) must be a multiple of KV heads \(2\)"),
    "table dtype": (decode(block_tables=TABLES.long()), "block_tables must be int32"),
    "table rows": (decode(block_tables=TABLES[:1]), "block_tables has 1 rows for a batch of 2"),
    "lens": (decode(context_lens=LENS[:1]), "context_lens has 1 entries"),
    "too long": (decode(context_lens=torch.tensor([3, 65], dtype=torch.int32)), r"context_lens must lie in \[0, 64\]"),
    "scale": (decode(scale=0), "scale must be a positive number"),
    "cache shape": (decode(v_cache=V[:2]), "differ in shape"),
    "cache layout": (decode(k_cache=K.transpose(0, 1).contiguous().transpose(0, 1)), "must be contiguous"),
    "cache rank": (decode(k_cache=K[0]), "k_cache must be 4-D"),
    "splits": (decode(num_splits=0), "num_splits must be >= 1"),
    "backend": (decode(backend="cuda"), "backend must be"),
    "cu start": (prefill(cu_seqlens_q=torch.tensor([1, 1, 2], dtype=torch.int32)), "cu_seqlens_q must run from 0"),
    "cu order": (prefill(cu_seqlens_q=torch.tensor([0, 2, 1], dtype=torch.int32)), "cu_seqlens_q must run from 0"),
    "q longer than context": (prefill(q=torch.zeros(6, 4, D), cu_seqlens_q=torch.tensor([0, 4, 6], dtype=torch.int32)),
                              r"sequence 0: needs 4 <= context_lens \(3\)"),
    "cu dtype": (prefill(cu_seqlens_q=CU.long()), "cu_seqlens_q must be int32"),
    "slot range": (store(slot_mapping=torch.tensor([0, 64, 1])), r"slot_mapping values must lie in \[-1, 64\)"),
    "slot count": (store(slot_mapping=torch.tensor([0, 1])), r"slot_mapping must have shape \(3,\)"),
    "key heads": (store(key=torch.zeros(3, 1, D)), r"key must have shape \(3, 2, 64\)"),
    "key dtype": (store(key=torch.zeros(3, 2, D, dtype=torch.float16)), "key must be float32"),
    "key stride": (store(key=torch.zeros(3, 2, 2 * D)[..., ::2]), "contiguous in its last dimension"),
    "norm width": (lambda: rms_norm(torch.zeros(2, 8), torch.zeros(4), 1e-6), r"last dimension \(8\) must equal"),
    "norm dtype": (lambda: rms_norm(torch.zeros(2, 8).half(), torch.zeros(8), 1e-6), "x must be float32"),
    "norm eps": (lambda: rms_norm(torch.zeros(2, 8), torch.zeros(8), -1.0), "eps must be a non-negative"),
    "residual": (lambda: fused_add_rms_norm(torch.zeros(2, 8), torch.zeros(3, 8), torch.zeros(8), 1e-6),
                 r"residual \(3, 8\) must match x \(2, 8\)"),
    "rope positions": (lambda: apply_rotary_embedding(torch.tensor([0, 9]), torch.zeros(2, 2, 8), torch.zeros(2, 1, 8),
                                                      torch.zeros(9, 8)), r"positions must lie in \[0, 9\)"),
    "rope width": (lambda: apply_rotary_embedding(torch.tensor([0]), torch.zeros(1, 2, 8), torch.zeros(1, 1, 8),
                                                  torch.zeros(9, 10)), "must be even and at most head_dim"),
    "rope tokens": (lambda: apply_rotary_embedding(torch.tensor([0]), torch.zeros(2, 2, 8), torch.zeros(2, 1, 8),
                                                   torch.zeros(9, 8)), "one row per token"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_is_a_clear_value_error(case: tuple[Callable[[], object], str]) -> None:
    call, message = case
    with pytest.raises(ValueError, match=message):
        call()


def test_compiled_kernel_on_cpu_tensors_says_how_to_interpret() -> None:
    with pytest.raises(ValueError, match="set TRITON_INTERPRET=1"):
        ensure_launchable(object(), torch.device("cpu"))


def test_empty_batches_return_empty_outputs() -> None:
    assert paged_decode_attention(Q[:0], K, V, TABLES[:0], LENS[:0], 0.1).shape == (0, 4, D)
    out = paged_prefill_attention(Q[:0], K, V, torch.zeros(1, dtype=torch.int32), LENS[:0], TABLES[:0], 0.1)
    assert out.shape == (0, 4, D)
    store_kvcache(torch.zeros(0, 2, D), torch.zeros(0, 2, D), K.clone(), V.clone(), torch.zeros(0, dtype=torch.int64))
