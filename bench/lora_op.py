"""The batched multi-LoRA op on the CPU (the reference path) against the base projection it rides on.

For decode (16 tokens) and prefill (512 tokens) steps at SmolLM2's widths (in 576, out 576 / 1536), rank 16,
8 slots: the time of ``add_lora`` with 1, 4 or 8 adapters in the step, and its ratio to the base
``x @ W.T``; ``auto`` is the plan a step's groups pick, ``static`` the fixed-shape dense plan that recorded
CPU step graphs replay (``lora_groups(slots, static=True)``). Each figure is the best of ``--repeats`` runs
(the machine may be shared).

    python bench/lora_op.py [--threads N] [--repeats N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from folio.kernels.lora import add_lora, lora_groups


def best_us(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def slots_for(kind: str, tokens: int, adapters: int) -> torch.Tensor:
    if kind == "decode":  # one token per sequence, sequences' adapters interleaved
        s = torch.arange(tokens) % adapters
    else:  # prefill: 4 sequences of contiguous tokens
        s = (torch.arange(tokens) * 4 // tokens) % adapters
    return s.to(torch.int32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    slots_n, rank, in_f = 8, 16, 576
    print(f"threads {args.threads}, {args.dtype}, {slots_n} slots, rank {rank}, in {in_f}; best of {args.repeats}")
    print(f"{'step':8} {'T':>4} {'out':>5} {'base us':>8} | {'adapters':>8} {'auto us':>8} {'ratio':>6}"
          f" | {'static us':>9} {'ratio':>6}")
    with torch.no_grad():
        for kind, tokens in (("decode", 16), ("prefill", 512)):
            for out_f in (576, 1536):
                x = torch.randn(tokens, in_f, dtype=dtype)
                w = torch.randn(out_f, in_f, dtype=dtype) / in_f ** 0.5
                a = torch.randn(slots_n, rank, in_f, dtype=dtype) / in_f ** 0.5
                b = torch.randn(slots_n, out_f, rank, dtype=dtype) / rank ** 0.5
                out = x @ w.T
                base = best_us(lambda: x @ w.T, args.repeats)  # noqa: B023
                for adapters in (1, 4, 8):
                    slots = slots_for(kind, tokens, adapters)
                    figures = []
                    for static in (False, True):
                        groups = lora_groups(slots, static=static)  # once per step, for every layer: not timed
                        figures.append(best_us(lambda: add_lora(out, x, a, b, slots, groups=groups),  # noqa: B023
                                               args.repeats))
                    us, static_us = figures
                    print(f"{kind:8} {tokens:>4} {out_f:>5} {base:>8.1f} | {adapters:>8} {us:>8.1f} {us / base:>6.2f}"
                          f" | {static_us:>9.1f} {static_us / base:>6.2f}")


if __name__ == "__main__":
    main()
