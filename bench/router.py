"""Router overhead: added latency vs talking to the upstream directly, max req/s, streaming TTFT.

One `folio router` process (the real CLI, config file) in front of one fake engine that answers at
once (aiohttp, its own process, listening on four loopback addresses so that the router balances four
replicas); the load generator is this process. Every figure is measured
against the same upstream reached directly, in the same run (issue 7 targets: added p50 <= 1 ms
and p99 <= 5 ms at 200 req/s; >= 1,000 req/s through one router process; issue 21: the same with
PrefixHash on, and >= 2,000 req/s).

    .venv/bin/python bench/router.py [--rate 200] [--seconds 5] [--concurrency 32]
        [--strategy PrefixHash|LeastLoaded] [--client aiohttp|httpx] [--new-connections] [--body-bytes N]
        [--migration-only | --access-only]

The last three change only the paced latency phase's client, to tell apart what an independent client
measures: another HTTP client library (httpx, pure Python), a new TCP connection per request instead of
reused ones, and a request body of realistic size (the router parses every body as JSON and, with
PrefixHash, reads its affinity key).

The last phase (alone with `--migration-only`) prices answer migration (issue 50) when nothing fails:
two `folio router` processes, one with ``migration.maxAttempts`` 0 and one with the default, in front of
one fake engine (its own process) that writes a ``folio-resume`` record before every event when asked (as
the engine does), relaying streamed completions of `--stream-tokens` events, the two in turn; it prints the
time per request, each router's own CPU per request, and the ratios. The phase after it (alone with
`--access-only`) prices `spec.access` (issue 43: auth and quota at most 50 us a request) the same way: a router
without it and one whose requests carry one key of 100 tenants', one with every quota, in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil
from _procs import free_port, stop, wait_ready  # bench/, this script's own folder

COMPLETION = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 8}).encode()
STREAM = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 8, "stream": True}).encode()
HEADERS = {"Content-Type": "application/json"}
LOOPBACKS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")  # one fake engine, four replica addresses


# ------------------------------------------------------------------------------ fake upstream


def run_upstream(port: int) -> None:
    from aiohttp import web

    answer = json.dumps({  # as an engine answers: its usage last
        "id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "hi"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }).encode()  # fmt: skip

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream": true' not in body:
            return web.Response(body=answer, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(4):  # first token at once, the rest 2 ms apart, like a fast decode
            await resp.write(b'data: {"choices": [{"text": "t%d"}]}\n\n' % i)
            await asyncio.sleep(0.002)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    # Listening on several loopback addresses: the router sees that many replicas (and PrefixHash its ring).
    serve_completions(complete, list(LOOPBACKS), port)


def serve_completions(complete: Callable[[Any], Awaitable[Any]], hosts: list[str], port: int) -> None:
    """A fake engine's app: ``complete`` answers /v1/completions, /health says ok."""
    from aiohttp import web

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/health", health)
    web.run_app(app, host=hosts, port=port, access_log=None, print=None)


# ------------------------------------------------------------------------------- measuring


async def one(session: aiohttp.ClientSession | httpx.AsyncClient, url: str) -> float:
    started = time.perf_counter()
    if isinstance(session, httpx.AsyncClient):
        resp_x = await session.post(url, content=COMPLETION, headers=HEADERS)
        if resp_x.status_code != 200:
            raise RuntimeError(f"{url} answered {resp_x.status_code}")
        return time.perf_counter() - started
    async with session.post(url, data=COMPLETION, headers=HEADERS) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}")
    return time.perf_counter() - started


async def paced(
    session: aiohttp.ClientSession | httpx.AsyncClient, urls: list[str], rate: float, seconds: float
) -> list[list[float]]:
    """Open loop at `rate` req/s per URL, whatever earlier requests are doing. The URLs take turns
    (request i goes to each in a row, spread over the interval), so that bursts of noise from a
    shared machine fall on all of them alike."""
    tasks: list[list[asyncio.Task[float]]] = [[] for _ in urls]
    start = time.perf_counter()
    step = 1.0 / (rate * len(urls))
    for i in range(int(rate * seconds) * len(urls)):
        delay = start + i * step - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        LATE.append(max(0.0, -delay))
        tasks[i % len(urls)].append(asyncio.create_task(one(session, urls[i % len(urls)])))
    return [list(await asyncio.gather(*column)) for column in tasks]


LATE: list[float] = []  # how far behind schedule the paced requests started: a busy-machine gauge


async def closed_loop(session: aiohttp.ClientSession, url: str, concurrency: int, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await one(session, url)
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - start)


async def ttft(session: aiohttp.ClientSession, url: str) -> float:
    """Seconds from sending a streaming request to its first chunk."""
    started = time.perf_counter()
    async with session.post(url, data=STREAM, headers=HEADERS) as resp:
        await resp.content.readany()
        first = time.perf_counter() - started
        await resp.read()
    return first


def cpu_seconds(pid: int) -> float:
    """The process's CPU time: from the scheduler's nanosecond counts of its threads where Linux has them
    (`/proc/PID/task/*/schedstat`), else at the 10 ms ticks of `cpu_times` (too coarse for a block of 50
    requests: ±200 µs a request)."""
    tasks = Path(f"/proc/{pid}/task")
    if tasks.is_dir():
        total = 0
        for task in tasks.iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
                continue
        return total / 1e9
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:7.3f} ms"


async def measure(args: argparse.Namespace, direct: str, routed: str) -> int:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        procs = args.procs
        await wait_ready(session, direct + "/health", procs)
        await wait_ready(session, routed + "/ready", procs)
        urls = [direct + "/v1/completions", routed + "/v1/completions"]
        async with latency_client(args) as client:
            await paced(client, urls, args.rate, 1.0)  # warm both paths up
            cpu_before = cpu_seconds(args.router_pid)
            LATE.clear()
            base, via = await paced(client, urls, args.rate, args.seconds)
            router_cpu = cpu_seconds(args.router_pid) - cpu_before
        print(f"strategy {args.strategy}; latency client {args.client}, "
              f"{'a new connection per request' if args.new_connections else 'reused connections'}, "
              f"{len(COMPLETION)}-byte bodies")
        late = pct(LATE, 0.99)
        print(f"latency at {args.rate:.0f} req/s, {len(via)} requests each:")
        print(f"  direct        p50 {ms(pct(base, 0.5))}   p99 {ms(pct(base, 0.99))}")
        print(f"  via router    p50 {ms(pct(via, 0.5))}   p99 {ms(pct(via, 0.99))}")
        added50, added99 = pct(via, 0.5) - pct(base, 0.5), pct(via, 0.99) - pct(base, 0.99)
        print(f"  added         p50 {ms(added50)}   p99 {ms(added99)}   (targets 1 ms, 5 ms)")
        # CPU time is what the router itself spends on a request; on a busy machine the
        # wall-clock figures also include waiting for a free core.
        print(f"  router CPU per request {router_cpu / len(via) * 1e6:6.0f} us")
        if late > 0.001:
            print(f"  (this machine is busy: the load generator ran up to {ms(late)} behind schedule at p99)")
        print(
            f"  ratio via/direct: p50 {pct(via, 0.5) / pct(base, 0.5):.2f}x  p99 {pct(via, 0.99) / pct(base, 0.99):.2f}x"
        )
        if args.latency_only:
            return 0

        rps_direct = await closed_loop(session, direct + "/v1/completions", args.concurrency, args.seconds)
        cpu_before = cpu_seconds(args.router_pid)
        rps_router = await closed_loop(session, routed + "/v1/completions", args.concurrency, args.seconds)
        busy = (cpu_seconds(args.router_pid) - cpu_before) / args.seconds  # cores the router kept busy
        print(f"max sustained, {args.concurrency} concurrent clients, {args.seconds:.0f} s each:")
        print(f"  direct     {rps_direct:8.0f} req/s")
        print(f"  via router {rps_router:8.0f} req/s   (target 1000)   ratio {rps_router / rps_direct:.2f}x")
        # The load generator and the upstream share this machine's cores with the router: what
        # one router core sustains is the rate divided by the share of a core it actually got.
        print(f"  router busy {busy:4.2f} cores -> {rps_router / max(busy, 1e-9):8.0f} req/s per router core")

        t_base, t_via = [], []
        for _ in range(args.ttft_samples):  # one each in turn, for the same reason as above
            t_base.append(await ttft(session, direct + "/v1/completions"))
            t_via.append(await ttft(session, routed + "/v1/completions"))
        print(f"streaming time to first chunk, {args.ttft_samples} sequential requests each:")
        print(f"  direct     p50 {ms(pct(t_base, 0.5))}   p99 {ms(pct(t_base, 0.99))}")
        print(f"  via router p50 {ms(pct(t_via, 0.5))}   p99 {ms(pct(t_via, 0.99))}")
        print(
            f"  added      p50 {ms(pct(t_via, 0.5) - pct(t_base, 0.5))}   p99 {ms(pct(t_via, 0.99) - pct(t_base, 0.99))}"
        )
    return 0


# ------------------------------------------------------------------- migration off vs on (issue 50)


def run_stream_upstream(port: int, tokens: int) -> None:
    """A fake engine that streams ``tokens`` completion events back to back, each with its ``folio-resume``
    record when the request asks for them (as `folio serve` does): the events are written out once, so its
    own cost is the same either way and, in its own process, not the router's."""
    from aiohttp import web

    from folio.engine.server.continuation import CREATED_HEADER, RESPONSE_ID_HEADER, RESUMABLE_HEADER, Record

    plain: list[bytes] = []
    recorded: list[bytes] = []
    for i in range(tokens):
        finish = b'"length"' if i == tokens - 1 else b"null"
        data = (b'data: {"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"m",'
                b'"choices":[{"index":0,"text":" tok%d","logprobs":null,"finish_reason":%s}]}\n\n' % (i, finish))
        plain.append(data)
        line = Record(index=0, token_ids=(1000 + i,), finish_reason="length" if i == tokens - 1 else None).line()
        recorded.append(line.encode() + data)

    async def complete(request: web.Request) -> web.StreamResponse:
        await request.read()
        resumable = request.headers.get(RESUMABLE_HEADER) == "1"
        headers = {"Content-Type": "text/event-stream"}
        if resumable:
            headers |= {RESUMABLE_HEADER: "1", RESPONSE_ID_HEADER: "cmpl-1", CREATED_HEADER: "1700000000"}
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        for event in recorded if resumable else plain:
            await resp.write(event)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    serve_completions(complete, ["127.0.0.1"], port)


async def two_routers(args: argparse.Namespace, upstream: list[str], up_port: int, configs: dict[str, dict[str, Any]],
                      body: bytes, check: Callable[[bytes], bool], router_args: tuple[str, ...] = (),
                      headers: dict[str, str] | None = None) -> dict[str, tuple[list[float], list[float]]]:  # fmt: skip
    """Requests of ``body`` through two `folio router` processes (``configs``' two, in front of one fake engine
    started as ``upstream``, each its own process), in short blocks in turn so that noise falls on both alike:
    each one's times per request and its own CPU per request of each block."""
    folio = str(Path(sys.executable).with_name("folio"))
    ports = {name: free_port() for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen(upstream)]
        for name, extra in configs.items():
            config = Path(tmp) / f"{name}.json"
            config.write_text(json.dumps({"traffic": [{"revision": "r1", "weight": 100}], "stable": "r1",
                                          "endpoints": {"r1": [f"http://127.0.0.1:{up_port}"]}, **extra}))  # fmt: skip
            procs.append(subprocess.Popen([folio, "router", "--name", "bench", "--port", str(ports[name]),
                                           "--config", str(config), "--log-level", "warning", *router_args]))  # fmt: skip
        routers = {name: psutil.Process(proc.pid) for name, proc in zip(configs, procs[1:], strict=True)}
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}

        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                for url in urls.values():
                    await wait_ready(session, url + "/ready", procs)

                async def one(url: str) -> float:
                    started = time.perf_counter()
                    async with session.post(url + "/v1/completions", data=body, headers={**HEADERS, **(headers or {})}) as resp:
                        received = await resp.read()
                    if resp.status != 200 or not check(received):
                        raise RuntimeError(f"{url} answered {resp.status}: {received[:200]!r}")
                    return time.perf_counter() - started

                async def block(name: str, n: int) -> tuple[list[float], float]:
                    before = cpu_seconds(routers[name].pid)
                    times = [await one(urls[name]) for _ in range(n)]
                    return times, (cpu_seconds(routers[name].pid) - before) / n

                for name in urls:  # warm both up
                    await block(name, 50)
                results: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in configs}
                for _ in range(args.migration_rounds):
                    for name in configs:
                        times, cpu = await block(name, 50)
                        results[name][0].extend(times)
                        results[name][1].append(cpu)
        finally:
            stop(procs, timeout=15)
    return results


def report_pair(title: str, results: dict[str, tuple[list[float], list[float]]]) -> None:
    (off, (off_t, off_c)), (on, (on_t, on_c)) = results.items()
    print(title)
    for name, (times, cpus) in results.items():
        print(f"  {name:14s}  p50 {ms(pct(times, 0.5))}   p99 {ms(pct(times, 0.99))}   "
              f"router CPU per request {sum(cpus) / len(cpus) * 1e6:6.0f} us")
    print(f"  {on} - {off}: p50 {(pct(on_t, 0.5) - pct(off_t, 0.5)) * 1e6:+.0f} us, router CPU per request "
          f"{(sum(on_c) - sum(off_c)) / len(on_c) * 1e6:+.0f} us; ratio p50 {pct(on_t, 0.5) / pct(off_t, 0.5):.2f}x "
          f"p99 {pct(on_t, 0.99) / pct(off_t, 0.99):.2f}x router CPU {sum(on_c) / sum(off_c):.2f}x")


async def migration_overhead(args: argparse.Namespace) -> None:
    """Streamed completions through two routers, migration off (``maxAttempts: 0``) and on (the default)."""
    up_port = free_port()
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": args.stream_tokens, "stream": True}).encode()
    results = await two_routers(
        args, [sys.executable, __file__, "--stream-upstream", str(up_port), "--stream-tokens", str(args.stream_tokens)],
        up_port, {"migration off": {"migration": {"maxAttempts": 0}}, "migration on": {"migration": {"maxAttempts": 3}}},
        body, lambda received: received.endswith(b"data: [DONE]\n\n") and b"folio-resume" not in received,
    )  # fmt: skip
    report_pair(f"migration off vs on: streamed completions of {args.stream_tokens} events, "
                f"{len(results['migration off'][0])} requests each (router, fake engine, client: three processes)",
                results)  # fmt: skip


async def access_overhead(args: argparse.Namespace) -> None:
    """Completions through two routers, without spec.access and with it (a key looked up among 100 tenants'
    and a tenant with every quota): the price of identifying, metering and admitting a request (issue 43
    target: <= 50 us p50)."""
    up_port = free_port()
    with tempfile.TemporaryDirectory() as secrets:
        folder = Path(secrets) / "llm-keys"
        folder.mkdir()
        for i in range(100):
            (folder / f"tenant-{i}").write_text(f"sk-{i}-{'x' * 40}\n")
        limits = {"requestsPerMinute": 10**8, "tokensPerMinute": 10**10, "maxInFlight": 10**5}
        access = {"apiKeysSecret": "llm-keys", "tenants": [{"name": "tenant-7", "priority": "Critical", **limits}]}
        results = await two_routers(
            args, [sys.executable, __file__, "--upstream", str(up_port)], up_port,
            {"no access": {}, "access": {"access": access}}, COMPLETION, lambda received: b'"choices"' in received,
            router_args=("--secrets-dir", secrets), headers={"Authorization": f"Bearer sk-7-{'x' * 40}"},
        )  # fmt: skip
    report_pair(f"spec.access off vs on: completions, {len(results['access'][0])} requests each "
                "(router, fake engine, client: three processes)", results)
    (off_t, off_c), (on_t, on_c) = results.values()
    # Each round's two blocks ran back to back, one through each router: the median of the rounds' own
    # differences (of their p50s, of their CPU) is what access adds, a busy moment of the machine (which
    # lands on one block) left out.
    n = len(on_t) // len(on_c)
    added = statistics.median(pct(on_t[i:i + n], 0.5) - pct(off_t[i:i + n], 0.5) for i in range(0, len(on_t), n)) * 1e6
    cpu = statistics.median(on - off for on, off in zip(on_c, off_c, strict=True)) * 1e6
    print(f"  auth + quota, median of {len(on_c)} paired rounds: p50 {added:+.0f} us (target <= 50 us): "
          f"{'met' if added <= 50 else 'NOT met'}; router CPU {cpu:+.0f} us a request")


def latency_client(args: argparse.Namespace) -> aiohttp.ClientSession | httpx.AsyncClient:
    if args.client == "httpx":
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0 if args.new_connections else None)
        return httpx.AsyncClient(limits=limits, timeout=30.0)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=args.new_connections))


def main() -> int:
    global COMPLETION
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="paced request rate for the latency phase")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each measured phase")
    parser.add_argument("--concurrency", type=int, default=32, help="clients in the max-throughput phase")
    parser.add_argument("--ttft-samples", type=int, default=200)
    parser.add_argument("--strategy", default="PrefixHash", choices=["PrefixHash", "LeastLoaded"])
    parser.add_argument("--client", default="aiohttp", choices=["aiohttp", "httpx"], help="latency phase's client")
    parser.add_argument("--new-connections", action="store_true", help="latency phase: no keep-alive")
    parser.add_argument("--body-bytes", type=int, default=0, help="pad the latency phase's prompt to this size")
    parser.add_argument("--latency-only", action="store_true", help="skip the throughput and streaming phases")
    parser.add_argument("--migration-only", action="store_true", help="only the migration off-vs-on phase")
    parser.add_argument("--access-only", action="store_true", help="only the spec.access off-vs-on phase")
    parser.add_argument("--stream-tokens", type=int, default=64, help="migration phase: events per stream")
    parser.add_argument("--migration-rounds", type=int, default=20,
                        help="migration and access phases: 50-request blocks each")  # fmt: skip
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)  # internal: be the fake engine
    parser.add_argument("--stream-upstream", type=int, help=argparse.SUPPRESS)  # internal: the streaming one
    args = parser.parse_args()
    if args.stream_upstream:
        run_stream_upstream(args.stream_upstream, args.stream_tokens)
        return 0
    if args.migration_only:
        asyncio.run(migration_overhead(args))
        return 0
    if args.access_only:
        asyncio.run(access_overhead(args))
        return 0
    if args.body_bytes:
        base = len(COMPLETION) - len("hello")
        words = ("Summarize the attached support ticket and cite the policy section. " * 200)[: max(0, args.body_bytes - base)]
        COMPLETION = json.dumps({"model": "m", "prompt": words or "hello", "max_tokens": 8}).encode()
    if args.upstream:
        run_upstream(args.upstream)
        return 0

    up_port, router_port = free_port(), free_port()
    direct = f"http://127.0.0.1:{up_port}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "router.json"
        config.write_text(
            json.dumps({"traffic": [{"revision": "r1", "weight": 100}], "endpoints": {"r1": [f"http://{h}:{up_port}" for h in LOOPBACKS]},
                        "loadBalancing": {"strategy": args.strategy}})
        )
        folio = str(Path(sys.executable).with_name("folio"))
        args.procs = [
            subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port)]),
            subprocess.Popen(
                [
                    folio,
                    "router",
                    "--name",
                    "bench",
                    "--port",
                    str(router_port),
                    "--config",
                    str(config),
                    "--log-level",
                    "warning",
                ],
            ),
        ]
        args.router_pid = args.procs[1].pid
        try:
            code = asyncio.run(measure(args, direct, f"http://127.0.0.1:{router_port}"))
        finally:
            stop(args.procs, timeout=15)
    if not args.latency_only:
        asyncio.run(migration_overhead(args))
        asyncio.run(access_overhead(args))
    return code


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
