"""The decode-step projections of a few rows: `folio.kernels.decode_gemm_cpu`'s panel kernel against oneDNN's
GEMM on the prepacked weight (what the engine runs otherwise), in the same run.

One pass is every projection of SmolLM2's 30 layers (merged QKV, output, merged gate-up, down: 107 M
weights) at 1 to 64 rows, float32 and bfloat16 (bfloat16 only where oneDNN runs it prepacked);
best of --repeat passes. The pass reads each weight once, so the table also prints the weights' bytes over
the time (GB/s) next to a plain `sum` over the same bytes, the rate a pass over memory reaches here.

With ``--engine-steps`` it times whole engine decode steps too (SmolLM2 float32, sampled at temperature 1
as a served request is, so the LM head counts; ~200-token contexts): the median of 40 steps at 1 to 32
sequences, with the panels and without (`folio.engine.layers.linear.DECODE_PANELS`), in this process.

    .venv/bin/python bench/decode_gemm.py [--threads 2] [--repeat 7] [--engine-steps]

With ``--against REV`` it times instead the float32 panels with this kernel and with the one at git revision
REV (that revision's kernels/csrc, built as setup.py builds it), both in this process, alternately.

    .venv/bin/python bench/decode_gemm.py --against 4f45751 [--repeat 12]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# SmolLM2-135M's projections, [out, in]: merged QKV (9 + 2 * 3 heads of 64), output, merged gate-up, down
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS = 30
ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm: first-touch of outputs, oneDNN's primitive cache
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def one_dtype(dtype: torch.dtype, repeat: int, g: torch.Generator) -> None:
    from folio.engine.layers.linear import linear, pack_for_onednn
    from folio.kernels import decode_gemm_cpu

    weights = [torch.randn(*s, generator=g).to(dtype) for _ in range(LAYERS) for s in SHAPES]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    onednn = [(w.shape[1], pack_for_onednn(w)) for w in weights]
    panels = [(w.shape[1], decode_gemm_cpu.pack(w)) for w in weights]
    flat = torch.cat([w.flatten() for w in weights])
    floor = best_seconds(flat.sum, repeat)
    name = str(dtype).removeprefix("torch.")
    for rows in ROWS:
        x = torch.randn(rows, max(k for _, k in SHAPES), generator=g).to(dtype)
        inputs = {k: x[:, :k].contiguous() for _, k in SHAPES}
        ref = best_seconds(lambda: [linear(inputs[k], p) for k, p in onednn], repeat)  # noqa: B023
        ours = best_seconds(lambda: [decode_gemm_cpu.decode_gemm(inputs[k], p) for k, p in panels], repeat)  # noqa: B023
        print(f"{name:>9} {rows:>4} {ref * 1e3:>7.2f}ms {ours * 1e3:>7.2f}ms {ref / ours:>5.2f}x "
              f"{nbytes / ref / 1e9:>6.1f}GB/s {nbytes / ours / 1e9:>6.1f}GB/s {nbytes / floor / 1e9:>6.1f}GB/s")  # fmt: skip


def engine_step_ms(panels: bool, sequences: int) -> float:
    """The median decode step of SmolLM2 float32 with ``sequences`` running, panels on or off."""
    from _engine_steps import decode_step_ms
    from throughput import prepare_model

    from folio.engine import LLM
    from folio.engine.layers import linear

    linear.DECODE_PANELS = panels
    try:
        llm = LLM(str(prepare_model("smollm2")), dtype="float32", kv_cache_memory_gib=1.0)
    finally:
        linear.DECODE_PANELS = True
    return decode_step_ms(llm, sequences)


def against(rev: str, repeat: int) -> None:
    """float32 panels, this kernel against the one at git revision ``rev`` (float32 panels have had one layout
    throughout), both loaded in this process and timed alternately over the same weights and rows."""
    import subprocess
    import sysconfig
    import tempfile

    from _revisions import kernel_sources_at, load_extension

    from folio.kernels import decode_gemm_cpu
    from folio.kernels.native import share_torch_threads

    name = "_cpu_decode_gemm_rev"
    with tempfile.TemporaryDirectory() as tmp:
        source = kernel_sources_at(rev, Path(tmp)) / "decode_gemm_cpu.c"
        so = Path(tmp) / f"{name}.so"
        cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
        subprocess.run([cc, "-shared", "-fPIC", "-O3", "-fno-math-errno", "-std=c11", "-pthread",  # setup.py's
                        f"-DPyInit__cpu_decode_gemm=PyInit_{name}", f"-I{sysconfig.get_paths()['include']}",
                        str(source), "-o", str(so)], check=True)  # fmt: skip
        old = load_extension(name, so)
    share_torch_threads(old)
    new = decode_gemm_cpu._cpu_decode_gemm
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(*s, generator=g) for _ in range(LAYERS) for s in SHAPES]
    panels = [decode_gemm_cpu.pack(w) for w in weights]
    nbytes = sum(w.numel() * 4 for w in weights)

    def run(kernel: object, inputs: dict[int, torch.Tensor]) -> None:
        for p in panels:
            x = inputs[p.in_features]
            out = torch.empty(x.shape[0], p.out_features)
            kernel.gemm(x.data_ptr(), x.stride(0), p.data.data_ptr(), 0, out.data_ptr(), x.shape[0],  # type: ignore[attr-defined]
                        p.out_features, p.in_features, 0, torch.get_num_threads())  # fmt: skip

    print(f"float32 panels, the kernel at {rev} and this one, alternately, best of {repeat} each")
    for rows in (1, 4, 8, 12, 16, 24, 32):
        x = torch.randn(rows, max(k for _, k in SHAPES), generator=g)
        inputs = {k: x[:, :k].contiguous() for _, k in SHAPES}
        best = {"old": float("inf"), "new": float("inf")}
        for i in range(repeat):
            for which in ("old", "new") if i % 2 == 0 else ("new", "old"):
                start = time.perf_counter()
                run(old if which == "old" else new, inputs)
                best[which] = min(best[which], time.perf_counter() - start)
        print(f"{rows:>4} rows: {best['old'] * 1e3:6.2f} ms ({nbytes / best['old'] / 1e9:4.1f} GB/s) -> "
              f"{best['new'] * 1e3:6.2f} ms ({nbytes / best['new'] / 1e9:4.1f} GB/s)  {best['old'] / best['new']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--engine-steps", action="store_true", help="also time whole engine decode steps")
    parser.add_argument("--against", metavar="REV", help="float32 panels only: this kernel against REV's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.against:
        against(args.against, args.repeat)
        return

    from folio.engine.layers.linear import packs
    from folio.kernels import decode_gemm_cpu

    if not decode_gemm_cpu.AVAILABLE:
        raise SystemExit("the decode GEMM kernel does not run here (needs AVX-512F and the built extension)")
    print(f"SmolLM2's projections x {LAYERS} layers, {args.threads} thread(s), best of {args.repeat}")
    print(f"{'dtype':>9} {'rows':>4} {'oneDNN':>9} {'panels':>9} {'ratio':>6} {'oneDNN':>10} {'panels':>10} "
          f"{'sum':>10}")  # fmt: skip
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        if packs(dtype):
            one_dtype(dtype, args.repeat, g)
        else:
            print(f"{dtype!s:>9}: oneDNN does not run it prepacked on this CPU; skipped")
    if args.engine_steps:
        print("engine decode steps, SmolLM2 float32, sampled, median of 40:")
        for sequences in (1, 8, 16, 32):
            off, on = engine_step_ms(False, sequences), engine_step_ms(True, sequences)
            print(f"  {sequences} sequence(s): {off:.1f} ms on oneDNN, {on:.1f} ms with the panels: {off / on:.2f}x")


if __name__ == "__main__":
    main()
