"""`folio serve --enable-lora` as a subprocess on the tiny Llama, driven over HTTP: adapters from
`--lora-modules` (one pinned by its digest) and one loaded at run time, each answering token for token as
peft's unmerged model does, listed by /v1/models, counted by the metrics; unloaded, a 404."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from folio.engine.digest import compute_digest
from tests.server.conftest import Serve, start_serve, stop_serve
from tests.support.lora import make_adapter, peft_greedy

PROMPT = [1, 17, 42, 99, 7, 256, 31]
TOKENS = 10


@pytest.fixture(scope="module")
def adapters(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-live")
    return {name: make_adapter(tiny_llama, root / name, r=8, seed=seed)
            for name, seed in (("support", 1), ("legal", 2), ("late", 3))}


@pytest.fixture(scope="module")
def served(folio_bin: str, tiny_llama: Path, adapters: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    legal = adapters["legal"]
    pinned = f'{{"name": "legal", "path": "{legal}", "digest": "{compute_digest(legal)}"}}'
    serve = start_serve(
        folio_bin, tiny_llama, tmp_path_factory.mktemp("serve"), "--enable-lora", "--lora-modules",
        f"support={adapters['support']}", pinned, "--max-loras", "2", "--max-lora-rank", "8",
        "--allow-runtime-lora-updating", "--dtype", "float32",
    )
    yield serve
    stop_serve(serve)


def greedy(serve: Serve, model: str) -> httpx.Response:
    return httpx.post(f"{serve.url}/v1/completions", timeout=60, json={
        "model": model, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True})


def token_ids(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def test_adapters_answer_as_peft_and_are_listed(served: Serve, tiny_llama: Path, adapters: dict[str, Path]) -> None:
    models = {m["id"]: m for m in httpx.get(f"{served.url}/v1/models").json()["data"]}
    assert set(models) == {"m", "support", "legal"}
    assert models["support"]["parent"] == "m" and models["support"]["root"] == str(adapters["support"])
    for name in ("support", "legal"):
        assert token_ids(greedy(served, name)) == peft_greedy(tiny_llama, adapters[name], [PROMPT], TOKENS)[0], name
    base = token_ids(greedy(served, "m"))
    assert base == peft_greedy(tiny_llama, None, [PROMPT], TOKENS)[0]
    assert base != token_ids(greedy(served, "support"))
    metrics = httpx.get(f"{served.url}/metrics").text
    assert re.search(r'^vllm:lora_requests_info\{.*max_lora="2".*\} ', metrics, re.M), metrics[-2000:]
    assert re.search(r'^vllm:request_success_total\{.*model_name="legal".*\} [1-9]', metrics, re.M)


def test_runtime_load_serves_and_unload_refuses(served: Serve, tiny_llama: Path, adapters: dict[str, Path]) -> None:
    loaded = httpx.post(f"{served.url}/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": str(adapters["late"])})
    assert loaded.status_code == 200, loaded.text
    assert token_ids(greedy(served, "late")) == peft_greedy(tiny_llama, adapters["late"], [PROMPT], TOKENS)[0]
    assert httpx.post(f"{served.url}/v1/unload_lora_adapter", json={"lora_name": "late"}).status_code == 200
    gone = greedy(served, "late")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found", gone.text
    assert token_ids(greedy(served, "support"))  # the others keep serving
