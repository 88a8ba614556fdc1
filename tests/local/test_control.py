"""The control endpoint: token required, manifests validated, overrides named, all in the error shape."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from folio.operator.local.control import build_app
from folio.operator.serving.validate import THIS_MACHINE, validate
from folio.operator.spec import InferenceService

DIGEST = "sha256:" + "ab" * 32


def manifest(name: str = "chat", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.folio.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": {"source": "file:///m", "digest": DIGEST}, **spec},
    }


class FakeRuntime:
    """What the control endpoint needs from the runtime; its apply validates as `LocalRuntime.apply` does."""

    name = "chat"

    def __init__(self) -> None:
        self.applied: list[InferenceService] = []
        self.overrides: list[str] = []

    def apply(self, m: InferenceService) -> dict[str, Any]:
        if m.name != self.name:
            raise ValueError(f"this `folio up` runs InferenceService {self.name!r}")
        problems = validate(m.name, m.spec, THIS_MACHINE)
        if problems:
            raise ValueError("\n".join(map(str, problems)))
        self.applied.append(m)
        return {"revision": "r", "generation": 2, "changed": True}

    def request_override(self, name: str) -> None:
        self.overrides.append(name)

    def snapshot(self) -> dict[str, Any]:
        return {"name": self.name, "status": {}}


@pytest.fixture
def api() -> tuple[TestClient, FakeRuntime]:
    rt = FakeRuntime()
    client = TestClient(build_app(rt, "tok"))  # type: ignore[arg-type]
    client.headers["authorization"] = "Bearer tok"
    return client, rt


def test_token_is_required(api: tuple[TestClient, FakeRuntime]) -> None:
    client, rt = api
    for headers in ({"authorization": "Bearer nope"}, {"authorization": ""}):
        resp = client.post("/v1/overrides/abort", headers=headers)
        assert resp.status_code == 401 and "control token" in resp.json()["error"]["message"]
    assert rt.overrides == []


def test_status_and_overrides(api: tuple[TestClient, FakeRuntime]) -> None:
    client, rt = api
    assert client.get("/v1/status").json()["name"] == "chat"
    assert client.post("/v1/overrides/promote").status_code == 202
    resp = client.post("/v1/overrides/explode")
    assert resp.status_code == 404 and "promote, abort, retry" in resp.json()["error"]["message"]
    assert rt.overrides == ["promote"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"manifest": manifest(replicas=-1)}, "spec.replicas: Input should be greater than or equal to 0"),
        ({"manifest": manifest(name="other")}, "runs InferenceService 'chat'"),
        ({"manifest": manifest(engine={"args": {"bogus": 1}})}, "unknown engine arg 'bogus'"),
        ({"nothing": 1}, "invalid manifest"),
    ],
)
def test_bad_applies_are_400(api: tuple[TestClient, FakeRuntime], body: dict[str, Any], message: str) -> None:
    client, rt = api
    resp = client.post("/v1/apply", json=body)
    assert resp.status_code == 400 and message in resp.json()["error"]["message"]
    assert rt.applied == []


def test_a_refused_apply_lists_each_problem_with_its_field(api: tuple[TestClient, FakeRuntime]) -> None:
    client, rt = api
    body = {"manifest": manifest(replicas=17, overflow={"url": "ftp://x"}, engine={"args": {"maxNumSeqs": 0}})}
    error = client.post("/v1/apply", json=body).json()["error"]
    assert [(p["path"], p["reason"]) for p in error["problems"]] == [
        ("spec.overflow.url", "InvalidSpec"),
    ]  # the schema's problem first: the rest is checked once the spec parses
    body["manifest"]["spec"]["overflow"] = {"url": "http://overflow.example/v1"}
    error = client.post("/v1/apply", json=body).json()["error"]
    assert [(p["path"], p["reason"]) for p in error["problems"]] == [
        ("spec.engine.args.maxNumSeqs", "InvalidEngineArgs"), ("spec.replicas", "UnsupportedHere"),
    ]
    assert error["message"].splitlines() == [
        "spec.engine.args.maxNumSeqs: max_num_seqs must be >= 1, got 0",
        "spec.replicas 17 is more than `folio up` runs (at most 16 engine processes per revision)",
    ]
    assert rt.applied == []


def test_malformed_json_is_400(api: tuple[TestClient, FakeRuntime]) -> None:
    client, _ = api
    resp = client.post("/v1/apply", content=b"{", headers={"content-type": "application/json"})
    assert resp.status_code == 400


def test_good_apply(api: tuple[TestClient, FakeRuntime]) -> None:
    client, rt = api
    assert client.post("/v1/apply", json={"manifest": manifest(replicas=2)}).json()["changed"] is True
    assert rt.applied[0].spec.replicas == 2
