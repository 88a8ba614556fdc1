"""The CPU's native multi-LoRA kernel against the per-token definition: mixes of adapters and base tokens,
fused projections' rank blocks, tails past the last vector, bfloat16, one and two threads, both vector
widths; a recorded call replayed for another mix; and the wrapper's checks."""

from __future__ import annotations

import pytest
import torch

from folio.kernels import lora_cpu
from folio.kernels.recording import recording
from tests.kernels.conftest import each_simd_width
from tests.kernels.test_lora import naive

pytestmark = pytest.mark.skipif(not lora_cpu.AVAILABLE, reason="the native LoRA kernel is not built or this CPU lacks AVX2")
simd_width = each_simd_width(lora_cpu._cpu_lora)  # AVX-512 and AVX2, where the CPU has them


def stacks(slots: int, rank: int, in_f: int, out_f: int, blocks: lora_cpu.Blocks, dtype: torch.dtype,
           seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``a`` and rank-major ``b`` whose rank block j is zero outside its rows (as the loader packs
    fused projections), so the kernel's skipping of the other rows must change nothing."""
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(slots, rank, in_f, generator=gen) / in_f ** 0.5).to(dtype)
    b = lora_cpu.zeros_rank_major(slots, out_f, rank, dtype)
    per = rank // len(blocks)
    for j, (lo, hi) in enumerate(blocks):
        b[:, lo:hi, j * per:(j + 1) * per] = (torch.randn(slots, hi - lo, per, generator=gen) / per ** 0.5).to(dtype)
    return a, b


def check(got: torch.Tensor, want: torch.Tensor) -> None:
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # bfloat16: the float32 delta rounded once; summation order may move a result by one unit
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "in_f", "out_f", "blocks", "rank"), [
    (16, 576, 960, ((0, 576), (576, 768), (768, 960)), 48),  # SmolLM2's qkv, rank 16 a block, 2 tokens an adapter
    (7, 576, 3072, ((0, 1536), (1536, 3072)), 32),  # gate_up
    (7, 576, 3072, ((0, 3072), (1536, 3072)), 32),  # a fused module's block 0 over every row (Phi-3's gate_up_proj)
    (64, 1536, 576, ((0, 576),), 16),  # down, the most tokens a step gives the kernel
    (5, 70, 50, ((0, 30), (30, 50)), 64),  # a k tail and block rows that are no multiple of a vector
    (1, 40, 9, ((0, 9),), 8),  # fewer columns than a vector
    (3, 64, 96, ((10, 40), (0, 0)), 16),  # a block over a middle run of rows, an empty one
])
def test_matches_the_definition(tokens: int, in_f: int, out_f: int, blocks: lora_cpu.Blocks, rank: int,
                                dtype: torch.dtype, threads: int) -> None:
    num_slots = 9
    a, b = stacks(num_slots, rank, in_f, out_f, blocks, dtype)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, in_f, generator=gen).to(dtype)
    out = torch.randn(tokens, out_f, generator=gen).to(dtype)
    slots = torch.randint(-1, num_slots, (tokens,), generator=gen, dtype=torch.int32)
    slots[0] = -1  # a base-model token whatever the draw
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = lora_cpu.add_lora_cpu(out.clone(), x, a, b, slots, blocks)
    finally:
        torch.set_num_threads(before)
    check(got, naive(out, x, a, b, slots))
    assert torch.equal(got[0], out[0])


@pytest.mark.parametrize("mix", ["one adapter", "all base", "every slot"])
def test_group_shapes(mix: str) -> None:
    # one adapter for all 16 tokens splits the columns over the threads; no adapter token adds nothing
    a, b = stacks(4, 16, 64, 96, ((0, 96),), torch.float32)
    x, out = torch.randn(16, 64), torch.randn(16, 96)
    slots = {"one adapter": torch.full((16,), 2), "all base": torch.full((16,), -1),
             "every slot": torch.arange(16) % 4}[mix].to(torch.int32)
    check(lora_cpu.add_lora_cpu(out.clone(), x, a, b, slots), naive(out, x, a, b, slots))


def test_strided_rows_and_bad_slot_values() -> None:
    # x and out as row views of wider tensors; slots outside [-1, S) add nothing and read nothing outside
    a, b = stacks(3, 8, 32, 48, ((0, 48),), torch.float32)
    wide_x, wide_out = torch.randn(6, 50), torch.randn(6, 70)
    x, out = wide_x[:, 5:37], wide_out[:, 10:58]
    slots = torch.tensor([0, 3, -7, 2, 1, 99], dtype=torch.int32)
    want = naive(out, x, a, b, torch.where((slots >= 0) & (slots < 3), slots, -1))
    before = wide_out.clone()
    lora_cpu.add_lora_cpu(out, x, a, b, slots)
    check(out, want)
    assert torch.equal(wide_out[:, :10], before[:, :10]) and torch.equal(wide_out[:, 58:], before[:, 58:])


def test_a_recorded_call_replays_for_another_mix() -> None:
    # as a CPU step graph replays it: the same pointers, the slots' new contents grouped anew
    a, b = stacks(5, 16, 64, 64, ((0, 32), (32, 64)), torch.float32)
    x, out = torch.randn(8, 64), torch.randn(8, 64)
    slots = torch.tensor([0, 1, 2, 3, 4, -1, 0, 1], dtype=torch.int32)
    start = out.clone()
    calls: list = []
    with recording(calls):
        lora_cpu.add_lora_cpu(out, x, a, b, slots, ((0, 32), (32, 64)))
    assert len(calls) == 1
    check(out, naive(start, x, a, b, slots))
    slots.copy_(torch.tensor([4, 4, -1, -1, 2, 2, 2, 0], dtype=torch.int32))
    out.copy_(start)
    fn, args = calls[0]
    fn(*args)
    check(out, naive(start, x, a, b, slots))


def test_bad_inputs() -> None:
    a, b = stacks(2, 8, 16, 24, ((0, 24),), torch.float32)
    x, out, slots = torch.randn(3, 16), torch.randn(3, 24), torch.zeros(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="b rank-major"):
        lora_cpu.add_lora_cpu(out, x, a, b.contiguous(), slots)
    with pytest.raises(ValueError, match="slots must be contiguous int32"):
        lora_cpu.add_lora_cpu(out, x, a, b, slots.long())
    with pytest.raises(ValueError, match=r"row ranges within \[0, 24\)"):
        lora_cpu.add_lora_cpu(out, x, a, b, slots, ((0, 10), (12, 30)))
    with pytest.raises(ValueError, match="dividing rank 8"):
        lora_cpu.add_lora_cpu(out, x, a, b, slots, ((0, 8), (8, 16), (16, 24)))
    with pytest.raises(ValueError, match="do not fit"):
        lora_cpu.add_lora_cpu(torch.randn(3, 20), x, a, b, slots)
    with pytest.raises(ValueError, match="unit last strides"):
        lora_cpu.add_lora_cpu(out, torch.randn(16, 3).T, a, b, slots)
