"""The native CPU twins of the decoder layer's elementwise PyTorch code (``kernels/csrc/fused_cpu.c``), greedy
sampling's argmax, and the greedy LM head's scan of its screen (``columns_reaching``).

Each op does in one pass over memory what the engine's PyTorch path does in several ops, rounding where it
rounds: bit-identical for the rotary embedding, the residual add and the KV scatter; the norm's statistic
and SiLU's exponential may differ in the last float32 bit (see the C file). Their PyTorch twins, which the
tests compare them with: ``rms_norm_ref``/``fused_add_rms_norm_ref`` (``folio.kernels.rms_norm``),
``F.silu(gate) * up``, ``x.max(dim=-1).indices``, ``(x + rel * x.abs() + slope[:, None] * col >= floor[:, None]).nonzero()``, the engine's ``rotate`` (``folio.engine.layers.rotary``) and ``store_kvcache_ref``
(``folio.kernels.kv_store``). Built by ``pip install`` as an optional C extension: ``AVAILABLE`` says whether
this install has it, ``VECTOR_DTYPES`` which dtypes this CPU runs the vector ops in; elsewhere the engine
runs its PyTorch code. CPU tensors, each row's last dimension contiguous. Ops with enough rows split them
over torch's threads (``torch.get_num_threads()``); the results do not depend on the split.
"""

from __future__ import annotations

import torch

from folio.kernels._checks import require
from folio.kernels.native import load_native

_cpu_fused = load_native("_cpu_fused")  # None without a C compiler: callers use the PyTorch path

AVAILABLE = _cpu_fused is not None
DTYPES = {torch.float32: 0, torch.bfloat16: 1}
# the dtypes this CPU runs the vector ops in: both with AVX2; with AVX-512F, bfloat16 only with AVX512-BF16 too
_RUNS = _cpu_fused.dtypes() if _cpu_fused is not None else (False, False)
VECTOR_DTYPES = frozenset(d for d, runs in zip(DTYPES, _RUNS, strict=True) if runs)


def supports(x: torch.Tensor) -> bool:
    """Whether the norm, SiLU and rotary ops run ``x`` here (``store_kv`` runs any CPU tensor when built)."""
    return AVAILABLE and x.dtype in VECTOR_DTYPES and x.device.type == "cpu"


def _rows(name: str, x: torch.Tensor, width: int) -> None:
    require(supports(x), lambda: f"{name}: the native CPU ops run {sorted(map(str, VECTOR_DTYPES))} CPU tensors "
                                 f"here, got {x.dtype} on {x.device}")
    require(x.dim() == 2 and x.shape[1] == width and x.stride(1) == 1,
            lambda: f"{name} must be [rows, {width}] with contiguous rows, got {tuple(x.shape)} strides {x.stride()}")


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Llama's RMSNorm of ``x[N, H]``; with ``residual`` ``(norm(x + residual), x + residual)``."""
    assert _cpu_fused is not None, "folio.kernels._cpu_fused was not built"
    hidden = weight.shape[0]
    _rows("x", x, hidden)
    require(weight.dtype == x.dtype and weight.is_contiguous(), "weight must be contiguous, in x's dtype")
    out = torch.empty((x.shape[0], hidden), dtype=x.dtype)
    summed, residual_ptr, residual_stride = out, 0, 0
    if residual is not None:
        _rows("residual", residual, hidden)
        require(residual.dtype == x.dtype and residual.shape == x.shape, "residual must match x")
        summed = torch.empty_like(out)
        residual_ptr, residual_stride = residual.data_ptr(), residual.stride(0)
    _cpu_fused.rms_norm(x.data_ptr(), residual_ptr, weight.data_ptr(), out.data_ptr(), summed.data_ptr(),
                        x.shape[0], hidden, x.stride(0), residual_stride, float(eps), DTYPES[x.dtype],
                        torch.get_num_threads())
    return out if residual is None else (out, summed)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up[N, 2I]`` (gate first) → ``[N, I]``."""
    assert _cpu_fused is not None, "folio.kernels._cpu_fused was not built"
    require(gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0, "gate_up must be [rows, 2 * intermediate]")
    _rows("gate_up", gate_up, gate_up.shape[1])
    width = gate_up.shape[1] // 2
    out = torch.empty((gate_up.shape[0], width), dtype=gate_up.dtype)
    _cpu_fused.silu_and_mul(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), gate_up.shape[0], width,
                            DTYPES[gate_up.dtype], torch.get_num_threads())
    return out


def argmax(x: torch.Tensor) -> torch.Tensor:
    """The index of each row's first maximum in ``x[N, V]`` (int64 ``[N]``), as ``x.max(dim=-1).indices``:
    a NaN counts as the maximum. Reads bfloat16 as it is, without a float32 copy."""
    assert _cpu_fused is not None, "folio.kernels._cpu_fused was not built"
    require(x.dim() == 2 and x.shape[1] > 0, lambda: f"x must be [rows, V] with V >= 1, got {tuple(x.shape)}")
    _rows("x", x, x.shape[1])
    out = torch.empty(x.shape[0], dtype=torch.int64)
    _cpu_fused.argmax_rows(x.data_ptr(), x.stride(0), out.data_ptr(), x.shape[0], x.shape[1], DTYPES[x.dtype])
    return out


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Structured output's token bitmask on float32 ``logits[N, V]``, in place: in each of ``rows``, every
    column whose bit is clear in ``bitmask[N, ceil(V / 32)]`` (int32 words, bit ``j % 32`` of word ``j // 32``,
    xgrammar's layout) becomes -inf. Its PyTorch twin: `apply_bitmask_ref`."""
    assert _cpu_fused is not None, "folio.kernels._cpu_fused was not built"
    require(logits.dim() == 2 and logits.dtype == torch.float32 and logits.device.type == "cpu"
            and logits.stride(1) == 1, lambda: f"logits must be a CPU float32 [rows, V] with contiguous rows, got "
            f"{logits.dtype} {tuple(logits.shape)} strides {logits.stride()}")  # fmt: skip
    words = -(-logits.shape[1] // 32)
    require(bitmask.dtype == torch.int32 and bitmask.device.type == "cpu" and bitmask.dim() == 2
            and bitmask.shape[0] == logits.shape[0] and bitmask.shape[1] >= words and bitmask.stride(1) == 1,
            lambda: f"bitmask must be a CPU int32 [{logits.shape[0]}, >= {words}] with contiguous rows, got "
            f"{bitmask.dtype} {tuple(bitmask.shape)}")  # fmt: skip
    require(all(0 <= r < logits.shape[0] for r in rows), lambda: f"rows must lie in [0, {logits.shape[0]}), got {rows}")
    index = torch.tensor(rows, dtype=torch.int64)
    _cpu_fused.bitmask_rows(logits.data_ptr(), logits.stride(0), bitmask.data_ptr(), bitmask.stride(0),
                            index.data_ptr(), len(rows), logits.shape[1])  # fmt: skip


def apply_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """`apply_bitmask` in PyTorch: each word's 32 bits unpacked, the clear ones' columns set to -inf."""
    vocab = logits.shape[1]
    bits = torch.ones(32, dtype=torch.int64).bitwise_left_shift(torch.arange(32)).to(torch.int32)
    for r in rows:
        allowed = (bitmask[r].unsqueeze(-1) & bits).ne(0).reshape(-1)[:vocab]
        logits[r].masked_fill_(~allowed, float("-inf"))


def columns_reaching(
    x: torch.Tensor, floor: torch.Tensor, slope: torch.Tensor, col: torch.Tensor, rel: float, cap: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns ``j`` of each row ``r`` of ``x[N, V]`` with ``x + rel * |x| + slope[r] * col[j] >= floor[r]``
    (NaN never has), in increasing order: ``(idx, counts)``, ``idx`` int64 ``[N, cap]`` holding each row's first
    ``min(count, cap)`` and ``counts`` int64 ``[N]`` every row's whole count. ``floor``, ``slope`` float32
    ``[N]``, ``col`` float32 ``[V]``; arithmetic in float32."""
    assert _cpu_fused is not None, "folio.kernels._cpu_fused was not built"
    require(x.dim() == 2, lambda: f"x must be [rows, V], got {tuple(x.shape)}")
    _rows("x", x, x.shape[1])
    for name, t, n in (("floor", floor, x.shape[0]), ("slope", slope, x.shape[0]), ("col", col, x.shape[1])):
        require(t.dtype == torch.float32 and t.shape == (n,) and t.is_contiguous(),
                lambda name=name, t=t, n=n: f"{name} must be float32 [{n}], got {t.dtype} {tuple(t.shape)}")
    require(cap >= 1, "cap must be at least 1")
    idx = torch.empty((x.shape[0], cap), dtype=torch.int64)
    counts = torch.empty(x.shape[0], dtype=torch.int64)
    _cpu_fused.reaching_rows(x.data_ptr(), x.stride(0), floor.data_ptr(), slope.data_ptr(), col.data_ptr(),
                             float(rel), x.shape[0], x.shape[1], idx.data_ptr(), cap, counts.data_ptr(),
                             DTYPES[x.dtype])
    return idx, counts


def rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates ``x[N, H, D]`` in place, neox style, by ``cos``/``sin`` ``[N, 1, R]`` (or ``[N, R]``, R ≤ D/2,
    x's dtype); returns ``x``. The first 2R values of each head turn, the rest stay."""
    assert _cpu_fused is not None, "folio.kernels._cpu_fused was not built"
    require(supports(x) and x.dim() == 3 and x.stride(2) == 1,
            lambda: f"x must be a [tokens, heads, head_dim] CPU tensor of {sorted(map(str, VECTOR_DTYPES))} with "
                    f"contiguous heads, got {x.dtype} {tuple(x.shape)}")
    cos, sin = cos.reshape(cos.shape[0], -1), sin.reshape(sin.shape[0], -1)  # views: [N, 1, R] -> [N, R]
    half = cos.shape[1]
    require(cos.shape == sin.shape == (x.shape[0], half) and 2 * half <= x.shape[2],
            lambda: f"cos/sin {tuple(cos.shape)} must be [tokens, R] with 2R <= head_dim {x.shape[2]}")
    require(cos.dtype == sin.dtype == x.dtype and cos.stride() == sin.stride() and cos.stride(1) == 1,
            "cos and sin must be in x's dtype, with the same contiguous rows")
    _cpu_fused.rotary_neox(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.shape[0], x.shape[1], x.stride(0),
                           x.stride(1), cos.stride(0), half, DTYPES[x.dtype], torch.get_num_threads())
    return x


def can_store(key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether `store_kv` takes these rows: built, CPU, and each token's heads one contiguous run."""
    return AVAILABLE and all(
        t.device.type == "cpu" and t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]
        for t in (key, value))


def store_kv(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Writes ``key[i]``/``value[i]`` (``[N, kv_heads, head_dim]``, each token's heads one contiguous run) to
    slot ``slot_mapping[i]`` (int64) of the contiguous caches; -1 is skipped. Any other slot outside the
    cache raises ValueError before anything is written."""
    assert _cpu_fused is not None, "folio.kernels._cpu_fused was not built"
    row = k_cache.shape[2] * k_cache.shape[3]
    require(can_store(key, value) and key.dtype == value.dtype == k_cache.dtype
            and key.shape[1:] == value.shape[1:] == k_cache.shape[2:],
            lambda: f"key {tuple(key.shape)} and value {tuple(value.shape)} (strides {key.stride()}, {value.stride()}) "
                    f"must be [tokens, {k_cache.shape[2]}, {k_cache.shape[3]}] CPU rows in the cache's dtype")
    require(k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape == v_cache.shape
            and v_cache.dtype == k_cache.dtype and k_cache.device.type == "cpu", "the caches must be contiguous "
            "CPU tensors of one shape and dtype")
    require(slot_mapping.dtype == torch.int64 and slot_mapping.shape == (key.shape[0],) == (value.shape[0],)
            and slot_mapping.is_contiguous(), "slot_mapping must be int64 [tokens]")
    size = key.element_size()
    _cpu_fused.store_kv(key.data_ptr(), value.data_ptr(), key.stride(0) * size, value.stride(0) * size,
                        k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr(), key.shape[0], row * size,
                        k_cache.shape[0] * k_cache.shape[1], torch.get_num_threads())
