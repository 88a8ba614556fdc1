"""Placement across replicas: PrefixHash against LeastLoaded and round robin, on real engines.

Four `folio serve` replicas of one random-weight Llama (prefix caching on) behind one `folio router`
process per strategy (the real CLI, its config file carrying `loadBalancing`); round robin is the client
sending to the engines in turn, with no router. Two workloads, every request streamed:

- shared prefix: 8 tenants, each with its own system prompt of about 1,000 tokens, 256 short questions
  (tenants in random order), 16 output tokens each;
- low reuse: 256 distinct prompts of about the same length, 16 output tokens each.

Every (strategy, workload) run salts its prompts, so no run finds another's prefixes in the caches.
Reported per run: TTFT p50/p90, output tok/s, the prefix-cache hit rate from the engines' own
`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`, and requests per replica (from
`vllm:request_success_total`), with the ratios against LeastLoaded in the same run (issue 21 targets:
shared prefix TTFT p50 <= 0.5x LeastLoaded's and hit rate >= 80%; low reuse within 1.1x; max/mean
requests per replica <= 1.5).

    .venv/bin/python bench/routing.py [--concurrency 8] [--requests 256] [--hidden 256 --layers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support.models: the tiny random-weight Llama the tests use


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

REPLICAS = 4
STRATEGIES = ("PrefixHash", "LeastLoaded", "RoundRobin")
WORDS = ["policy", "account", "invoice", "refund", "shipping", "warranty", "customer", "order", "support", "billing", "contract", "renewal", "discount", "region", "service", "outage", "priority", "ticket", "escalation", "handbook", "answer", "politely", "cite", "section"]


@dataclass
class Run:
    strategy: str
    workload: str
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int = 0
    seconds: float = 0.0
    hits: float = 0.0
    queries: float = 0.0
    per_replica: list[int] = field(default_factory=list)
    failed: int = 0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def imbalance(self) -> float:
        mean = sum(self.per_replica) / len(self.per_replica)
        return max(self.per_replica) / mean if mean else 0.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def workload(name: str, salt: str, requests: int, system_words: int) -> list[list[dict[str, str]]]:
    rng = random.Random(f"{salt}/{name}")
    if name == "shared prefix":
        systems = [f"[{salt}] You are the assistant of tenant {t}. " + text(rng, system_words) for t in range(8)]
        # Tenants in random order: in a fixed rotation, round robin's i % 4 would pin tenant i % 8 to one replica.
        tenants = [i % 8 for i in range(requests)]
        rng.shuffle(tenants)
        return [
            [{"role": "system", "content": systems[t]}, {"role": "user", "content": f"Question {i}: {text(rng, 8)}?"}]
            for i, t in enumerate(tenants)
        ]
    return [
        [{"role": "system", "content": f"[{salt}] Request {i}. " + text(rng, system_words)},
         {"role": "user", "content": f"Question {i}: {text(rng, 8)}?"}]
        for i in range(requests)
    ]  # fmt: skip


async def engine_counters(session: aiohttp.ClientSession, engines: list[str]) -> list[dict[str, float]]:
    out = []
    for url in engines:
        async with session.get(url + "/metrics") as resp:
            page = await resp.text()
        totals: dict[str, float] = {}
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name in (
                    "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total"
                ):  # fmt: skip
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        out.append(totals)
    return out


async def one(session: aiohttp.ClientSession, url: str, model: str, messages: list[dict[str, str]], run: Run,
              max_tokens: int) -> None:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first: float | None = None
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            run.failed += 1
            if run.failed == 1:
                print(f"    first failure: {resp.status} {(await resp.read())[:300]!r}", flush=True)
            return
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                run.tokens += event["usage"]["completion_tokens"]
                run.prompt_tokens += event["usage"]["prompt_tokens"]
            elif first is None and event["choices"] and event["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
    if first is not None:
        run.ttft.append(first - started)


async def measure(run: Run, targets: list[str], engines: list[str], model: str,
                  conversations: list[list[dict[str, str]]], concurrency: int, max_tokens: int) -> Run:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        before = await engine_counters(session, engines)
        queue = list(enumerate(conversations))
        queue.reverse()
        started = time.perf_counter()

        async def client() -> None:
            while queue:
                i, messages = queue.pop()
                await one(session, targets[i % len(targets)], model, messages, run, max_tokens)

        await asyncio.gather(*(client() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - started
        after = await engine_counters(session, engines)
    for b, a in zip(before, after, strict=True):
        run.hits += a.get("vllm:prefix_cache_hits_total", 0) - b.get("vllm:prefix_cache_hits_total", 0)
        run.queries += a.get("vllm:prefix_cache_queries_total", 0) - b.get("vllm:prefix_cache_queries_total", 0)
        run.per_replica.append(round(a.get("vllm:request_success_total", 0) - b.get("vllm:request_success_total", 0)))
    return run


async def wait_ready(url: str, procs: list[subprocess.Popen[bytes]], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                raise SystemExit(f"a benchmark process exited early: {[p.args for p in procs if p.poll() is not None]}")
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit(f"{url} never became ready")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def main_async(args: argparse.Namespace, model_dir: Path, tmp: Path) -> list[Run]:
    folio = str(Path(sys.executable).with_name("folio"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # four engines share the cores
    ports = [free_port() for _ in range(REPLICAS)]
    engines = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [
        subprocess.Popen(
            [folio, "serve", "--model", str(model_dir), "--port", str(p), "--served-model-name", "m",
             "--device", "cpu", "--dtype", "float32", "--max-model-len", "2048", "--enable-prefix-caching",
             "--kv-cache-memory-gib", str(args.kv_gib), "--max-num-seqs", str(args.concurrency)],
            stdout=(tmp / f"engine-{p}.log").open("wb"), stderr=subprocess.STDOUT, env=env,
        )
        for p in ports
    ]  # fmt: skip
    runs: list[Run] = []
    try:
        for url in engines:
            await wait_ready(url + "/health", procs)
        for strategy in STRATEGIES:
            router: subprocess.Popen[bytes] | None = None
            targets = engines
            if strategy != "RoundRobin":
                config = tmp / f"router-{strategy}.json"
                config.write_text(json.dumps({
                    "traffic": [{"revision": "r1", "weight": 100}], "endpoints": {"r1": engines},
                    "loadBalancing": {"strategy": strategy},
                }))  # fmt: skip
                port = free_port()
                router = subprocess.Popen(
                    [folio, "router", "--name", "bench", "--port", str(port), "--config", str(config),
                     "--log-level", "warning"]
                )  # fmt: skip
                targets = [f"http://127.0.0.1:{port}"]
                await wait_ready(targets[0] + "/ready", [*procs, router])
            try:
                for name in ("shared prefix", "low reuse"):
                    conversations = workload(name, f"{strategy}-{args.seed}", args.requests, args.system_words)
                    run = await measure(Run(strategy, name), targets, engines, "m", conversations,
                                        args.concurrency, args.max_tokens)
                    runs.append(run)
                    print(f"  {strategy:11s} {name:13s} TTFT p50 {pct(run.ttft, 0.5) * 1e3:7.1f} ms  "
                          f"hit {run.hit_rate:5.1%}  per replica {run.per_replica}", flush=True)
            finally:
                if router is not None:
                    stop([router])
    finally:
        stop(procs)
    return runs


def report(runs: list[Run]) -> None:
    base = {r.workload: r for r in runs if r.strategy == "LeastLoaded"}
    prompt = sum(r.prompt_tokens for r in runs) / max(1, sum(len(r.ttft) for r in runs))
    print(f"\nprompt tokens per request (mean): {prompt:.0f}")
    print("| workload | strategy | TTFT p50 | TTFT p90 | p50 vs LeastLoaded | output tok/s | prefix-cache hit rate "
          "| requests per replica | max/mean |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        ratio = pct(r.ttft, 0.5) / pct(base[r.workload].ttft, 0.5)
        print(f"| {r.workload} | {r.strategy} | {pct(r.ttft, 0.5) * 1e3:.0f} ms | {pct(r.ttft, 0.9) * 1e3:.0f} ms "
              f"| {ratio:.2f}x | {r.tok_s:.0f} | {r.hit_rate:.0%} | {'/'.join(map(str, r.per_replica))} "
              f"| {r.imbalance:.2f} |" + (f" ({r.failed} failed)" if r.failed else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=8, help="clients sending at once")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--system-words", type=int, default=140, help="words per system prompt (about 1,000 tokens)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--kv-gib", type=float, default=0.25, help="KV cache per engine")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from tests.support.models import make_tiny_llama

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_dir = make_tiny_llama(
            tmp / "model", hidden_size=args.hidden, intermediate_size=args.hidden * 2, num_hidden_layers=args.layers,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
        )  # fmt: skip
        print(f"{REPLICAS} replicas of a random Llama (hidden {args.hidden}, {args.layers} layers), "
              f"{args.requests} requests per run, {args.concurrency} concurrent clients, {args.max_tokens} tokens out")
        runs = asyncio.run(main_async(args, model_dir, tmp))
    report(runs)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
