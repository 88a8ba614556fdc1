"""store_kvcache: the Triton scatter against its reference, padding slots and strided inputs."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.kv_store import store_kvcache
from folio.kernels.layout import PAD_SLOT_ID, allocate_kv_cache, gather_sequence_kv, slots_for_positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("kv_heads", "head_dim", "block_size"), [(1, 64, 16), (3, 128, 32)])
def test_triton_matches_reference(
    device: torch.device, dtype: torch.dtype, kv_heads: int, head_dim: int, block_size: int
) -> None:
    num_blocks = 6
    n = 20
    # Fused QKV-style views: each token's K and V rows are strided slices of a wider tensor.
    qkv = torch.randn(n, 4 * kv_heads, head_dim, device=device).to(dtype)
    key, value = qkv[:, kv_heads : 2 * kv_heads], qkv[:, 3 * kv_heads :]
    slots = torch.randperm(num_blocks * block_size, device=device)[:n]
    slots[[0, 7, 19]] = PAD_SLOT_ID
    caches = {}
    for backend in ("reference", "triton"):
        [(k_cache, v_cache)] = allocate_kv_cache(1, num_blocks, block_size, kv_heads, head_dim, dtype, device)
        store_kvcache(key, value, k_cache, v_cache, slots, backend=backend)  # type: ignore[arg-type]
        caches[backend] = (k_cache, v_cache)
    assert torch.equal(caches["triton"][0], caches["reference"][0])
    assert torch.equal(caches["triton"][1], caches["reference"][1])
    k_flat = caches["triton"][0].view(-1, kv_heads, head_dim)
    keep = slots != PAD_SLOT_ID
    assert torch.equal(k_flat[slots[keep]], key[keep])
    assert int((k_flat != 0).any(-1).any(-1).sum()) == int(keep.sum())  # padding wrote nothing


def test_store_then_gather_round_trips_a_sequence(device: torch.device) -> None:
    # The layout helpers and the store agree on where token t of a sequence lives.
    block_size, length = 16, 37
    [(k_cache, v_cache)] = allocate_kv_cache(1, 8, block_size, 2, 64, torch.float32, device)
    table = torch.tensor([5, 0, 3], dtype=torch.int32, device=device)
    key = torch.randn(length, 2, 64, device=device)
    slots = slots_for_positions(table, torch.arange(length, device=device), block_size)
    store_kvcache(key, -key, k_cache, v_cache, slots.int(), backend="triton")
    assert torch.equal(gather_sequence_kv(k_cache, table, length), key)
    assert torch.equal(gather_sequence_kv(v_cache, table, length), -key)
    assert torch.equal(k_cache[5, 3], key[3])     # token 3 is in the first page, block 5


@pytest.mark.parametrize("populate", [True, False])
def test_a_cpu_cache_is_resident_from_the_start(monkeypatch: pytest.MonkeyPatch, populate: bool) -> None:
    # Mapped in at allocation (bench/throughput.py's folio-faulting phase measures the other way: pages
    # faulted in as blocks fill), and zero either way.
    import psutil

    from folio.kernels import layout

    monkeypatch.setattr(layout, "POPULATE_CPU_CACHE", populate)
    mib = 1 << 20
    before = psutil.Process().memory_info().rss
    [(k_cache, v_cache)] = allocate_kv_cache(1, 1024, 16, 4, 128, torch.float32, "cpu")  # 2 x 32 MiB
    grown = psutil.Process().memory_info().rss - before
    if populate:
        assert grown >= 60 * mib
    else:
        assert grown < 16 * mib
    assert not k_cache.any() and not v_cache.any()
