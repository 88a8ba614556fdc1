"""The greedy LM head's bfloat16 screen (folio.engine.layers.greedy_head) against the float32 head, in one run.

SmolLM2-135M-Instruct float32 (the throughput benchmark's model and prompts): the hidden states that reach the
LM head while the engine decodes the throughput workload are captured, then, on one thread:
- how many tokens per row the screen leaves for float32 (median, 99th percentile, most), and whether each
  row's screened token is the float32 logits' first maximum;
- the time of the head at batch 64: float32 logits and their first maximum (oneDNN, prepacked, as the engine
  ran it before) against the screen, alternating, best of ``--rounds``.
Needs a CPU with bfloat16 GEMMs (AVX512-BF16 or AMX); elsewhere it says so and exits 0.

    taskset -c 1 .venv/bin/python bench/greedy_head.py [--steps 24] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.throughput import prepare_model, workload
from folio.engine import LLM, SamplingParams
from folio.engine.layers import greedy_head
from folio.engine.layers.linear import linear, pack_for_onednn
from folio.kernels import fused_cpu


def captured_hidden_states(steps: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every hidden-state batch the screen saw while decoding ``steps`` tokens of the workload, and the head."""
    llm = LLM(str(prepare_model("smollm2")), dtype="float32", kv_cache_memory_gib=1.0)
    model = llm.llm_engine.runner.model
    screen = model.greedy_screen
    assert screen is not None
    seen: list[torch.Tensor] = []

    def capture(x: torch.Tensor) -> torch.Tensor | None:
        seen.append(x.clone())
        return screen(x)

    model.greedy_screen = capture
    llm.generate(workload(64), SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True))
    return seen, screen.weight


def best_ms(fn, rounds: int, calls: int = 10) -> float:
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return min(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24, help="decode steps whose hidden states are captured")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not greedy_head.available(torch.float32):
        print("this CPU has no bfloat16 GEMMs: float32 models decode greedily from the float32 logits")
        return 0
    torch.set_num_threads(1)
    batches, weight = captured_hidden_states(args.steps)
    screen = greedy_head.GreedyScreen(weight)
    packed = pack_for_onednn(weight)
    counts: list[int] = []
    same = rows = 0
    for x in batches:
        tokens = screen(x)
        expected = fused_cpu.argmax(linear(x, packed))
        same += int((tokens == expected).sum())
        rows += x.shape[0]
        found = screen.candidates(x)
        assert found is not None
        counts += torch.bincount(found[0], minlength=x.shape[0]).tolist()
    counts.sort()
    print(f"SmolLM2 LM head {tuple(weight.shape)}, {rows} rows of real hidden states from {len(batches)} steps")
    print(f"tokens left for float32 per row: median {statistics.median(counts):.0f}, "
          f"p99 {counts[int(0.99 * (len(counts) - 1))]}, most {counts[-1]} (of {weight.shape[0]})")
    print(f"screened token = float32 logits' first maximum: {same} of {rows} rows")
    x = max(batches, key=lambda b: b.shape[0])[:64]
    flops = 2 * x.shape[0] * weight.numel()
    fp32 = best_ms(lambda: fused_cpu.argmax(linear(x, packed)), args.rounds)
    screened = best_ms(lambda: screen(x), args.rounds)
    half = best_ms(lambda: linear(x.to(torch.bfloat16), screen.packed), args.rounds)
    print(f"batch {x.shape[0]}, one thread: float32 head + argmax {fp32:.2f} ms ({flops / fp32 / 1e6:.0f} GFLOP/s), "
          f"screen {screened:.2f} ms (its bfloat16 GEMM {half:.2f} ms, {flops / half / 1e6:.0f} GFLOP/s): "
          f"{fp32 / screened:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
