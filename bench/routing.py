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

    .venv/bin/python bench/routing.py [--concurrency 8] [--requests 256] [--hidden 256 --layers 4] [--rounds 1]

With `--rounds N` every strategy runs N times, every other round in the opposite order, and the table
pools the rounds (TTFT samples, counters): on a shared machine a slow spell then spreads over the
strategies instead of landing on one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from _procs import free_port, stop, wait_ready  # bench/, this script's own folder
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support.models: the tiny random-weight Llama the tests use


REPLICAS = 4
STRATEGIES = ("PrefixHash", "LeastLoaded", "RoundRobin")
WORKLOADS = ("shared prefix", "low reuse")
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
    preemptions: float = 0.0
    spills: float = 0.0  # the router's folio_router_prefix_affinity_total{result="spill"} over the run
    new: float = 0.0  # ... {result="new"}: keys the router had not placed before (placed by load)
    placed: float = 0.0  # ... every result: requests placed by their affinity key

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
                    "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total",
                    "vllm:num_preemptions_total",
                ):  # fmt: skip
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
        out.append(totals)
    return out


async def affinity_counts(session: aiohttp.ClientSession, router: str | None) -> dict[str, float]:
    """The router's placements by affinity so far, by result (hit, spill); empty without a router."""
    if router is None:
        return {}
    async with session.get(router + "/metrics") as resp:
        page = await resp.text()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "folio_router_prefix_affinity_total":
                result = sample.labels.get("result", "")
                counts[result] = counts.get(result, 0.0) + sample.value
    return counts


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
                  conversations: list[list[dict[str, str]]], concurrency: int, max_tokens: int,
                  router: str | None) -> Run:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        before = await engine_counters(session, engines)
        placed_before = await affinity_counts(session, router)
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
        placed_after = await affinity_counts(session, router)
    for result in placed_after:
        delta = placed_after[result] - placed_before.get(result, 0.0)
        run.placed += delta
        if result == "spill":
            run.spills += delta
        elif result == "new":
            run.new += delta
    for b, a in zip(before, after, strict=True):
        run.hits += a.get("vllm:prefix_cache_hits_total", 0) - b.get("vllm:prefix_cache_hits_total", 0)
        run.queries += a.get("vllm:prefix_cache_queries_total", 0) - b.get("vllm:prefix_cache_queries_total", 0)
        run.preemptions += a.get("vllm:num_preemptions_total", 0) - b.get("vllm:num_preemptions_total", 0)
        run.per_replica.append(round(a.get("vllm:request_success_total", 0) - b.get("vllm:request_success_total", 0)))
    return run


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
        async with aiohttp.ClientSession() as session:
            for url in engines:
                await wait_ready(session, url + "/health", procs, timeout=300, poll=0.2)
        for round_, strategy in schedule(args.strategies, args.rounds):
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
                async with aiohttp.ClientSession() as session:
                    await wait_ready(session, targets[0] + "/ready", [*procs, router], timeout=300, poll=0.2)
            try:
                for name in args.workloads:
                    salt = f"{strategy}-{args.seed}" + (f"-{round_}" if round_ else "")
                    conversations = workload(name, salt, args.requests, args.system_words)
                    run = await measure(Run(strategy, name), targets, engines, "m", conversations,
                                        args.concurrency, args.max_tokens, router and targets[0])
                    runs.append(run)
                    print(f"  {round_ + 1}/{args.rounds} {strategy:11s} {name:13s} TTFT p50 {pct(run.ttft, 0.5) * 1e3:7.1f} ms  "
                          f"hit {run.hit_rate:5.1%}  per replica {run.per_replica}  new/spilled/placed "
                          f"{run.new:.0f}/{run.spills:.0f}/{run.placed:.0f}  preemptions {run.preemptions:.0f}", flush=True)
            finally:
                if router is not None:
                    stop([router])
    finally:
        stop(procs)
    return runs


def schedule(strategies: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, strategy) in the order they run: every other round backwards, so that a slow spell of a
    shared machine does not always fall on the same strategy."""
    return [(r, s) for r in range(rounds) for s in (strategies if r % 2 == 0 else strategies[::-1])]


def pooled(runs: list[Run]) -> list[Run]:
    """One run per (strategy, workload): the rounds' samples and counters together."""
    out: dict[tuple[str, str], Run] = {}
    for r in runs:
        into = out.setdefault((r.strategy, r.workload), Run(r.strategy, r.workload, per_replica=[0] * len(r.per_replica)))
        into.ttft += r.ttft
        into.per_replica = [a + b for a, b in zip(into.per_replica, r.per_replica, strict=True)]
        for name in ("tokens", "prompt_tokens", "seconds", "hits", "queries", "failed", "preemptions", "spills", "new",
                     "placed"):
            setattr(into, name, getattr(into, name) + getattr(r, name))
    order = {s: i for i, s in enumerate(STRATEGIES)}
    return sorted(out.values(), key=lambda r: (WORKLOADS.index(r.workload), order[r.strategy]))


def report(runs: list[Run]) -> None:
    runs = pooled(runs)
    base = {r.workload: r for r in runs if r.strategy == "LeastLoaded"}
    prompt = sum(r.prompt_tokens for r in runs) / max(1, sum(len(r.ttft) for r in runs))
    print(f"\nprompt tokens per request (mean): {prompt:.0f}")
    print("| workload | strategy | TTFT p50 | TTFT p90 | p50 vs LeastLoaded | output tok/s | prefix-cache hit rate "
          "| requests per replica | max/mean | new / spilled |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        ratio = f"{pct(r.ttft, 0.5) / pct(base[r.workload].ttft, 0.5):.2f}x" if r.workload in base else "-"
        spilled = f"{r.new:.0f} / {r.spills:.0f}" if r.placed else "-"
        print(f"| {r.workload} | {r.strategy} | {pct(r.ttft, 0.5) * 1e3:.0f} ms | {pct(r.ttft, 0.9) * 1e3:.0f} ms "
              f"| {ratio} | {r.tok_s:.0f} | {r.hit_rate:.1%} | {'/'.join(map(str, r.per_replica))} "
              f"| {r.imbalance:.2f} | {spilled} |" + (f" ({r.failed} failed)" if r.failed else ""))


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
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES),
                        help="LeastLoaded is the baseline of the ratios: leave it out only for a quick look")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every strategy this many times (fresh salts, alternating order) and pool the rounds")
    args = parser.parse_args()
    from tests.support.models import make_tiny_llama

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_dir = make_tiny_llama(
            tmp / "model", hidden_size=args.hidden, intermediate_size=args.hidden * 2, num_hidden_layers=args.layers,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
        )  # fmt: skip
        print(f"{REPLICAS} replicas of a random Llama (hidden {args.hidden}, {args.layers} layers), {args.rounds} round(s), "
              f"{args.requests} requests per run, {args.concurrency} concurrent clients, {args.max_tokens} tokens out")
        runs = asyncio.run(main_async(args, model_dir, tmp))
    report(runs)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
