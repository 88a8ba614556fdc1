"""Batched multi-LoRA: the reference vs a per-token loop, Triton vs the reference, and the wrapper's checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from folio.kernels import lora_reference
from folio.kernels.lora import LoRAGroups, add_lora, lora_groups
from tests.kernels.paged import TOL


def naive(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The definition, one token at a time in float64 (then rounded once to out's dtype)."""
    expected = out.clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            delta = b[s].double() @ (a[s].double() @ x[t].double())
            expected[t] = (out[t].double() + delta).to(out.dtype)
    return expected


def make(
    tokens: int, in_f: int, out_f: int, num_slots: int, rank: int, dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu", *, true_rank: int | None = None, seed: int = 0,
) -> tuple[torch.Tensor, ...]:
    """Random inputs; ranks above ``true_rank`` are zero-padded as the adapter loader pads them."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, in_f, generator=gen)
    out = torch.randn(tokens, out_f, generator=gen)
    a = torch.randn(num_slots, rank, in_f, generator=gen) / in_f ** 0.5
    b = torch.randn(num_slots, out_f, rank, generator=gen) / rank ** 0.5
    if true_rank is not None:
        a[:, true_rank:] = 0
        b[:, :, true_rank:] = 0
    return tuple(t.to(dtype).to(device) for t in (out, x, a, b))


def slot_mix(name: str, tokens: int, num_slots: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(tokens)
    if name == "base":
        s = torch.full((tokens,), -1)
    elif name == "one":
        s = torch.full((tokens,), num_slots - 1)
    elif name == "interleaved":  # decode: each token its own sequence, four adapters and the base
        s = torch.arange(tokens) % 5 - 1
    elif name == "runs":  # prefill: contiguous runs per sequence
        s = torch.tensor([-1, 2, 0, 3, 1])[torch.arange(tokens) * 5 // tokens]
    else:  # random, with a slot repeated in separate runs
        s = torch.randint(-1, num_slots, (tokens,), generator=gen)
    return s.to(torch.int32)


MIXES = ["base", "one", "interleaved", "runs", "random"]


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("tokens", [1, 7, 40, 300])
def test_reference_matches_naive(mix: str, tokens: int) -> None:
    torch.manual_seed(0)
    out, x, a, b = make(tokens, 48, 80, 4, 8)
    slots = slot_mix(mix, tokens, 4)
    expected = naive(out, x, a, b, slots)
    result = lora_reference.add_lora_ref(out, x, a, b, slots)
    assert result is out
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    base = slots < 0
    assert torch.equal(out[base], expected[base])  # base-model rows exactly untouched


@pytest.mark.parametrize("plan", ["batched", "groups", "dense"])
@pytest.mark.parametrize("tokens", [1, 33])
def test_both_plans_match_naive(plan: lora_reference.Plan, tokens: int) -> None:
    """Each of the reference's plans, forced, on every mix (``auto`` picks by the step's shape)."""
    for mix in MIXES:
        out, x, a, b = make(tokens, 40, 24, 4, 16, true_rank=5)
        slots = slot_mix(mix, tokens, 4)
        expected = naive(out, x, a, b, slots)
        assert lora_reference.add_lora_ref(out, x, a, b, slots, plan=plan) is out
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(out[slots < 0], expected[slots < 0])


def test_auto_plan_choice() -> None:
    """Decode steps with several adapters take the batched plan; one adapter, or a prefill of uneven
    sequences, the per-group one (the bench's measurements on one core)."""
    decode = [(torch.arange(16) % n, out_f, "batched") for n in (4, 8) for out_f in (576, 1536)]
    cases = [*decode, (torch.zeros(16), 576, "groups"), (torch.zeros(512), 1536, "groups"),
             (torch.tensor([0] * 500 + [1] * 4 + [2] * 4 + [3] * 4), 576, "groups")]
    for slots, out_f, want in cases:
        groups = lora_groups(slots.to(torch.int32))
        assert lora_reference.choose_plan(groups, 16, 576, out_f) == want, (slots, out_f)


@pytest.mark.parametrize("plan", ["batched", "groups", "dense"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_half_dtypes(dtype: torch.dtype, plan: lora_reference.Plan) -> None:
    """One rounding per element, also where the batched plan's padding rows alias token 0."""
    for mix in ("interleaved", "random", "one"):
        out, x, a, b = make(20, 64, 96, 3, 8, dtype)
        slots = (slot_mix(mix, 20, 3) + 1).clamp(max=2) if mix == "random" else slot_mix(mix, 20, 3).clamp(max=2)
        expected = naive(out, x, a, b, slots)
        lora_reference.add_lora_ref(out, x, a, b, slots, plan=plan)
        torch.testing.assert_close(out, expected, **TOL[dtype])
        assert torch.equal(out[slots < 0], expected[slots < 0])


def test_rank_padding_and_fused_ranks() -> None:
    """A rank-4 adapter padded to 16 equals the unpadded one; a fused projection concatenates slices' ranks."""
    out, x, a, b = make(12, 32, 40, 2, 16, true_rank=4)
    slots = slot_mix("interleaved", 12, 2).clamp(max=1)
    small = out.clone()
    add_lora(small, x, a[:, :4].contiguous(), b[:, :, :4].contiguous(), slots)
    add_lora(out, x, a, b, slots)
    torch.testing.assert_close(out, small, atol=1e-6, rtol=1e-6)
    # q and v slices of rank 8 each (R = 2 * 8): the fused add equals the two slices' adds, each to its rows of out.
    out, x, a, b = make(12, 32, 40, 2, 16, seed=1)
    b[:, 20:, :8] = 0  # q's ranks write only q's rows
    b[:, :20, 8:] = 0  # v's ranks only v's
    fused = add_lora(out.clone(), x, a, b, slots)
    q = add_lora(out[:, :20].clone(), x, a[:, :8].contiguous(), b[:, :20, :8].contiguous(), slots)
    v = add_lora(out[:, 20:].clone(), x, a[:, 8:].contiguous(), b[:, 20:, 8:].contiguous(), slots)
    torch.testing.assert_close(fused, torch.cat([q, v], 1), atol=1e-6, rtol=1e-6)


def test_groups_are_shared_and_checked() -> None:
    slots = torch.tensor([2, 2, -1, 0, 0, 0, 2, 1], dtype=torch.int32)
    groups = lora_groups(slots)
    assert groups.groups is not None
    as_lists = {s: (r if isinstance(r, slice) else r.tolist()) for s, r in groups.groups}
    assert as_lists == {0: slice(3, 6), 1: slice(7, 8), 2: [0, 1, 6]}
    assert lora_groups(torch.full((5,), -1, dtype=torch.int32)).groups == ()
    out, x, a, b = make(8, 16, 24, 3, 4)
    expected = naive(out, x, a, b, slots)
    for _ in range(3):  # layers: the same groups, a fresh out each
        result = add_lora(out.clone(), x, a, b, slots, groups=groups)
        torch.testing.assert_close(result, expected, atol=1e-5, rtol=1e-5)
    # Groups as lora_groups makes them for CUDA slots (ungrouped): the reference groups them itself.
    ungrouped = LoRAGroups(slots, None)
    torch.testing.assert_close(add_lora(out.clone(), x, a, b, slots, groups=ungrouped), expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="groups were built for 8 tokens, this call has 7"):
        add_lora(out[:7], x[:7], a, b, slots[:7], groups=groups)


# --- Triton (on CUDA, or in the interpreter on the CPU) ---


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize(("tokens", "in_f", "out_f", "rank"), [(5, 64, 48, 8), (19, 96, 160, 16), (3, 40, 24, 12)])
def test_triton_matches_reference(device: torch.device, mix: str, tokens: int, in_f: int, out_f: int, rank: int) -> None:
    out, x, a, b = make(tokens, in_f, out_f, 4, rank, device=device, true_rank=rank - 3)
    slots = slot_mix(mix, tokens, 4).to(device)
    expected = add_lora(out.clone(), x, a, b, slots, backend="reference")
    before = out.clone()
    result = add_lora(out, x, a, b, slots, backend="triton")
    assert result is out
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    base = slots < 0
    assert torch.equal(out[base], before[base])


@pytest.mark.parametrize(("in_f", "out_f"), [(576, 1536), (960, 576)])
def test_triton_model_widths(device: torch.device, in_f: int, out_f: int) -> None:
    """Non-power-of-two widths (SmolLM2's 576 / 1536, 960) with a rank that spans several rank blocks."""
    out, x, a, b = make(3, in_f, out_f, 3, 80, device=device)
    slots = torch.tensor([1, -1, 2], dtype=torch.int64, device=device)
    expected = add_lora(out.clone(), x, a, b, slots, backend="reference")
    add_lora(out, x, a, b, slots, backend="triton")
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_half_dtypes(device: torch.device, dtype: torch.dtype) -> None:
    out, x, a, b = make(6, 48, 72, 3, 8, dtype, device)
    slots = torch.tensor([0, 2, -1, 1, 0, 2], dtype=torch.int32, device=device)
    expected = add_lora(out.clone(), x, a, b, slots, backend="reference")
    add_lora(out, x, a, b, slots, backend="triton")
    torch.testing.assert_close(out, expected, **TOL[dtype])


def test_triton_strided_rows(device: torch.device) -> None:
    """Rows may be strided (out a column block of a fused q/k/v output, x a slice of a wider buffer)."""
    out, x, a, b = make(5, 32, 48, 2, 4, device=device)
    wide_out = torch.zeros(5, 100, device=device)
    wide_out[:, 10:58] = out
    wide_x = torch.zeros(5, 64, device=device)
    wide_x[:, :32] = x
    slots = torch.tensor([1, 0, -1, 1, 0], dtype=torch.int32, device=device)
    expected = add_lora(out.clone(), x, a, b, slots, backend="reference")
    add_lora(wide_out[:, 10:58], wide_x[:, :32], a, b, slots, backend="triton")
    torch.testing.assert_close(wide_out[:, 10:58], expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(wide_out[:, :10], torch.zeros(5, 10, device=device))
    assert torch.equal(wide_out[:, 58:], torch.zeros(5, 42, device=device))


@pytest.mark.parametrize("backend", ["triton", "reference", "static"])
def test_slots_contents_change_in_place(device: torch.device, backend: str) -> None:
    """One slots tensor, rewritten between steps (as a captured CUDA graph's or a recorded CPU step graph's
    input is): each step is right. ``static``: the reference with groups made once, before any contents."""
    out, x, a, b = make(6, 32, 24, 4, 8, device=device)
    slots = torch.full((6,), -1, dtype=torch.int32, device=device)
    static = lora_groups(slots, static=True)
    for mix in ("interleaved", "base", "one", "runs", "random", "interleaved"):
        slots.copy_(slot_mix(mix, 6, 4))
        if backend == "static":
            result = add_lora(out.clone(), x, a, b, slots, groups=static, backend="reference")
        else:
            result = add_lora(out.clone(), x, a, b, slots, backend=backend)  # type: ignore[arg-type]
        torch.testing.assert_close(result, naive(out.cpu(), x.cpu(), a.cpu(), b.cpu(), slots.cpu()).to(device),
                                   atol=1e-5, rtol=1e-5)


# --- the wrapper's checks ---

OUT, X, A, B = make(4, 16, 24, 2, 4)
SLOTS = torch.tensor([0, -1, 1, 0], dtype=torch.int32)


def call(**changes: object) -> Callable[[], object]:
    args = {"out": OUT.clone(), "x": X, "a": A, "b": B, "slots": SLOTS}
    return lambda: add_lora(**{**args, **changes})  # type: ignore[arg-type]


CASES = {
    "x dtype": (call(x=X.double()), "x must be float32 or float16 or bfloat16"),
    "x rank": (call(x=X[0]), "x must be 2-D"),
    "out dtype": (call(out=OUT.half()), "out must be float32"),
    "a dtype": (call(a=A.half()), "a must be float32"),
    "b rank": (call(b=B[0]), "b must be 3-D"),
    "out rows": (call(out=OUT[:3]), "out has 3 rows for x's 4 tokens"),
    "slots length": (call(slots=SLOTS[:3]), "slots has 3 entries for x's 4 tokens"),
    "slots dtype": (call(slots=SLOTS.float()), "slots must be int32 or int64"),
    "in features": (call(a=torch.zeros(2, 4, 8)), r"a's last dimension \(8\) must equal x's in_features \(16\)"),
    "b shape": (call(b=torch.zeros(2, 24, 5)), r"b must have shape \(slots, out_features, rank\) = \(2, 24, 4\)"),
    "b slots": (call(b=torch.zeros(3, 24, 4)), r"b must have shape"),
    "x strides": (call(x=X.T.contiguous().T), "x must be contiguous in its last dimension"),
    "a strides": (call(a=A.transpose(1, 2).contiguous().transpose(1, 2)), "a must be contiguous in its last dimension"),
    # rank-major (the CPU stacks' layout) is taken; every other b needs a unit last stride
    "b strides": (call(b=B.transpose(1, 2).repeat(1, 1, 2).transpose(1, 2)[:, ::2]),
                  "b must be contiguous in its last dimension"),
    "slots strided": (call(slots=torch.zeros(8, dtype=torch.int32)[::2]), "slots must be contiguous"),
    "groups type": (call(groups=SLOTS), "groups must come from lora_groups"),
    "backend": (call(backend="cuda"), "backend must be"),
    "device": (call(slots=SLOTS.to("meta")), "slots is on meta but the other tensors are on cpu"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_inputs(case: str) -> None:
    fn, message = CASES[case]
    with pytest.raises(ValueError, match=message):
        fn()


def test_empty_inputs_are_no_ops() -> None:
    out = torch.zeros(0, 24)
    assert add_lora(out, torch.zeros(0, 16), A, B, torch.zeros(0, dtype=torch.int32)) is out
    assert add_lora(OUT.clone(), X, A[:0], B[:0], SLOTS.clamp(max=-1)).equal(OUT)
    assert isinstance(lora_groups(SLOTS), LoRAGroups)


# --- on a real GPU (marker gpu: skipped without one) ---


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("tokens", "in_f", "out_f", "rank"), [(16, 576, 1536, 16), (512, 1536, 576, 64), (300, 960, 2880, 48)])
def test_triton_at_model_sizes_on_gpu(dtype: torch.dtype, tokens: int, in_f: int, out_f: int, rank: int) -> None:
    cuda = torch.device("cuda")
    out, x, a, b = make(tokens, in_f, out_f, 8, rank, dtype, cuda, true_rank=rank // 2)
    slots = slot_mix("random", tokens, 8).to(cuda)
    expected = add_lora(out.clone(), x, a, b, slots, backend="reference")
    before = out.clone()
    add_lora(out, x, a, b, slots)  # auto → Triton
    torch.testing.assert_close(out, expected, **TOL[dtype])
    assert torch.equal(out[slots < 0], before[slots < 0])


@pytest.mark.gpu
def test_triton_replays_in_a_cuda_graph() -> None:
    """Captured with one mix of adapters, replayed with others written into the same slots tensor."""
    cuda = torch.device("cuda")
    out, x, a, b = make(16, 576, 576, 4, 16, torch.bfloat16, cuda)
    slots = slot_mix("one", 16, 4).to(cuda)
    work = out.clone()
    add_lora(work, x, a, b, slots)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work.copy_(out)
        add_lora(work, x, a, b, slots)
    for mix in ("interleaved", "base", "random", "runs"):
        slots.copy_(slot_mix(mix, 16, 4))
        graph.replay()
        torch.testing.assert_close(work, add_lora(out.clone(), x, a, b, slots, backend="reference"), **TOL[torch.bfloat16])
