"""Adapters as pinned, canaried, rolled-back units, end to end in `folio up` with SmolLM2 and real peft adapters.

One `folio up` serves SmolLM2 with two adapters; the tests walk it in order (module scope): adapters load
onto the running engine without a restart; a revision whose weights are scaled (it answers differently,
fails no request) is stopped by its parity gate before any request reaches it; under steady load on the base
model and both adapters, a revision that answers errors (`folio-fault.json`, ``faultAdapterFiles``) is rolled
back while the other adapter's canary is promoted, with no client error; a removed adapter is unloaded and
answers 404.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from folio.engine.digest import compute_digest
from folio.engine.server.adapter_faults import FAULT_FILE
from folio.operator import metric_names as m
from folio.operator.serving.adapters import engine_name
from folio.operator.spec import InferenceServiceSpec, adapter_revision_name
from folio.operator.testing.load import LoadGenerator
from folio.operator.testing.up import UpProcess, write_manifest
from folio.operator.testing.wait import wait_for
from tests.local.test_e2e import folio, router_ready
from tests.local.test_incidents import router_metric
from tests.server.conftest import free_port
from tests.support.lora import make_adapter

pytestmark = pytest.mark.slow

NAME = "smol"
# Each adapter's own rollout: a parity gate on a short suite, one step, analysis every 3 s.
ADAPTER_ROLLOUT = {
    "steps": [{"weight": 50, "pause": "3s"}],
    "analysis": {"interval": "3s", "minRequests": 2, "failureLimit": 2},
    "parity": {"prompts": 6, "maxTokens": 4, "minCosine": 0.999, "minTokenMatch": 0.9},
    "drainPeriod": "2s",
}
BASE_ROLLOUT = {"steps": [], "analysis": {"interval": "3s", "minRequests": 2}, "drainPeriod": "2s"}


class Adapters:
    """SmolLM2 with adapters made by peft, the manifests that serve them, and the `folio up` running them."""

    def __init__(self, root: Path, model: Path) -> None:
        self.root, self.model, self.digest = root, model, compute_digest(model)
        self.sql = make_adapter(model, root / "sql-v1", r=8, target_modules=["q_proj", "v_proj"], seed=1, std=0.05)
        self.chat = make_adapter(model, root / "chat-v1", r=8, target_modules=["q_proj", "v_proj"], seed=2, std=0.05)
        self.up: UpProcess | None = None

    def variant(self, of: Path, tag: str, *, scale: float = 1.0, fault: float | None = None) -> Path:
        """A new revision of the adapter at ``of``: its B matrices times ``scale``, with a fault file when
        ``fault`` is given, and a note (so an unchanged copy is a revision of its own too)."""
        out = self.root / tag
        shutil.copytree(of, out)
        (out / "README.md").write_text(f"revision {tag}\n")
        if scale != 1.0:
            from safetensors.torch import load_file, save_file

            weights = out / "adapter_model.safetensors"
            tensors = {k: v * scale if "lora_B" in k else v for k, v in load_file(weights).items()}
            save_file(tensors, weights, metadata={"format": "pt"})
        if fault is not None:
            (out / FAULT_FILE).write_text(json.dumps({"errorRate": fault}))
        return out

    def manifest(self, tag: str, **adapters: Path) -> Path:
        return write_manifest(
            self.root / f"{tag}.yaml", name=NAME, model=self.model, digest=self.digest, replicas=1,
            args={"device": "cpu", "maxNumSeqs": 8, "maxModelLen": 512, "maxLoras": 2, "maxLoraRank": 8,
                  "faultAdapterFiles": True},
            rollout=BASE_ROLLOUT, adapters=[
                {"name": name, "source": f"file://{folder}", "digest": compute_digest(folder),
                 "rollout": ADAPTER_ROLLOUT}
                for name, folder in adapters.items()
            ],
        )  # fmt: skip

    @property
    def url(self) -> str:
        assert self.up is not None
        return self.up.router_url

    def apply(self, manifest: Path) -> None:
        out = folio("apply", str(manifest), "--state-dir", str(self.root / ".folio"), cwd=self.root)
        assert out.returncode == 0, out.stderr

    def adapter(self, snap: dict[str, Any], name: str) -> dict[str, Any]:
        return next((a for a in snap["status"].get("adapters", []) if a["name"] == name), {})

    def engine(self, snap: dict[str, Any]) -> tuple[str, list[int]]:
        """The one engine group: its URL and process ids."""
        [(_, group)] = [(k, v) for k, v in snap["processes"].items() if k != "router"]
        return group["endpoints"][0], group["pids"]

    def complete(self, model: str) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/completions", json={"model": model, "prompt": "SELECT", "max_tokens": 3},
                          timeout=60, trust_env=False)


def revision(manifest: Path, adapter: str) -> str:
    spec = InferenceServiceSpec.model_validate(yaml.safe_load(manifest.read_text())["spec"])
    return adapter_revision_name(next(a for a in spec.adapters if a.name == adapter))


def serving(svc: Adapters, snap: dict[str, Any], name: str, rev: str) -> bool:
    a = svc.adapter(snap, name)
    return a.get("traffic") == [{"revision": rev, "weight": 100}] and not a.get("canaryRevision")


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Iterator[Adapters]:
    root = tmp_path_factory.mktemp("adapters")
    s = Adapters(root, smollm2_dir)
    first = s.manifest("v1", sql=s.sql, chat=s.chat)
    s.up = UpProcess(first, port=free_port(), state_dir=root / ".folio", log=root / "up.log")
    try:
        yield s
    finally:
        if s.up.proc.poll() is None:
            s.up.stop(sig=signal.SIGTERM)


def test_adapters_load_onto_the_running_engine_and_answer_under_their_names(svc: Adapters) -> None:
    assert svc.up is not None
    sql, chat = revision(svc.root / "v1.yaml", "sql"), revision(svc.root / "v1.yaml", "chat")
    snap = svc.up.wait_for(lambda s: serving(svc, s, "sql", sql) and serving(svc, s, "chat", chat), 180,
                           "both adapters serving")
    wait_for(lambda: router_ready(svc.url), 30, "the router serving")
    base_rev = snap["status"]["stableRevision"]
    _, pids = svc.engine(snap)
    for model in ("sql", "chat", NAME):
        resp = svc.complete(model)
        assert resp.status_code == 200, resp.text
        assert resp.json()["model"] == model, "answers name the adapter, never its revision"
    assert router_metric(svc.url, m.REQUESTS, adapter="sql", adapter_revision=sql, code="200") >= 1
    listed = httpx.get(f"{svc.url}/v1/models", timeout=10, trust_env=False).json()["data"]
    assert [c["id"] for c in listed[:1]] == [NAME] and sorted(c["id"] for c in listed[1:]) == ["chat", "sql"]

    # a third adapter joins: loaded by the running engine, no new base revision, no restart
    svc.apply(svc.manifest("v1b", sql=svc.sql, chat=svc.chat, extra=svc.variant(svc.chat, "extra-v1")))
    extra = revision(svc.root / "v1b.yaml", "extra")
    snap = svc.up.wait_for(lambda s: serving(svc, s, "extra", extra), 120, "the added adapter serving")
    assert snap["status"]["stableRevision"] == base_rev and svc.engine(snap)[1] == pids
    assert svc.complete("extra").status_code == 200
    assert svc.complete("no-such-adapter").status_code == 404


def test_a_scaled_adapter_revision_is_stopped_by_its_parity_gate(svc: Adapters) -> None:
    assert svc.up is not None
    stable = revision(svc.root / "v1.yaml", "sql")
    scaled = svc.manifest("sql-scaled", sql=svc.variant(svc.sql, "sql-scaled", scale=8.0), chat=svc.chat)
    rev = revision(scaled, "sql")
    svc.apply(scaled)

    def failed(s: dict[str, Any]) -> bool:
        return any(f["revision"] == rev for f in svc.adapter(s, "sql").get("failedRevisions", []))

    snap = svc.up.wait_for(failed, 180, "the parity gate failing the scaled adapter")
    sql = svc.adapter(snap, "sql")
    assert sql["failedRevisions"][-1]["reason"] == "ParityFailed"
    assert sql["traffic"] == [{"revision": stable, "weight": 100}]
    assert router_metric(svc.url, m.REQUESTS, adapter="sql", adapter_revision=rev) == 0, "no request reached it"
    degraded = next(c for c in snap["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["message"].startswith("adapter sql: ")
    assert not svc.adapter(snap, "extra"), "this manifest names no extra adapter: it is gone"


def test_an_erroring_adapter_rolls_back_while_another_is_promoted_with_no_client_error(svc: Adapters) -> None:
    assert svc.up is not None
    sql1 = revision(svc.root / "v1.yaml", "sql")
    chat1 = revision(svc.root / "v1.yaml", "chat")
    before = svc.up.status()
    base_rev, (engine_url, pids) = before["status"]["stableRevision"], svc.engine(before)
    both = svc.manifest("v2", sql=svc.variant(svc.sql, "sql-faulty", fault=1.0), chat=svc.variant(svc.chat, "chat-v2"))
    faulty, chat2 = revision(both, "sql"), revision(both, "chat")
    loads = [LoadGenerator(svc.url, model, concurrency=1, max_tokens=4) for model in ("sql", "chat", NAME)]
    for load in loads:
        load.__enter__()
    try:
        time.sleep(1.0)
        svc.apply(both)

        def settled(s: dict[str, Any]) -> bool:
            sql = svc.adapter(s, "sql")
            return (serving(svc, s, "chat", chat2)
                    and any(f["revision"] == faulty for f in sql.get("failedRevisions", [])))  # fmt: skip

        snap = svc.up.wait_for(settled, 240, "sql's faulty revision rolled back and chat's promoted")
        time.sleep(1.0)
    finally:
        for load in loads:
            load.__exit__(None, None, None)
    for load in loads:
        stats = load.snapshot()
        assert stats.ok > 0 and stats.failed == 0, (load.model, stats.errors[:3])
    sql = svc.adapter(snap, "sql")
    assert sql["traffic"] == [{"revision": sql1, "weight": 100}]
    assert sql["failedRevisions"][-1]["reason"] == "AnalysisFailed"
    assert router_metric(svc.url, m.REQUESTS, adapter="sql", adapter_revision=faulty, code="500") > 0
    assert router_metric(svc.url, m.REQUESTS, adapter="chat", adapter_revision=chat2, code="200") > 0
    degraded = next(c for c in snap["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["message"].startswith("adapter sql: ")
    assert snap["status"]["traffic"] == [{"revision": base_rev, "weight": 100}], "the base model untouched"
    assert svc.engine(snap) == (engine_url, pids), "no engine restarted"

    # promotion unloads the old revision; the failed one is unloaded too
    def unloaded(_: dict[str, Any]) -> bool:
        cards = httpx.get(f"{engine_url}/v1/models", timeout=5, trust_env=False).json()["data"]
        held = {c["id"] for c in cards if c.get("parent")}
        return engine_name("chat", chat1) not in held and engine_name("sql", faulty) not in held
    svc.up.wait_for(unloaded, 30, "the old chat revision and the failed sql revision unloaded")

    out = folio("status", NAME, "--state-dir", str(svc.root / ".folio"), cwd=svc.root)
    assert out.returncode == 0 and "adapters" in out.stdout and chat2 in out.stdout and "AnalysisFailed" in out.stdout


def test_a_removed_adapter_is_unloaded_and_answers_404(svc: Adapters) -> None:
    assert svc.up is not None
    snap = svc.up.status()
    engine_url, pids = svc.engine(snap)
    only_sql = svc.manifest("v3", sql=svc.sql)
    svc.apply(only_sql)
    wait_for(lambda: svc.complete("chat").status_code == 404, 60, "requests for the removed adapter answered 404")
    assert svc.complete("chat").json()["error"]["code"] == "model_not_found"
    assert svc.complete("sql").status_code == 200

    def gone(_: dict[str, Any]) -> bool:
        cards = httpx.get(f"{engine_url}/v1/models", timeout=5, trust_env=False).json()["data"]
        return not any(c["id"].startswith("chat@") for c in cards)

    snap = svc.up.wait_for(gone, 30, "the removed adapter unloaded from the engine")
    assert [a["name"] for a in snap["status"]["adapters"]] == ["sql"]
    assert svc.engine(snap) == (engine_url, pids)
    assert svc.up.stop() == 0
