"""Compiles every folio Triton kernel for an H100/H200 (sm_90) without a GPU, through the real launchers.

Run as a script, in a process where TRITON_INTERPRET is unset: it swaps ``JITFunction.run`` for a hook
that specializes the launch arguments exactly as Triton's JIT does, then compiles the kernel down to a
cubin with the ptxas bundled in the triton wheel, instead of launching it. It prints one line per
compiled kernel and exits non-zero on the first failure. Used by test_compile_for_gpu.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable

assert not os.environ.get("TRITON_INTERPRET"), "run without TRITON_INTERPRET: the kernels must be JITFunctions"

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.compiler import ASTSource, compile, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)


def _compile_instead_of_launch(self: JITFunction, *args: object, grid: object, warmup: bool, **kwargs: object) -> None:
    bound_args, specialization, options = specialize(self, *args, **kwargs)
    options, signature, constexprs, attrs = self._pack_args(BACKEND, kwargs, bound_args, specialization, options)
    kernel = compile(ASTSource(self, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
    assert "cubin" in kernel.asm, f"{self.__name__}: no cubin produced"
    named = {self.arg_names[path[0]]: value for path, value in constexprs.items()}
    consts = ", ".join(f"{name}={value}" for name, value in named.items() if name.isupper())
    print(f"sm_90 ok  {self.__name__:<22} {_ptxas_usage(kernel.asm['ptx'])}, "
          f"{kernel.metadata.shared} B shared  [{consts}]", flush=True)


def _ptxas_usage(ptx: str) -> str:
    """Registers and spills as ptxas reports them (spills in an attention loop would cost bandwidth)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", src, "-o", os.path.join(tmp, "k.o")],
                             capture_output=True, text=True).stderr
    if "error" in out:
        raise RuntimeError(out)
    regs = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    return f"{regs.group(1) if regs else '?'} registers, {spills.group(1) if spills else '?'} B spilled"


def intercept_launches(hook: Callable[..., None]) -> None:
    """Every Triton launch calls ``hook(jit_function, *args, grid=, warmup=, **kwargs)`` instead, on CPU
    tensors (the launchers' device check is lifted)."""
    import folio.kernels._backend as backend_module
    from folio.kernels import (
        decode_attention_triton,
        kv_store_triton,
        prefill_attention_triton,
        rms_norm_triton,
        rotary_triton,
    )

    JITFunction.run = hook  # type: ignore[method-assign]
    backend_module.ensure_launchable = lambda kernel, device: None  # type: ignore[assignment]
    for module in (decode_attention_triton, kv_store_triton, prefill_attention_triton, rms_norm_triton, rotary_triton):
        module.ensure_launchable = backend_module.ensure_launchable  # type: ignore[attr-defined]


def specialize(fn: JITFunction, *args: object, **kwargs: object) -> tuple[object, object, object]:
    """``(bound_args, specialization, options)`` exactly as Triton's JIT derives them for these arguments."""
    binder = create_function_from_signature(fn.signature, fn.params, BACKEND)
    return binder(*args, **kwargs)


def main() -> int:
    intercept_launches(_compile_instead_of_launch)
    from folio.kernels.decode_attention import paged_decode_attention
    from folio.kernels.kv_store import store_kvcache
    from folio.kernels.prefill_attention import paged_prefill_attention
    from folio.kernels.rms_norm import fused_add_rms_norm, rms_norm
    from folio.kernels.rotary import apply_rotary_embedding, rope_cos_sin_cache
    bf16 = torch.bfloat16
    # Llama-3-8B-like attention (32 query heads, 8 KV heads, head_dim 128) in bfloat16, block size 16.
    k_cache = torch.zeros(64, 16, 8, 128, dtype=bf16)
    v_cache = torch.zeros_like(k_cache)
    tables = torch.zeros(4, 16, dtype=torch.int32)
    lens = torch.full((4,), 100, dtype=torch.int32)
    q = torch.zeros(4, 32, 128, dtype=bf16)
    store_kvcache(q[:, :8], q[:, 8:16], k_cache, v_cache, torch.zeros(4, dtype=torch.int64), backend="triton")
    for splits in (1, 4):
        paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.1, num_splits=splits, backend="triton")
    cu = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)
    paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.1, backend="triton")
    # head_dim 64 without grouping (the 4-warp prefill configuration), for a batch of one sequence
    # (Triton specializes an integer argument equal to 1 into a constant).
    k64 = torch.zeros(8, 16, 4, 64, dtype=bf16)
    one = torch.tensor([0, 4], dtype=torch.int32)
    paged_prefill_attention(torch.zeros(4, 4, 64, dtype=bf16), k64, k64.clone(), one, lens[:1], tables[:1], 0.1,
                            backend="triton")
    # float32 (IEEE dots) with a group of 3 and head_dim 64.
    k32 = torch.zeros(8, 32, 2, 64)
    q32 = torch.zeros(4, 6, 64)
    paged_decode_attention(q32, k32, k32.clone(), tables, lens, 0.1, num_splits=1, backend="triton")
    paged_prefill_attention(q32, k32, k32.clone(), cu, lens, tables, 0.1, backend="triton")
    # float32 at head_dim 128 with GQA 4 (the engine's --dtype float32 on Llama-3 shapes): its own smaller tile.
    k32_128 = torch.zeros(8, 16, 2, 128)
    paged_prefill_attention(torch.zeros(4, 8, 128), k32_128, k32_128.clone(), cu, lens, tables, 0.1,
                            backend="triton")
    # head_dim 256 (Gemma 3: 4 query heads on one KV head) in bfloat16: the half tile, in shared memory
    k256 = torch.zeros(8, 16, 1, 256, dtype=bf16)
    paged_prefill_attention(torch.zeros(4, 4, 256, dtype=bf16), k256, k256.clone(), cu, lens, tables, 0.1,
                            backend="triton")
    x = torch.zeros(4, 4096, dtype=bf16)
    w = torch.ones(4096, dtype=bf16)
    rms_norm(x, w, 1e-5, backend="triton")
    fused_add_rms_norm(x, x, w, 1e-5, backend="triton")
    cache = rope_cos_sin_cache(128, 64, 500000.0, dtype=bf16)
    apply_rotary_embedding(torch.zeros(4, dtype=torch.int64), q, q[:, :8], cache, backend="triton")
    return 0


if __name__ == "__main__":
    sys.exit(main())
