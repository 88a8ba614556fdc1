"""`spec.draftModel` end to end in `folio up`: the revision's pre-pull fetches and verifies the draft beside the
weights, the engine speculates with it (its `vllm:spec_decode_*` counters move), and greedy answers through the
router are the target's own, token for token."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from folio.engine import LLM, SamplingParams
from folio.engine.digest import compute_digest
from folio.operator.testing.up import UpProcess, write_manifest
from folio.operator.testing.wait import wait_for
from tests.local.test_e2e import router_ready
from tests.server.conftest import free_port
from tests.support.models import make_tiny_llama

NAME = "drafted"
PROMPTS = ["one two three one two three one two", "the cat sat on the mat and the cat sat on", "a b c d a b c d a"]


def test_folio_up_pulls_the_draft_and_its_engine_speculates_token_exact(tmp_path: Path) -> None:
    target = make_tiny_llama(tmp_path / "models" / "target", randomize_norms=True)
    draft = make_tiny_llama(tmp_path / "models" / "draft", num_hidden_layers=1, hidden_size=32, seed=3)
    args = {"device": "cpu", "dtype": "float32", "maxModelLen": 256, "maxNumSeqs": 4,
            "speculativeConfig": {"num_speculative_tokens": 3}}  # fmt: skip
    manifest = write_manifest(tmp_path / "drafted.yaml", name=NAME, model=target, digest=compute_digest(target),
                              args=args, draft_model={"source": f"file://{draft}", "digest": compute_digest(draft)})  # fmt: skip
    with LLM(str(target), dtype="float32", device="cpu", max_model_len=256) as llm:
        want = [out.outputs[0].token_ids for out in llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))]

    up = UpProcess(manifest, port=free_port(), state_dir=tmp_path / "state", log=tmp_path / "up.log")
    try:
        up.wait_for(lambda s: s["status"].get("phase") == "Ready", 120, "the revision serving")
        wait_for(lambda: router_ready(up.router_url), 30, "the router serving it")
        log = (tmp_path / "up.log").read_text()
        assert "and its draft model" in log and f"{up.status()['revision']}-draft" in log, log[-2000:]
        got = []
        for prompt in PROMPTS:
            resp = httpx.post(f"{up.router_url}/v1/completions", timeout=60, json={
                "model": NAME, "prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                "return_token_ids": True})  # fmt: skip
            assert resp.status_code == 200, resp.text
            got.append(resp.json()["choices"][0]["token_ids"])
        assert got == want, "speculation changed a greedy answer"
        [engine] = up.status()["processes"][up.status()["revision"]]["endpoints"]
        drafts = sum(sample.value for family in text_string_to_metric_families(httpx.get(f"{engine}/metrics").text)
                     for sample in family.samples if sample.name == "vllm:spec_decode_num_drafts_total")  # fmt: skip
        assert drafts > 0, "the engine never verified a proposal"
    finally:
        up.stop()
