"""The native CPU twin of paged decode attention (``kernels/csrc/paged_decode_cpu.c``).

It reads K/V in place from the paged cache, where the PyTorch path first gathers every sequence's blocks
into a dense copy. Built by ``pip install`` as an optional C extension; ``AVAILABLE`` says whether this
install has it. Inputs are checked by ``folio.kernels.decode_attention.paged_decode_attention``.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from folio.kernels.recording import native

try:
    from folio.kernels import _cpu_attention as _extension  # type: ignore[attr-defined]

    _cpu_attention = native(_extension)  # its calls go through a NativeModule (folio.kernels.recording)
except ImportError:  # built without a C compiler: callers use the PyTorch path
    _cpu_attention = None

AVAILABLE = _cpu_attention is not None
DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_OPENMP_NAMES = ("libgomp", "libiomp5", "libomp")  # GNU's, or Intel's and LLVM's (both export GOMP_parallel)


def _torch_openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime this process's torch runs its thread pool on, if it is one we can call."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split(maxsplit=5)[-1] for line in maps.splitlines() if line.count(" ") >= 5}
    for path in sorted(paths):
        if Path(path).name.startswith(_OPENMP_NAMES):
            try:  # already loaded, so this only returns a handle to it
                lib = ctypes.CDLL(path)
                if all(hasattr(lib, name) for name in ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")):
                    return lib
            except OSError:
                continue
    return None


def share_torch_threads(module: object) -> None:
    """Points a native kernel module's ``use_openmp`` at torch's OpenMP runtime, where there is one: threads
    of its own would compete with torch's workers while they spin after an op."""
    omp = _torch_openmp()
    if omp is not None:
        module.use_openmp(*(ctypes.cast(getattr(omp, name), ctypes.c_void_p).value  # type: ignore[attr-defined]
                            for name in ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")))


if _cpu_attention is not None:
    share_torch_threads(_cpu_attention)


def supports(q: torch.Tensor) -> bool:
    return AVAILABLE and q.device.type == "cpu" and q.dtype in DTYPES


def decode_attention_cpu(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, *, window: int | None = None, max_context_len: int | None = None,
) -> torch.Tensor:
    """``q [B, Hq, D]`` (unit last stride) over contiguous caches; block tables and lengths int32; a sliding
    ``window`` limits each query to its sequence's last ``window`` tokens. A length outside
    ``[0, max_context_len]`` (default: the block tables' capacity) raises ValueError, as does a block id
    outside the cache."""
    assert _cpu_attention is not None, "folio.kernels._cpu_attention was not built"
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and q.stride(-1) == 1
    block_tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    context_lens = context_lens.contiguous()
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    _cpu_attention.paged_decode(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(), context_lens.data_ptr(),
        out.data_ptr(), batch, heads, kv_heads, head_dim, block_size, k_cache.shape[0], block_tables.stride(0),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), scale, DTYPES[q.dtype], torch.get_num_threads(),
        window or 0, block_tables.shape[1] * block_size if max_context_len is None else max_context_len,
    )
    return out
