"""On a real cluster: serve SmolLM2, roll back a faulty canary on its own, promote a healthy one.

Run by `e2e/run.sh` (kind), or against any cluster with the image on its nodes:
`FOLIO_E2E=1 FOLIO_E2E_IMAGE=… pytest e2e`. The tests run in file order and share one service.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e.conftest import ISVC, NAMESPACE, RELEASE_NAMESPACE, SERVED, inference_service
from e2e.kubectl import REPO, Kubectl, Load, chat, condition, router_counts, run, wait_for
from folio.operator.k8s.names import REVISION_LABEL
from folio.operator.spec import InferenceServiceSpec, revision_name

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]


def _revision(manifest: dict[str, Any]) -> str:
    return revision_name(InferenceServiceSpec.model_validate(manifest["spec"]))


@pytest.fixture(scope="module")
def router(kube: Kubectl, chat_service: dict[str, Any]) -> Iterator[str]:
    """The InferenceService's stable endpoint: the router Service named after it, port 80."""
    with kube.port_forward(f"service/{ISVC}", 80) as url:
        wait_for("the router to answer", lambda: chat(url, SERVED).status_code == 200, timeout=120)
        yield url


def test_ready_service_answers_through_the_router(kube: Kubectl, chat_service: dict[str, Any], router: str) -> None:
    rev = _revision(chat_service)
    isvc = kube.get("fisvc", ISVC)
    status = isvc["status"]
    assert status["stableRevision"] == rev
    assert status["traffic"] == [{"revision": rev, "weight": 100}]
    assert status["observedGeneration"] == isvc["metadata"]["generation"]
    assert condition(isvc, "WeightsReady")["status"] == "True"
    # the objects the contracts name, with their labels
    deployment = kube.get("deployment", f"{ISVC}-{rev}")
    assert deployment["metadata"]["labels"]["serving.folio.dev/revision"] == rev
    assert deployment["status"]["readyReplicas"] == 1
    kube.get("job", f"{ISVC}-prepull-{rev}")

    reply = chat(router, SERVED)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == SERVED and body["choices"][0]["message"]["content"]
    assert router_counts(router, ISVC).get((rev, "200"), 0) >= 1


def test_faulty_canary_is_rolled_back(kube: Kubectl, chat_service: dict[str, Any], router: str) -> None:
    stable = _revision(chat_service)
    faulty = inference_service(chat_service["spec"]["model"], faultErrorRate=1.0)
    bad = _revision(faulty)
    kube.apply(faulty)

    def failed() -> dict[str, Any] | None:
        status = kube.get("fisvc", ISVC).get("status", {})
        return next((f for f in status.get("failedRevisions", []) if f["revision"] == bad), None)

    with Load(router, SERVED) as load:
        record = wait_for(f"revision {bad} to be rolled back", failed, timeout=900, interval=5)
    assert load.codes.get(200, 0) > 0  # stable kept serving (and retries covered the canary's failures)

    isvc = kube.get("fisvc", ISVC)
    status = isvc["status"]
    assert record["reason"] == "AnalysisFailed", record
    assert status["stableRevision"] == stable and not status.get("canaryRevision")
    assert status["traffic"] == [{"revision": stable, "weight": 100}]
    degraded = condition(isvc, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "AnalysisFailed"
    assert "error rate" in degraded["message"]  # the measured figures are in the message
    assert condition(isvc, "Ready")["status"] == "True"
    # Git stays the source of truth: the spec still asks for the faulty revision
    assert isvc["spec"]["engine"]["args"]["faultErrorRate"] == 1.0
    assert any(e["reason"] == "RolledBack" and e["type"] == "Warning" for e in kube.events(ISVC))

    counts = router_counts(router, ISVC)
    assert sum(v for (rev, code), v in counts.items() if rev == bad and not code.startswith("2")) > 0
    assert sum(v for (rev, code), v in counts.items() if rev == bad and code.startswith("2")) == 0
    # the failed revision is scaled to zero: no serving pods left
    wait_for("the failed revision's pods to go",
             lambda: not kube("get", "pods", "-l", f"{REVISION_LABEL}={bad}", "-o", "name").strip(),
             timeout=300)


def test_healthy_canary_is_promoted(kube: Kubectl, chat_service: dict[str, Any], router: str) -> None:
    healthy = inference_service(chat_service["spec"]["model"], maxNumSeqs=16)
    good = _revision(healthy)
    kube.apply(healthy)

    def promoted() -> bool:
        return kube.get("fisvc", ISVC).get("status", {}).get("stableRevision") == good

    with Load(router, SERVED) as load:
        wait_for(f"revision {good} to be promoted", promoted, timeout=900, interval=5)
    assert load.codes.get(200, 0) > 0 and set(load.codes) == {200}  # nobody noticed the rollout

    kube("wait", "--for=condition=Ready", f"fisvc/{ISVC}", "--timeout=300s", timeout=330)
    isvc = kube.get("fisvc", ISVC)
    status = isvc["status"]
    assert status["traffic"] == [{"revision": good, "weight": 100}]
    assert not status.get("canaryRevision")
    assert condition(isvc, "Degraded")["status"] == "False"  # the spec's revision is healthy again
    assert condition(isvc, "Progressing")["status"] == "False"
    counts = router_counts(router, ISVC)
    assert counts.get((good, "200"), 0) > 0
    assert sum(v for (rev, code), v in counts.items() if rev == good and not code.startswith("2")) == 0


def test_helm_test_sends_a_chat_completion(release: str, helm_bin: str, chat_service: dict[str, Any]) -> None:
    chart = str(REPO / "charts" / "folio")
    run([helm_bin, "upgrade", release, chart, "--namespace", RELEASE_NAMESPACE, "--reuse-values", "--wait",
         "--set", f"tests.inferenceService={ISVC}", "--set", f"tests.namespace={NAMESPACE}",
         "--set", f"tests.model={SERVED}"], timeout=360)
    out = run([helm_bin, "test", release, "--namespace", RELEASE_NAMESPACE, "--logs", "--timeout", "5m"], timeout=360)
    assert "OK http://chat." in out, out
