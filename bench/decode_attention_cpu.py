"""The native CPU decode-attention kernel (kernels/csrc/paged_decode_cpu.c) against its own variants, in one run.

Builds the kernel three ways with the flags setup.py uses: the portable path only (what bfloat16 ran before
it had a vector path), the vector path without software prefetching, and the vector path as shipped (the
vector paths at the widest set this CPU has: AVX-512 or AVX2; the first line says which).
Each variant runs in its own process, pinned to one core with one thread, over the throughput benchmark's
decode shapes: SmolLM2's 9 query / 3 KV heads of 64, 64 sequences of 100-300 tokens, 16-token blocks
scattered over 30 layers' caches (2 GiB in float32, as `--kv-cache-memory-gib 2`), so that every layer's
K/V comes from DRAM as it does in the engine. Correctness of every path is tests/kernels' business; reported: ms per layer call, GB/s of K/V read, and each
variant's speed against the portable one.

    .venv/bin/python bench/decode_attention_cpu.py [--rounds 2] [--core 1]

With ``--split`` it measures instead how the shipped kernel shares a step among threads: ``--cores`` (default
0,1) with a thread each, on torch's OpenMP pool as in the engine, 1 to 32 sequences of ``--context`` tokens
(default 100-300), against the kernel built with the old bar for starting a second thread (32768 query-head x
key pairs, which kept SmolLM2's 16 and 32 sequences of 200 tokens on one thread) and against the kernel
that never splits a context (with fewer sequences than threads, the shipped one runs each context in parts,
a thread each, and merges them).

    .venv/bin/python bench/decode_attention_cpu.py --split [--cores 0,1] [--context 1000-3000]

With ``--against REV`` it compares the shipped kernel with the one at git revision REV (that revision's
kernels/csrc, built the same way), float32 and bfloat16, 8, 16 and 64 sequences, on ``--cores``.

    .venv/bin/python bench/decode_attention_cpu.py --against 4f45751 [--cores 1] [--rounds 3]

``--verify-rows N`` lays each sequence out as a verify step does (speculative decoding): N consecutive rows
over its one block table, its last N positions, so that 8 sequences make 8 × N rows (GB/s counts each
sequence's K/V once).

    .venv/bin/python bench/decode_attention_cpu.py --against e604873 --verify-rows 9 [--cores 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "kernels" / "csrc" / "paged_decode_cpu.c"
FLAGS = ["-O3", "-fopenmp-simd", "-fno-math-errno", "-ffp-contract=fast", "-std=c11", "-pthread"]  # setup.py's
VARIANTS = {"portable": ["-DFOLIO_PORTABLE_ONLY"], "vector, no prefetch": ["-DFOLIO_NO_PREFETCH"], "shipped": []}
SPLIT_VARIANTS = {"one thread below 32768 pairs": ["-DMIN_PAIRS_PER_THREAD=32768"],
                  "no context split": ["-DFOLIO_NO_CONTEXT_SPLIT"], "shipped": []}  # fmt: skip
SPLIT_BATCHES = (1, 2, 4, 8, 16, 32)
BATCH, HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS = 64, 9, 3, 64, 16, 30
NUM_BLOCKS = (2 << 30) // (2 * BLOCK * KV_HEADS * HEAD_DIM * 4 * LAYERS)  # each layer's pages of a 2 GiB cache
RESULT = "FOLIO_BENCH_RESULT "


def build(out_dir: Path, variants: dict[str, list[str]], source: Path = SOURCE) -> dict[str, Path]:
    cc = os.environ.get("CC") or (sysconfig.get_config_var("CC") or "cc").split()[0]
    include = sysconfig.get_paths()["include"]
    built = {}
    for name, defines in variants.items():
        so = out_dir / f"{name.replace(' ', '_').replace(',', '')}" / "_cpu_attention.so"
        so.parent.mkdir()
        subprocess.run([cc, "-shared", "-fPIC", *FLAGS, *defines, f"-I{include}", str(source), "-o", str(so)],
                       check=True)
        built[name] = so
    return built


def measure(so: Path, dtype_name: str, calls: int, batch: int = BATCH, threads: int = 1,
            context: tuple[int, int] = (100, 300), rows: int = 1) -> dict:  # fmt: skip
    """ms per layer call of the variant at ``so`` over ``batch`` sequences of ``rows`` rows each (run in a
    process of its own)."""
    import torch
    from _revisions import load_extension

    torch.set_num_threads(threads)
    kernel = load_extension("_cpu_attention", so)
    if threads > 1:  # on torch's OpenMP pool, as the engine runs it
        from folio.kernels.native import share_torch_threads

        torch.zeros(1024, 1024).sum()  # torch's pool started first, as in a step
        share_torch_threads(kernel)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    g = torch.Generator().manual_seed(0)
    num_blocks = NUM_BLOCKS
    caches = [(torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=g).to(dtype),
               torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=g).to(dtype)) for _ in range(LAYERS)]
    lens = torch.randint(context[0], context[1] + 1, (batch,), generator=g, dtype=torch.int32)
    per_seq = context[1] // BLOCK + 1
    tables = torch.randperm(num_blocks, generator=g)[: batch * per_seq].view(batch, per_seq).to(torch.int32)
    read = int(lens.sum()) * KV_HEADS * HEAD_DIM * 2 * torch.finfo(dtype).bits // 8
    if rows > 1:  # each sequence's last `rows` positions, consecutive rows over its table
        tables = tables.repeat_interleave(rows, 0).contiguous()
        lens = (lens[:, None] - rows + 1 + torch.arange(rows, dtype=torch.int32)).flatten().contiguous()
        batch *= rows
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=g).to(dtype)
    out = torch.empty_like(q)
    code = {torch.float32: 0, torch.bfloat16: 1}[dtype]

    def call(k: torch.Tensor, v: torch.Tensor) -> None:
        kernel.paged_decode(q.data_ptr(), k.data_ptr(), v.data_ptr(), tables.data_ptr(), lens.data_ptr(),
                            out.data_ptr(), batch, HEADS, KV_HEADS, HEAD_DIM, BLOCK, num_blocks, tables.stride(0),
                            q.stride(0), q.stride(1), out.stride(0), out.stride(1), HEAD_DIM**-0.5, code, threads, 0,
                            per_seq * BLOCK)

    for k, v in caches:  # warm up: every page touched once
        call(k, v)
    start = time.perf_counter()
    for i in range(calls):
        call(*caches[i % LAYERS])
    seconds = (time.perf_counter() - start) / calls
    return {"ms": seconds * 1e3, "gb_s": read / seconds / 1e9, "simd": kernel.simd()}


def run_variant(so: Path, dtype: str, calls: int, cores: str, batch: int = BATCH, threads: int = 1,
                context: str = "100-300", rows: int = 1) -> dict:  # fmt: skip
    cmd = ["taskset", "-c", cores, sys.executable, __file__, "--measure", str(so), dtype, "--calls", str(calls),
           "--batch", str(batch), "--threads", str(threads), "--context", context, "--verify-rows", str(rows)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(next(x for x in out.splitlines() if x.startswith(RESULT))[len(RESULT) :])


def best_of(rounds: int, built: dict[str, Path], **how: object) -> dict[str, dict]:
    """Each variant's fastest of ``rounds`` alternating runs (`run_variant` with ``how``)."""
    best: dict[str, dict] = {}
    for _ in range(rounds):
        for name, so in built.items():
            r = run_variant(so, **how)  # type: ignore[arg-type]
            if name not in best or r["ms"] < best[name]["ms"]:
                best[name] = r
    return best


def variants(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        built = build(Path(tmp), VARIANTS)
        for dtype in ("float32", "bfloat16"):
            best = best_of(args.rounds, built, dtype=dtype, calls=args.calls, cores=args.core)
            base = best["portable"]["ms"]
            if dtype == "float32":
                print(f"vector path: {best['shipped']['simd']}-bit (AVX-512 if 512, AVX2 if 256)", flush=True)
            for name, r in best.items():
                print(f"{dtype:9s} {name:20s} {r['ms']:7.3f} ms per layer call  {r['gb_s']:5.1f} GB/s  "
                      f"{base / r['ms']:5.2f}x the portable path", flush=True)


def split(args: argparse.Namespace) -> None:
    threads = len(args.cores.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        built = build(Path(tmp), SPLIT_VARIANTS)
        print(f"float32, {threads} threads on cores {args.cores}, contexts of {args.context} tokens, best of "
              f"{args.rounds}: ms per layer call (GB/s), and the shipped kernel's speed against each other one")  # fmt: skip
        others = [name for name in built if name != "shipped"]
        print(f"{'sequences':>9} " + " ".join(f"{name:>30}" for name in built) + "   " +
              " ".join(f"vs {name}" for name in others))  # fmt: skip
        longest = int(args.context.split("-")[1])
        for batch in (b for b in SPLIT_BATCHES if b * (longest // BLOCK + 1) <= NUM_BLOCKS):  # the cache holds them
            best = best_of(args.rounds, built, dtype="float32", calls=args.calls, cores=args.cores, batch=batch,
                           threads=threads, context=args.context)  # fmt: skip
            cells = " ".join(f"{r['ms']:>21.3f} ({r['gb_s']:4.1f})" for r in best.values())
            ratios = " ".join(f"{best[name]['ms'] / best['shipped']['ms']:>{len(name) + 2}.2f}x" for name in others)
            print(f"{batch:>9} {cells}   {ratios}", flush=True)


def against(args: argparse.Namespace) -> None:
    """The shipped kernel against the one at git revision ``args.against`` (its kernels/csrc, built the same
    way), both dtypes, on ``args.cores`` with a thread each."""
    from _revisions import kernel_sources_at

    threads = len(args.cores.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        old = kernel_sources_at(args.against, Path(tmp) / "old")
        built = {**build(Path(tmp), {args.against: []}, old / SOURCE.name), **build(Path(tmp), {"shipped": []})}
        rows = args.verify_rows
        print(f"{threads} thread(s) on cores {args.cores}, contexts of {args.context} tokens"
              f"{f', {rows} verify rows each' if rows > 1 else ''}, best of {args.rounds}: "
              f"ms per layer call (GB/s) of the kernel at {args.against} and the shipped one")  # fmt: skip
        for dtype in ("float32", "bfloat16"):
            for batch in (1, 8, 16) if rows > 1 else (8, 16, 64):
                best = best_of(args.rounds, built, dtype=dtype, calls=args.calls, cores=args.cores, batch=batch,
                               threads=threads, context=args.context, rows=rows)  # fmt: skip
                a, b = best[args.against], best["shipped"]
                print(f"{dtype:>9} {batch:>3} sequences: {a['ms']:6.3f} ({a['gb_s']:4.1f}) -> {b['ms']:6.3f} "
                      f"({b['gb_s']:4.1f})  {a['ms'] / b['ms']:.2f}x", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds; each variant's best is kept")
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--core", default="1")
    parser.add_argument("--split", action="store_true", help="threads sharing a step (see above)")
    parser.add_argument("--cores", default="0,1", help="--split: the cores, one thread each")
    parser.add_argument("--context", default="100-300", help="--split: each sequence's tokens, LO-HI")
    parser.add_argument("--against", metavar="REV", help="the shipped kernel against git revision REV's, on --cores")
    parser.add_argument("--measure", nargs=2, metavar=("SO", "DTYPE"), help=argparse.SUPPRESS)  # internal
    parser.add_argument("--batch", type=int, default=BATCH, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--verify-rows", type=int, default=1, help="--against: rows a sequence (see above)")
    args = parser.parse_args()
    if args.measure:
        lo, hi = (int(x) for x in args.context.split("-"))
        r = measure(Path(args.measure[0]), args.measure[1], args.calls, args.batch, args.threads, (lo, hi),
                    args.verify_rows)
        print(RESULT + json.dumps(r), flush=True)
    elif args.split:
        split(args)
    elif args.against:
        against(args)
    else:
        variants(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
