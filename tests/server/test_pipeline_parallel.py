"""`folio serve` as two nodes of one replica (pipeline parallel 2 over a leader and a `--headless` node, wired
by LeaderWorkerSet's environment on loopback): it answers as one process does, and a node that dies takes
the leader down (exit non-zero within 30 s, the reason logged) instead of serving half a model."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from folio.operator.parity.run import run_gate
from folio.operator.parity.suite import SuitePrompt, default_suite
from folio.operator.spec import ParityReport, ParitySpec
from tests.server.conftest import Serve, start_serve, stop_serve
from tests.support.ports import master_port

DOWN_WITHIN_S = 30
ARGS = ("--kv-cache-memory-gib", "0.02", "--dtype", "float32", "--max-model-len", "256")


def _headless(folio_bin: str, model: Path, log: Path, *flags: str, group_size: str = "2") -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_WORKER_INDEX": "1",
           "LWS_GROUP_SIZE": group_size}  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen([folio_bin, "serve", "--model", str(model), *ARGS, *flags, "--headless"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)  # fmt: skip


@pytest.fixture
def group(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> Iterator[tuple[Serve, subprocess.Popen[bytes]]]:
    flags = ("--pipeline-parallel-size", "2", "--nnodes", "2", "--master-port", str(master_port()))
    node1 = _headless(folio_bin, tiny_llama, tmp_path / "node1.log", *flags)
    try:
        leader = start_serve(folio_bin, tiny_llama, tmp_path, *ARGS, *flags)
    except BaseException:
        node1.kill()
        raise
    try:
        yield leader, node1
    finally:
        stop_serve(leader)
        if node1.poll() is None:
            node1.kill()
        node1.wait()


def _complete(url: str) -> dict:
    body = {"model": "m", "prompt": "Paris is", "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 2}
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]


def test_a_two_node_replica_answers_as_one_process_and_stops_together(folio_bin: str, tiny_llama: Path,
                                                                      tmp_path: Path, group) -> None:  # fmt: skip
    leader, node1 = group
    one = start_serve(folio_bin, tiny_llama, tmp_path, *ARGS)
    try:
        alone = _complete(one.url)
        report = asyncio.run(_parity(stable_url=one.url, canary_url=leader.url))
    finally:
        stop_serve(one)
    # the parity gate (the operator's, as it runs before a canary's first step) against such a revision
    assert report.verdict == "Pass", report
    assert report.mean_cosine is not None and report.mean_cosine > 0.99999 and report.token_match == 1.0
    split = _complete(leader.url)
    assert split["text"] == alone["text"]
    assert split["logprobs"]["tokens"] == alone["logprobs"]["tokens"]
    metrics = httpx.get(f"{leader.url}/metrics", timeout=5).text
    assert 'folio_engine_collective_seconds_count{model_name="m",op="send"}' in metrics
    stop_serve(leader)
    assert node1.wait(DOWN_WITHIN_S) == 0, "rank 0 stopped the group: the node exits cleanly"


async def _parity(stable_url: str, canary_url: str) -> ParityReport:
    spec = ParitySpec(prompts=24, max_tokens=8)

    async def load() -> list[SuitePrompt]:
        return default_suite(spec.prompts)

    async with httpx.AsyncClient() as client:
        return await run_gate(client, stable_url=stable_url, canary_url=canary_url, load_suite=load, spec=spec,
                              revision="pp2", stable_revision="one", now=lambda: "2026-12-07T00:00:00Z")  # fmt: skip


def test_a_dead_node_takes_the_leader_down(group, tmp_path: Path) -> None:
    leader, node1 = group
    _complete(leader.url)
    rank = next(c for c in psutil.Process(node1.pid).children() if "resource_tracker" not in " ".join(c.cmdline()))
    rank.kill()  # the node's rank crashes: its node exits 1 (LWS recreates the group), the leader goes down
    killed = time.monotonic()
    assert node1.wait(DOWN_WITHIN_S) == 1
    code = leader.proc.wait(DOWN_WITHIN_S)
    assert time.monotonic() - killed < DOWN_WITHIN_S and code != 0
    assert "rank 1 on node 1 closed its connection" in leader.output()
    assert "exited with code -9; taking this node's ranks down" in (tmp_path / "node1.log").read_text()


def test_a_group_of_another_size_is_refused(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    node = _headless(folio_bin, tiny_llama, tmp_path / "node.log", "--pipeline-parallel-size", "2", "--nnodes", "2",
                     group_size="3")  # fmt: skip
    assert node.wait(60) == 2
    assert "--nnodes is 2 but this pod's LeaderWorkerSet group has 3 pods (LWS_GROUP_SIZE)" in (
        tmp_path / "node.log").read_text()


def test_headless_is_refused_on_node_rank_0(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        code = subprocess.run([folio_bin, "serve", "--model", str(tiny_llama), "--headless"], stdout=out,
                              stderr=subprocess.STDOUT, timeout=60).returncode  # fmt: skip
    assert code == 2 and "--headless is for node ranks above 0" in log.read_text()
