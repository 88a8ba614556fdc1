"""Multi-LoRA serving's HTTP side (vLLM's interface), on the fake engine: `folio serve`'s LoRA flags, a
request's ``model`` naming an adapter, /v1/models, the runtime load/unload endpoints and the metrics."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from folio.engine import serve_cli
from folio.engine.lora import LoRARequest
from folio.engine.server.lora import RUNTIME_UPDATING_ENV
from folio.engine.server.metrics import LORA_RESIDENT
from tests.server.conftest import MODEL, Running
from tests.server.fake_engine import SCRIPT, FakeEngine

DIGEST = "sha256:" + "ab" * 32
GREEDY = {"temperature": 0}


def adapter(root: Path, name: str, rank: int = 8) -> str:
    """A folder as peft's save_pretrained writes it, as far as the fake engine reads it."""
    folder = root / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 16, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return str(folder)


def lora_engine(tmp_path: Path, *names: str) -> FakeEngine:
    """A LoRA-enabled fake engine with ``names`` loaded as `folio serve --lora-modules` does (ids 1, 2, …)."""
    engine = FakeEngine(enable_lora=True, step_delay=0.001)
    for i, name in enumerate(names, start=1):
        engine.add_lora(LoRARequest(name, i, adapter(tmp_path, name)))
    return engine


@pytest.fixture
def lora_server(fake_server: Callable[..., Running], tmp_path: Path) -> Callable[..., Running]:
    """fake_server on a LoRA engine serving adapters "sql" and "chat"; kwargs: ServingConfig fields."""

    def start(**config: Any) -> Running:
        engine = config.pop("engine", None) or lora_engine(tmp_path, "sql", "chat")
        return fake_server(engine=engine, enable_lora=True, max_loras=2, **config)

    return start


def assert_openai_error(response: httpx.Response, status: int, code: str, *, message: str = "") -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["type"] == "invalid_request_error"
    assert message in error["message"]


def complete(http: httpx.Client, model: str, **extra: Any) -> httpx.Response:
    return http.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 4, **GREEDY, **extra})


# ------------------------------------------------------------------ flags


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser.parse_args(["--model", "/models/base", *flags])


def test_lora_modules_take_name_path_and_json_with_a_digest() -> None:
    spec = json.dumps({"name": "chat", "path": "/a/chat", "digest": DIGEST, "base_model_name": "base"})
    modules = serve_cli.lora_modules(parse("--enable-lora", "--lora-modules", "sql=/a/sql", spec))
    assert modules == [serve_cli.LoRAModule("sql", "/a/sql"), serve_cli.LoRAModule("chat", "/a/chat", DIGEST)]
    assert serve_cli.lora_modules(parse("--enable-lora")) == []
    args = parse()
    assert (args.enable_lora, args.max_loras, args.max_lora_rank, args.max_cpu_loras) == (False, 1, 16, None)
    assert not args.allow_runtime_lora_updating


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lora-modules", "sql=/a"], "--lora-modules needs --enable-lora"),
        (["--enable-lora", "--lora-modules", "sql"], "expected NAME=PATH"),
        (["--enable-lora", "--lora-modules", "=/a"], "expected NAME=PATH"),
        (["--enable-lora", "--lora-modules", "sql="], "expected NAME=PATH"),
        (["--enable-lora", "--lora-modules", "{bad"], "invalid JSON"),
        (["--enable-lora", "--lora-modules", '{"name": "x"}'], "'path' must be a non-empty string"),
        (["--enable-lora", "--lora-modules", '{"name": "x", "path": "/a", "rank": 8}'], "unknown key(s) rank"),
        (["--enable-lora", "--lora-modules", '{"name": "x", "path": "/a", "digest": "md5:1"}'], "malformed digest"),
        (["--enable-lora", "--lora-modules", "sql=/a", "sql=/b"], "names adapter 'sql' twice"),
        (["--enable-lora", "--lora-modules", "/models/base=/a"], "has the base model's name"),
        (["--enable-lora", "--served-model-name", "m", "--lora-modules", "m=/a"], "has the base model's name"),
    ],
)
def test_bad_lora_modules_are_flag_errors_naming_the_module(flags: list[str], message: str) -> None:
    with pytest.raises(serve_cli.FlagError, match=re.escape(message)) as caught:
        serve_cli.check(parse(*flags))
    assert caught.value.dest == "lora_modules"


@pytest.mark.parametrize(
    ("flags", "dest", "message"),
    [
        (["--max-loras", "0"], "max_loras", "--max-loras must be >= 1"),
        (["--max-lora-rank", "0"], "max_lora_rank", "--max-lora-rank must be >= 1"),
        (["--max-loras", "4", "--max-cpu-loras", "2"], "max_cpu_loras", "must be >= --max-loras (4)"),
    ],
)
def test_bad_lora_limits_are_flag_errors(flags: list[str], dest: str, message: str) -> None:
    with pytest.raises(serve_cli.FlagError, match=re.escape(message)) as caught:
        serve_cli.check(parse("--enable-lora", *flags))
    assert caught.value.dest == dest


def test_lora_settings_reach_the_engine_config_only_with_enable_lora(monkeypatch: pytest.MonkeyPatch) -> None:
    from folio.engine import config as engine_config

    seen: list[dict[str, Any]] = []

    class Config:  # the engine config's LoRA fields are the engine core's; this records what it is given
        def __init__(self, **kwargs: Any) -> None:
            seen.append(kwargs)

    monkeypatch.setattr(engine_config, "EngineConfig", Config)
    serve_cli.check(parse("--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--max-cpu-loras", "8"))
    serve_cli.check(parse("--max-loras", "4"))
    lora = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras")
    assert [seen[0][k] for k in lora] == [True, 4, 64, 8]
    assert not set(lora) & set(seen[1])


def test_the_operator_does_not_offer_lora_modules_as_an_engine_arg() -> None:
    from folio.operator.serving.engine import engine_flags_table

    table = engine_flags_table()
    assert "loraModules" not in table  # pod-local paths: adapters get their own place in the spec
    assert {"enableLora", "maxLoras", "maxLoraRank", "maxCpuLoras"} <= set(table)


def test_an_adapter_refused_at_start_up_is_a_clear_error_and_closes_the_engine(tmp_path: Path) -> None:
    engine = FakeEngine(enable_lora=True, max_lora_rank=16)
    good = serve_cli.LoRAModule("sql", adapter(tmp_path, "sql"))
    big = serve_cli.LoRAModule("big", adapter(tmp_path, "big", rank=64))
    with pytest.raises(serve_cli.LoRAModuleError, match=r"cannot load LoRA adapter 'big' \(--lora-modules\).*rank 64"):
        serve_cli._add_loras(engine, [good, big])  # type: ignore[arg-type]
    assert engine.closed
    engine = FakeEngine(enable_lora=True)
    serve_cli._add_loras(engine, [good])  # type: ignore[arg-type]
    assert engine.list_loras() == [LoRARequest("sql", 1, good.path)]


# ------------------------------------------------------------------ requests


def test_models_lists_each_adapter_with_its_parent_and_root(lora_server: Callable[..., Running]) -> None:
    server = lora_server()
    with server.http() as http:
        data = http.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == [MODEL, "sql", "chat"]
    assert data[0]["parent"] is None and data[0]["root"] == "/models/fake"
    for card in data[1:]:
        assert card["object"] == "model" and card["parent"] == MODEL
        assert card["root"] == server.engine.loras[card["id"]].lora_path
        assert isinstance(card["created"], int) and card["owned_by"]


def test_a_request_naming_an_adapter_runs_under_it(lora_server: Callable[..., Running]) -> None:
    server = lora_server()
    client = server.client()
    out = client.completions.create(model="sql", prompt="hi", max_tokens=4, **GREEDY)
    assert out.model == "sql" and out.choices[0].text == SCRIPT[:4]
    chat = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert chat.model == "chat"
    chunks = list(client.completions.create(model="sql", prompt="hi", max_tokens=3, stream=True, **GREEDY))
    assert {c.model for c in chunks} == {"sql"}
    base = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, **GREEDY)
    assert base.model == MODEL
    adapters = [r.lora_name if r else None for r in server.engine.lora_requests.values()]
    assert adapters == ["sql", "chat", "sql", None]
    assert set(server.engine.lora_requests.values()) - {None} == {server.engine.loras["sql"], server.engine.loras["chat"]}


def test_an_unknown_model_is_a_404_model_not_found(lora_server: Callable[..., Running]) -> None:
    server = lora_server()
    with server.http() as http:
        assert_openai_error(complete(http, "nope"), 404, "model_not_found", message="The model 'nope' does not exist")
        chat = http.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}],
                                                       "stream": True})  # fmt: skip
        assert_openai_error(chat, 404, "model_not_found")
    assert server.engine.lora_requests == {}


def test_adapter_names_are_not_models_without_enable_lora(fake_server: Callable[..., Running]) -> None:
    with fake_server().http() as http:
        assert_openai_error(complete(http, "sql"), 404, "model_not_found")
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == [MODEL]


# ------------------------------------------------------------------ runtime loading


def test_load_and_unload_are_absent_unless_allowed(lora_server: Callable[..., Running]) -> None:
    with lora_server().http() as http:
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            assert http.post(path, json={"lora_name": "x", "lora_path": "/x"}).status_code == 404


@pytest.mark.parametrize("value", ["1", "true", "True"])
def test_the_env_var_allows_runtime_updating(
    lora_server: Callable[..., Running], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(RUNTIME_UPDATING_ENV, value)
    with lora_server().http() as http:
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 200


def test_the_env_var_set_otherwise_allows_nothing(lora_server: Callable[..., Running], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNTIME_UPDATING_ENV, "0")
    with lora_server().http() as http:
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 404


def test_load_serves_a_new_adapter_under_a_fresh_id(lora_server: Callable[..., Running], tmp_path: Path) -> None:
    server = lora_server(allow_runtime_lora_updating=True)
    path = adapter(tmp_path, "new")
    with server.http() as http:
        loaded = http.post("/v1/load_lora_adapter", json={"lora_name": "new", "lora_path": path})
        assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'new' added successfully."
        assert "new" in [m["id"] for m in http.get("/v1/models").json()["data"]]
        assert complete(http, "new").json()["model"] == "new"
        first = server.engine.loras["new"].lora_int_id
        assert first not in (1, 2)  # the start-up adapters' ids
        unloaded = http.post("/v1/unload_lora_adapter", json={"lora_name": "new"})
        assert unloaded.status_code == 200 and unloaded.text == "Success: LoRA adapter 'new' removed successfully."
        assert http.post("/v1/load_lora_adapter", json={"lora_name": "new", "lora_path": path}).status_code == 200
        assert server.engine.loras["new"].lora_int_id > first  # never reused: the prefix cache keys on it
        pinned = {"lora_name": "pinned", "lora_path": path, "digest": DIGEST}
        assert http.post("/v1/load_lora_adapter", json=pinned).status_code == 200
        assert server.engine.loras["pinned"].digest == DIGEST  # the engine checks the files against it
        assert next(m for m in http.get("/v1/models").json()["data"] if m["id"] == "pinned")["digest"] == DIGEST


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"lora_name": "sql", "lora_path": "/x"}, "The lora adapter 'sql' has already been loaded."),
        ({"lora_name": MODEL, "lora_path": "/x"}, "is the base model's name"),
        ({"lora_name": "x"}, "lora_path"),
        ({"lora_path": "/x"}, "lora_name"),
        ({"lora_name": "", "lora_path": "/x"}, "lora_name"),
        ({"lora_name": "x", "lora_path": "/x", "digest": "sha256:1"}, "malformed digest"),
    ],
)
def test_load_refuses_taken_names_and_missing_fields(
    lora_server: Callable[..., Running], body: dict[str, str], message: str
) -> None:
    with lora_server(allow_runtime_lora_updating=True).http() as http:
        assert_openai_error(http.post("/v1/load_lora_adapter", json=body), 400, "invalid_value", message=message)


def test_a_bad_adapter_is_a_400_in_the_engines_words(lora_server: Callable[..., Running], tmp_path: Path) -> None:
    server = lora_server(allow_runtime_lora_updating=True)
    with server.http() as http:
        big = http.post("/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": adapter(tmp_path, "big", 64)})
        assert_openai_error(big, 400, "invalid_value", message="rank 64 is above --max-lora-rank 16")
        assert big.json()["error"]["message"].startswith("Failed to load LoRA adapter 'big': ")
        gone = http.post("/v1/load_lora_adapter", json={"lora_name": "gone", "lora_path": str(tmp_path / "nope")})
        assert_openai_error(gone, 400, "invalid_value", message="cannot read")
        assert_openai_error(complete(http, "big"), 404, "model_not_found")  # nothing half-registered
        assert complete(http, "sql").status_code == 200  # the others keep serving
    assert set(server.engine.loras) == {"sql", "chat"}


def test_unload_of_an_unknown_adapter_is_a_404(lora_server: Callable[..., Running]) -> None:
    with lora_server(allow_runtime_lora_updating=True).http() as http:
        response = http.post("/v1/unload_lora_adapter", json={"lora_name": "nope"})
        assert_openai_error(response, 404, "model_not_found", message="The lora adapter 'nope' cannot be found.")


def test_after_unload_new_requests_get_404_and_running_ones_finish(lora_server: Callable[..., Running]) -> None:
    engine = FakeEngine(enable_lora=True, step_delay=0.02)  # slow steps: the unload lands mid-answer
    engine.loras["sql"] = LoRARequest("sql", 1, "/a/sql")
    server = lora_server(engine=engine, allow_runtime_lora_updating=True)
    body = {"model": "sql", "prompt": "hi", "max_tokens": 20, "stream": True, **GREEDY}
    with server.http() as http, http.stream("POST", "/v1/completions", json=body) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # running under the adapter
        with server.http() as other:
            assert other.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 200
            assert_openai_error(complete(other, "sql"), 404, "model_not_found")
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert "sql" not in engine.loras


def test_runtime_loading_without_enable_lora_is_a_400(fake_server: Callable[..., Running]) -> None:
    with fake_server(allow_runtime_lora_updating=True).http() as http:
        response = http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/x"})
        assert_openai_error(response, 400, "invalid_value", message="LoRA is not enabled")


# ------------------------------------------------------------------ metrics


def test_metrics_show_the_lora_info_gauge_and_label_requests_by_adapter(lora_server: Callable[..., Running]) -> None:
    server = lora_server()
    with server.http() as http:
        assert complete(http, "sql").status_code == 200
        assert complete(http, MODEL).status_code == 200
        text = http.get("/metrics").text
    info = [line for line in text.splitlines() if line.startswith("vllm:lora_requests_info{")]
    assert len(info) == 1
    assert 'max_lora="2"' in info[0] and 'running_lora_adapters=""' in info[0] and 'waiting_lora_adapters=""' in info[0]
    assert float(info[0].rsplit(" ", 1)[1]) > 1e9  # a Unix timestamp, as vLLM's set_to_current_time()
    assert 'vllm:request_success_total{finished_reason="length",model_name="sql"} 1.0' in text
    assert f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL}"}} 1.0' in text
    assert 'vllm:prompt_tokens_total{model_name="sql"} 3.0' in text


def test_the_lora_info_gauge_names_running_and_waiting_adapters(lora_server: Callable[..., Running]) -> None:
    server = lora_server()
    metrics = server.app.state.server.engine.metrics
    server.app.state.server.engine.lora_state = (["sql", "chat", "sql"], ["chat"])
    text = metrics.render().decode()
    assert 'running_lora_adapters="chat,sql"' in text and 'waiting_lora_adapters="chat"' in text


def test_no_lora_info_without_enable_lora(fake_server: Callable[..., Running]) -> None:
    with fake_server().http() as http:
        assert "vllm:lora_requests_info" not in http.get("/metrics").text


def test_metrics_name_the_adapters_in_memory(lora_server: Callable[..., Running]) -> None:
    server = lora_server()
    with server.http() as http:
        assert complete(http, "sql").status_code == 200  # a step: the loop's snapshot of the engine is fresh
        text = http.get("/metrics").text
    resident = sorted(line.split('"')[1] for line in text.splitlines() if line.startswith(f"{LORA_RESIDENT}{{"))
    assert resident == sorted(server.app.state.server.engine.lora_resident) and "sql" in resident
    server.app.state.server.engine.lora_resident = []
    assert f"{LORA_RESIDENT}{{" not in server.app.state.server.engine.metrics.render().decode()
