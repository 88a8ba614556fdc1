"""CPU step graphs (`folio.engine.cpu_graphs`): whole engine decode steps replayed from a recording against
the same steps run eagerly (`enforce_eager`), in one process, alternating, best of --rounds medians.

SmolLM2 (float32 and bfloat16), ~200-token prompts, sampled at temperature 1 as a served request is (the LM
head and sampler run eagerly in both), 1 to 32 sequences; also the graphs' arena.

    .venv/bin/python bench/cpu_graphs.py [--threads 2] [--rounds 2] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SEQUENCES = (1, 4, 8, 16, 32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from _engine_steps import decode_step_ms
    from throughput import prepare_model

    from folio.engine import LLM

    model = str(prepare_model("smollm2"))
    print(f"SmolLM2 decode steps, {args.threads} thread(s), median of 40 steps, best of {args.rounds} rounds")
    print(f"{'dtype':>9} {'seqs':>4} {'eager':>9} {'graphs':>9} {'ratio':>6} {'arena':>9}")
    for dtype in args.dtypes.split(","):
        llms = {eager: LLM(model, dtype=dtype, kv_cache_memory_gib=1.0, enforce_eager=eager) for eager in (True, False)}
        graphs = llms[False].llm_engine.runner.decode_graphs
        if graphs is None:
            raise SystemExit("this build records no CPU step graphs (needs the native decode kernel)")
        for n in SEQUENCES:
            best = {True: float("inf"), False: float("inf")}
            for _ in range(args.rounds):
                for eager in (True, False):
                    best[eager] = min(best[eager], decode_step_ms(llms[eager], n))
            arena = graphs.arena.buffer.numel() / 2**20
            print(f"{dtype:>9} {n:>4} {best[True]:>7.2f}ms {best[False]:>7.2f}ms {best[True] / best[False]:>5.2f}x "
                  f"{arena:>6.1f}MiB")  # fmt: skip


if __name__ == "__main__":
    main()
