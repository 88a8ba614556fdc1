"""docs/gitops.md: the Argo CD Lua health check and the Flux CEL health expressions, run for real
against statuses produced by Folio's own rollout code."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

import celpy
import pytest
import yaml
from lupa import lua51  # Argo CD's gopher-lua implements Lua 5.1

from folio.operator.rollout import Observed, RevisionFacts, advance
from folio.operator.rollout.conditions import set_condition
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, revision_name
from tests.chart import helm as h

DOC = (h.REPO / "docs" / "gitops.md").read_text()
MANIFESTS = [doc for block in re.findall(r"```yaml\n(.*?)```", DOC, re.S) for doc in yaml.safe_load_all(block) if doc]
HEALTH_KEY = "resource.customizations.health.serving.folio.dev_InferenceService"


def _manifest(kind: str, name: str) -> dict[str, Any]:
    return next(m for m in MANIFESTS if m.get("kind") == kind and m["metadata"]["name"] == name)


# ------------------------------------------------------------- statuses from the real rollout

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SPEC_V1 = InferenceServiceSpec.model_validate({"model": {"source": "hf://org/chat", "revision": "a" * 40}})
SPEC_V2 = SPEC_V1.model_copy(update={"engine": SPEC_V1.engine.model_copy(update={"args": {"maxNumSeqs": 512}})})
R1, R2 = revision_name(SPEC_V1), revision_name(SPEC_V2)
READY = RevisionFacts(weights="ready", ready_replicas=1)


def _obj(generation: int, status: InferenceServiceStatus | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "serving.folio.dev/v1alpha1", "kind": "InferenceService",
                           "metadata": {"name": "chat", "namespace": "models", "generation": generation},
                           "spec": {}}
    if status is not None:
        obj["status"] = status.to_wire()
    return obj


def _scenarios() -> dict[str, tuple[dict[str, Any], str]]:
    """name -> (object, expected health), walking one service through its life."""
    out: dict[str, tuple[dict[str, Any], str]] = {"created, no status yet": (_obj(1, None), "Progressing")}

    def step(spec: InferenceServiceSpec, gen: int, st: InferenceServiceStatus, seconds: int,
             facts: dict[str, RevisionFacts], overrides: frozenset[str] = frozenset()) -> InferenceServiceStatus:
        return advance(spec, gen, st, Observed(now=T0 + timedelta(seconds=seconds), revisions=facts,
                                               overrides=overrides)).status

    st = step(SPEC_V1, 1, InferenceServiceStatus(), 0, {})
    out["pre-pulling weights"] = (_obj(1, st), "Progressing")
    st = step(SPEC_V1, 1, st, 10, {R1: READY})
    out["serving"] = (_obj(1, st), "Healthy")
    out["new spec not yet observed"] = (_obj(2, st), "Progressing")
    both = {R1: READY, R2: READY}
    st = step(SPEC_V2, 2, st, 20, both)
    st = step(SPEC_V2, 2, st, 21, both)
    out["canary step"] = (_obj(2, st), "Progressing")
    st = step(SPEC_V2, 2, st, 30, both, frozenset({"abort"}))
    out["rolled back"] = (_obj(2, st), "Degraded")
    reverted = step(SPEC_V1, 3, st, 40, both)
    out["reverted in Git"] = (_obj(3, reverted), "Healthy")
    invalid = st.model_copy(update={"observed_generation": 4, "conditions": set_condition(
        reverted.conditions, "Degraded", "True", "UnknownEngineArg", "spec.engine.args.maxSeqs is not a folio serve flag",
        generation=4, now=T0)})
    out["spec cannot be planned"] = (_obj(4, invalid), "Degraded")
    lost = reverted.model_copy(update={"conditions": set_condition(
        reverted.conditions, "Ready", "False", "NoReadyReplicas", "stable revision has no ready replica",
        generation=3, now=T0)})
    out["replicas lost"] = (_obj(3, lost), "Progressing")
    return out


SCENARIOS = _scenarios()


def test_scenarios_are_what_their_names_say() -> None:
    """Guard the fixtures: the rollout code really produced these states."""
    def phase(name: str) -> str:
        return SCENARIOS[name][0]["status"]["phase"]

    assert phase("serving") == "Ready" and phase("canary step") == "Canary"
    rolled_back = SCENARIOS["rolled back"][0]["status"]
    assert rolled_back["phase"] == "RolledBack"
    assert rolled_back["traffic"] == [{"revision": R1, "weight": 100}]
    assert [f["revision"] for f in rolled_back["failedRevisions"]] == [R2]


# ------------------------------------------------------------------------------ Argo CD (Lua)


def _lua_health(obj: dict[str, Any]) -> dict[str, str]:
    script = _manifest("ConfigMap", "argocd-cm")["data"][HEALTH_KEY]
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(script)
    return {"status": result["status"], "message": result["message"]}


@pytest.mark.parametrize("name", SCENARIOS)
def test_argo_cd_health(name: str) -> None:
    obj, expected = SCENARIOS[name]
    health = _lua_health(obj)
    assert health["status"] == expected, health
    assert health["message"]


def test_argo_cd_degraded_message_carries_reason_and_figures() -> None:
    health = _lua_health(SCENARIOS["rolled back"][0])
    assert health["message"].startswith("Aborted: ")
    assert f"traffic is back on stable revision {R1}" in health["message"]


def test_argo_cd_ignores_conditions_of_an_older_generation() -> None:
    obj, _ = SCENARIOS["rolled back"]
    obj = {**obj, "metadata": {**obj["metadata"], "generation": 3},
           "status": {**obj["status"], "observedGeneration": 3}}  # status bumped, conditions stale
    assert _lua_health(obj)["status"] == "Progressing"


# ------------------------------------------------------------------------------- Flux (CEL)


def _flux_health(obj: dict[str, Any]) -> str:
    (check,) = _manifest("Kustomization", "models")["spec"]["healthCheckExprs"]
    assert (check["apiVersion"], check["kind"]) == ("serving.folio.dev/v1alpha1", "InferenceService")
    env = celpy.Environment()
    activation = {k: celpy.json_to_cel(v) for k, v in obj.items()}
    for verdict, key in (("Progressing", "inProgress"), ("Degraded", "failed"), ("Healthy", "current")):
        try:
            if env.program(env.compile(check[key])).evaluate(activation):
                return verdict
        except celpy.CELEvalError:
            return "Progressing"  # a missing field: Flux keeps waiting
    return "Progressing"


@pytest.mark.parametrize("name", SCENARIOS)
def test_flux_health(name: str) -> None:
    obj, expected = SCENARIOS[name]
    assert _flux_health(obj) == expected


# --------------------------------------------------------------------------- the other examples


def test_examples_point_at_this_repository() -> None:
    app = _manifest("Application", "folio")
    assert (h.REPO / app["spec"]["source"]["path"] / "Chart.yaml").exists()
    values = yaml.safe_load((h.CHART / "values.yaml").read_text())
    for key, value in app["spec"]["source"]["helm"]["valuesObject"].items():
        assert key in values and set(value) <= set(values[key])
    release = _manifest("HelmRelease", "folio")
    assert (h.REPO / release["spec"]["chart"]["spec"]["chart"] / "Chart.yaml").exists()
    assert set(release["spec"]["values"]) <= set(values)
