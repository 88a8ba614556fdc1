"""Streams that survive a replica's death, for real: `folio up` with SmolLM2 and two replicas.

An engine killed (SIGKILL), silenced (SIGSTOP), crashing (an injected fault) or scaled away under
streaming requests: every answer finishes, and under greedy decoding it is the answer an uninterrupted
run gives, token for token, with its usage and logprobs whole. With migration off the client gets the
old behaviour, but a clean error event instead of a cut.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from folio.engine.digest import compute_digest
from folio.operator import metric_names as m
from folio.operator.local.supervisor import free_port
from folio.operator.testing.load import LoadGenerator
from folio.operator.testing.up import UpProcess, write_manifest
from tests.local.test_e2e import FAST_ROLLOUT, revision_of
from tests.local.test_incidents import router_metric
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

NAME = "smol"
MAX_TOKENS = 40
PROMPTS = ("The history of the printing press", "Ten facts about the ocean:", "A recipe for bread:")
CHAT = ("Tell me about the moon.", "Describe a forest in autumn.")
# A stall is noticed this fast: the SIGSTOP test waits for it. (A continuation's first token, after its
# prefill on the surviving replica, must come sooner: on 2 loaded cores that silence neared 2 s.)
INTER_CHUNK_TIMEOUT_S = 3.0
ROUTER = {
    "migration": {"maxAttempts": 3, "interChunkTimeout": f"{INTER_CHUNK_TIMEOUT_S:g}s"},
    # A dead replica is ejected at its first failure, so that continuations go to the live one at once.
    "outlierDetection": {"consecutiveErrors": 1, "baseEjectionTime": "2s"},
}
# A new revision replaces the old at once (no steps) unless a test walks a canary.
AT_ONCE = {**FAST_ROLLOUT, "steps": []}


# ------------------------------------------------------------------------------------------ clients


@dataclass
class Stream:
    """One streamed request as a client sees it: its events, when each arrived, and how it ended."""

    path: str
    body: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    done: bool = False
    error: str | None = None
    started: threading.Event = field(default_factory=threading.Event)

    @property
    def chat(self) -> bool:
        return self.path.endswith("/chat/completions")

    def text(self, index: int = 0) -> str:
        parts = []
        for e in self.events:
            for c in e.get("choices", []):
                if c["index"] == index:
                    parts.append((c.get("delta") or {}).get("content") or "" if self.chat else c.get("text", ""))
        return "".join(parts)

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if "error" in e]

    @property
    def usage(self) -> dict[str, Any] | None:
        return next((e["usage"] for e in self.events if e.get("usage")), None)

    def logprob_tokens(self) -> list[str]:
        tokens: list[str] = []
        for e in self.events:
            for c in e.get("choices", []):
                lp = c.get("logprobs")
                if lp:
                    tokens += [t["token"] for t in lp["content"]] if self.chat else lp["tokens"]
        return tokens

    def largest_gap(self) -> float:
        return max((b - a for a, b in zip(self.times, self.times[1:], strict=False)), default=0.0)

    def run(self, base_url: str) -> None:
        try:
            with httpx.stream("POST", base_url + self.path, json=self.body, timeout=120) as resp:
                if resp.status_code != 200:
                    self.error = f"HTTP {resp.status_code}: {resp.read().decode()[:300]}"
                    return
                for line in resp.iter_lines():
                    if not line.startswith("data: "):
                        assert not line.startswith(":"), f"a record reached the client: {line}"
                        continue
                    self.times.append(time.monotonic())
                    data = line.removeprefix("data: ")
                    if data == "[DONE]":
                        self.done = True
                        continue
                    self.events.append(json.loads(data))
                    self.started.set()
        except httpx.HTTPError as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.started.set()


def completion(prompt: str, **extra: Any) -> Stream:
    body = {"model": NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, **extra}  # fmt: skip
    return Stream("/v1/completions", body)


def chat(message: str, **extra: Any) -> Stream:
    body = {"model": NAME, "messages": [{"role": "user", "content": message}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            **extra}  # fmt: skip
    return Stream("/v1/chat/completions", body)


def reference(base_url: str, stream: Stream) -> dict[str, Any]:
    """The uninterrupted answer to ``stream``'s request: the same body, not streamed."""
    body = {k: v for k, v in stream.body.items() if k not in ("stream", "stream_options")}
    resp = httpx.post(base_url + stream.path, json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def references(smol: Smol, streams: list[Stream]) -> list[dict[str, Any]]:
    """`reference` for each of ``streams``, asked all at once (the engine batches them, as it batches the
    streams themselves). A greedy answer of one revision is the same each time it is asked, so a request
    already answered by the stable revision earlier in this module is not asked again."""
    stable = smol.up.status()["status"]["stableRevision"] if smol.up is not None else ""
    keys = [json.dumps([stable, s.path, s.body], sort_keys=True) for s in streams]
    asked = {key: s for key, s in zip(keys, streams, strict=True) if key not in smol.answers}
    if asked:
        with ThreadPoolExecutor(len(asked)) as pool:
            answers = pool.map(lambda s: reference(smol.url, s), asked.values())
            smol.answers.update(zip(asked, answers, strict=True))
    return [smol.answers[key] for key in keys]


def reference_text(answer: dict[str, Any], index: int = 0) -> str:
    choice = answer["choices"][index]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def run_all(base_url: str, streams: list[Stream]) -> list[threading.Thread]:
    threads = [threading.Thread(target=s.run, args=(base_url,), daemon=True) for s in streams]
    for t in threads:
        t.start()
    return threads


def join(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(timeout=180)
        assert not t.is_alive(), "a stream never ended"


def mid_stream(streams: list[Stream], chunks: int) -> bool:
    return all(len(s.events) >= chunks for s in streams)


@contextlib.contextmanager
def under_way(base_url: str, streams: list[Stream]) -> Iterator[None]:
    """Starts the streams; the body runs once every one is under way, and they all end before it is left."""
    threads = run_all(base_url, streams)
    wait_for(lambda: mid_stream(streams, 4), 60, "every stream under way")
    yield
    join(threads)


# ------------------------------------------------------------------------------------------ the service


class Smol:
    """`folio up` of SmolLM2 with two replicas, shared by this module's tests (each sets what it needs)."""

    def __init__(self, root: Path, model: Path) -> None:
        self.root, self.model, self.digest = root, model, compute_digest(model)
        self.up: UpProcess | None = None
        self.answers: dict[str, dict[str, Any]] = {}  # `references`' uninterrupted answers

    def manifest(self, tag: str, args: dict[str, Any] | None = None, *, replicas: int = 2,
                 router: dict[str, Any] | None = None, rollout: dict[str, Any] | None = None) -> Path:  # fmt: skip
        return write_manifest(
            self.root / f"{tag}.yaml", name=NAME, model=self.model, digest=self.digest, replicas=replicas,
            args={"device": "cpu", "maxNumSeqs": 8, "maxModelLen": 512, "shutdownTimeout": 1, **(args or {})},
            router=router or ROUTER, rollout=rollout or AT_ONCE,
        )  # fmt: skip

    @property
    def url(self) -> str:
        assert self.up is not None
        return self.up.router_url

    def apply(self, manifest: Path) -> None:
        assert self.up is not None
        self.up.client.apply(yaml.safe_load(manifest.read_text()))

    def steady(self, manifest: Path, replicas: int = 2) -> dict[str, Any]:
        """``manifest`` applied and serving on ``replicas`` ready replicas; the status snapshot."""
        assert self.up is not None
        self.apply(manifest)
        rev = revision_of(manifest)

        def settled(s: dict[str, Any]) -> bool:
            procs = s["processes"].get(rev, {})
            return (s["status"].get("stableRevision") == rev and not s["status"].get("canaryRevision")
                    and procs.get("ready") == replicas and procs.get("replicas") == replicas
                    and len(s["processes"]) == 2)  # fmt: skip

        snap = self.up.wait_for(settled, 180, f"{replicas} ready replicas of {rev}")
        wait_for(lambda: self.in_rotation(rev) == replicas, 30, f"the router sending to {replicas} replicas", 0.1)
        return snap

    def in_rotation(self, rev: str) -> int:
        """The replicas of ``rev`` the router sends to now (a restarted one is readmitted by a health check)."""
        resp = httpx.get(f"{self.url}/ready", timeout=5)
        return int(resp.json().get("replicas", {}).get(rev, 0)) if resp.status_code == 200 else 0


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Smol]:
    root = tmp_path_factory.mktemp("migration")
    svc = Smol(root, smollm2_dir)
    base = svc.manifest("base")
    svc.up = UpProcess(base, port=free_port(), state_dir=root / ".folio", log=root / "up.log")
    try:
        yield svc
    finally:
        if svc.up.proc.poll() is None:
            svc.up.stop(sig=signal.SIGTERM)


def migrations(smol: Smol, **labels: str) -> float:
    return router_metric(smol.url, m.MIGRATIONS, **labels)


def assert_exact(smol: Smol, streams: list[Stream], refs: list[dict[str, Any]]) -> None:
    for s, ref in zip(streams, refs, strict=True):
        assert s.error is None and not s.errors, (s.error, s.errors)
        assert s.done, "no [DONE]"
        assert s.text() == reference_text(ref), (s.text(), reference_text(ref))
        assert s.usage == ref["usage"], (s.usage, ref["usage"])
        ids = {e["id"] for e in s.events}
        assert len(ids) == 1, f"one answer, one id: {ids}"
        if s.chat:
            roles = [c for e in s.events for c in e.get("choices", []) if (c.get("delta") or {}).get("role")]
            assert len(roles) == 1, "the assistant role is sent once"


# ------------------------------------------------------------------------------------------ tests
# Each test brings the service to what it needs (`steady`), so that any one of them runs alone too. Their
# order spares engine starts: the only test that needs a revision other than the base one (the crash
# inside a stop string) comes last, so that no test after it waits for base engines to start again.


def test_sigkill_mid_stream_every_answer_finishes_token_exact(smol: Smol) -> None:
    snap = smol.steady(smol.manifest("base"))
    rev = revision_of(smol.root / "base.yaml")
    streams = [completion(p) for p in PROMPTS] + [chat(c) for c in CHAT]
    streams += [completion(PROMPTS[0], logprobs=2), chat(CHAT[0], logprobs=True, top_logprobs=2)]
    refs = references(smol, streams)
    before = migrations(smol, outcome="continued")
    with under_way(smol.url, streams):
        os.kill(snap["processes"][rev]["pids"][0], signal.SIGKILL)

    assert_exact(smol, streams, refs)
    for s, ref in zip(streams[-2:], refs[-2:], strict=True):  # logprobs across the seam: one per token
        assert len(s.logprob_tokens()) == MAX_TOKENS
        want = ref["choices"][0]["logprobs"]
        assert s.logprob_tokens() == ([t["token"] for t in want["content"]] if s.chat else want["tokens"])
    completions = streams[-2]
    offsets = [o for e in completions.events for c in e["choices"] for o in (c.get("logprobs") or {}).get("text_offset", [])]
    assert offsets == refs[-2]["choices"][0]["logprobs"]["text_offset"]
    moved = migrations(smol, outcome="continued") - before
    assert moved >= 1, "the killed replica served none of the streams"
    assert router_metric(smol.url, m.REQUESTS, revision=rev, code="error") >= moved  # charged to the revision
    print(f"folio up: SIGKILL under {len(streams)} streams: {moved:g} continued, largest client gap "
          f"{max(s.largest_gap() for s in streams) * 1000:.0f} ms")


def test_sigstop_streams_move_after_the_inter_chunk_timeout(smol: Smol) -> None:
    snap = smol.steady(smol.manifest("base"))
    rev = revision_of(smol.root / "base.yaml")
    victim = snap["processes"][rev]["pids"][0]
    streams = [completion(p) for p in PROMPTS] + [chat(c) for c in CHAT]
    refs = references(smol, streams)
    before = migrations(smol, reason="timeout", outcome="continued")
    try:
        with under_way(smol.url, streams):
            os.kill(victim, signal.SIGSTOP)
    finally:  # (`folio up` kills an engine that fails its health probes long enough, and starts another)
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    assert_exact(smol, streams, refs)
    moved = migrations(smol, reason="timeout", outcome="continued") - before
    assert moved >= 1
    assert max(s.largest_gap() for s in streams) >= INTER_CHUNK_TIMEOUT_S * 0.9  # they waited out the silence


def test_a_crashing_canary_is_rolled_back_with_no_client_error(smol: Smol) -> None:
    # Engines restarting again and again share two cores with the rest: a step may well take more than the
    # SIGSTOP test's 2 s here, so the inter-chunk timeout is the default's (a stall is no crash).
    router = {**ROUTER, "migration": {"maxAttempts": 3}}
    smol.steady(smol.manifest("base", router=router))
    # A crashing canary takes few requests between its restarts: one is enough for a sample, and the first
    # failing sample decides (the one in which it crashed: its next ones find it restarting, inconclusive).
    analysis = {**FAST_ROLLOUT["analysis"], "minRequests": 1, "failureLimit": 1}
    rollout = {**FAST_ROLLOUT, "steps": [{"weight": 50, "pause": "1h"}], "analysis": analysis}
    canary = smol.manifest("crashing", {"faultCrashAfterTokens": 24}, router=router, rollout=rollout)
    with LoadGenerator(smol.url, NAME, concurrency=3, max_tokens=16) as load:
        wait_for(lambda: load.snapshot().ok >= 3, 60, "the load flowing")
        smol.apply(canary)
        snap = smol.up.wait_for(lambda s: s["status"].get("failedRevisions"), 240, "the automatic rollback")
    [failed] = [f for f in snap["status"]["failedRevisions"] if f["revision"] == revision_of(canary)]
    # Its analysis saw the failures its clients did not (100% errors), whichever verdict came first: the
    # analysis', or the crash loop's (it crashes again each time it comes back).
    assert failed["reason"] in ("AnalysisFailed", "CrashLoopBackOff"), failed
    assert "error rate" in failed["message"], failed
    stats = load.snapshot()
    assert stats.failed == 0, stats.errors[:5]
    assert migrations(smol, revision=revision_of(canary)) >= 1


def test_scale_down_continues_the_streams_of_the_replica_that_goes(smol: Smol) -> None:
    base = smol.manifest("base")
    smol.steady(base)
    streams = [completion(p, max_tokens=120) for p in PROMPTS] + [chat(c, max_tokens=120) for c in CHAT]
    refs = references(smol, streams)
    with under_way(smol.url, streams):
        smol.apply(smol.manifest("base", replicas=1))  # the same revision, one replica fewer
    assert_exact(smol, streams, refs)


def test_migration_off_ends_broken_streams_with_a_clean_error(smol: Smol) -> None:
    off = smol.manifest("off", router={**ROUTER, "migration": {"maxAttempts": 0}})
    snap = smol.steady(off)
    rev = revision_of(off)
    streams = [completion(p) for p in PROMPTS] + [chat(c) for c in CHAT]
    before = migrations(smol)
    with under_way(smol.url, streams):
        os.kill(snap["processes"][rev]["pids"][0], signal.SIGKILL)
    broken = [s for s in streams if s.errors]
    assert broken, "the killed replica served none of the streams"
    for s in streams:
        assert s.error is None and s.done, (s.error, s.done)  # never a cut: an error event, then [DONE]
    for s in broken:
        assert s.errors[-1]["error"]["type"], s.errors
    assert migrations(smol) == before


def test_a_stop_string_spanning_the_seam(smol: Smol) -> None:
    """The engine crashes (an injected fault) after a set number of tokens, inside the stop string: the
    continuation still finds it, and the answer ends where the uninterrupted one does."""
    smol.steady(smol.manifest("base", replicas=1), replicas=1)  # the answers to compare with are the base's
    plain = completion(PROMPTS[1])
    answer = reference_text(references(smol, [plain])[0])
    # A long stop string starting mid-answer: its first characters are generated before the seam, held back.
    at = len(answer) // 2
    stop = answer[at : at + 12]
    stopped = completion(PROMPTS[1], stop=[stop])
    [ref] = references(smol, [stopped])
    assert reference_text(ref) == answer[:at] and ref["choices"][0]["finish_reason"] == "stop"
    crash_after = ref["usage"]["completion_tokens"] - 1  # inside the stop string's tokens
    smol.steady(smol.manifest("crashy", {"faultCrashAfterTokens": crash_after}), replicas=2)
    before = migrations(smol, outcome="continued")
    join(run_all(smol.url, [stopped]))
    assert_exact(smol, [stopped], [ref])
    assert stopped.events[-2]["choices"][0]["finish_reason"] == "stop"
    assert migrations(smol, outcome="continued") > before
