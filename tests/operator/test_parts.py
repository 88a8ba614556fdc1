"""The operator's small pure parts: status diffs, observed facts, the executor's retry rules and
what it expects of the indexes."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kopf
import pytest

from folio.operator.controller import cli as controller
from folio.operator.controller.children import Children, Expectations, contains, key
from folio.operator.controller.executor import apply_one, apply_plan
from folio.operator.controller.observe import (
    crash_looping,
    engine_capacity,
    job_weights,
    overrides,
    ready_replicas,
    router_metrics_urls,
)
from folio.operator.k8s.client import ApiError, Kube
from folio.operator.k8s.merge_patch import merge_diff
from tests.operator.harness import point_kubeconfig_at_nothing

# ------------------------------------------------------------------------------ merge


def test_merge_diff_sends_only_changes_and_nulls_removed_keys() -> None:
    old = {"phase": "Canary", "canaryRevision": "b", "canary": {"step": 1, "weight": 25, "lastAnalysis": {"x": 1}},
           "traffic": [{"revision": "a", "weight": 75}, {"revision": "b", "weight": 25}]}
    new = {"phase": "Promoted", "canary": {"step": 1, "weight": 25},
           "traffic": [{"revision": "b", "weight": 100}]}
    assert merge_diff(old, new) == {
        "phase": "Promoted",
        "canaryRevision": None,
        "canary": {"lastAnalysis": None},
        "traffic": [{"revision": "b", "weight": 100}],  # lists are replaced whole
    }
    assert merge_diff(new, new) == {}


# ---------------------------------------------------------------------------- observe


def job(**status: Any) -> dict[str, Any]:
    return {"status": status}


def test_job_weights() -> None:
    assert job_weights(None) == ("pending", "pre-pull not started")
    assert job_weights(job(active=1))[0] == "pending"
    assert job_weights(job(succeeded=1)) == ("ready", "")
    assert job_weights(job(conditions=[{"type": "Complete", "status": "True"}])) == ("ready", "")
    failed = job(failed=3, conditions=[{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                        "message": "Job has reached the specified backoff limit"}])
    assert job_weights(failed) == ("failed", "Job has reached the specified backoff limit")
    pod = {"status": {"containerStatuses": [{"state": {"terminated": {
        "exitCode": 1, "message": "digest mismatch: expected sha256:aa, got sha256:bb\n"}}}]}}
    assert job_weights(failed, [pod]) == ("failed", "digest mismatch: expected sha256:aa, got sha256:bb")
    # a failed Job being deleted for a retry no longer fails the revision
    going = {**failed, "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert job_weights(going) == ("pending", "previous pre-pull is being removed")


def test_ready_replicas_and_crash_loops() -> None:
    assert ready_replicas(None) == 0
    assert ready_replicas({"status": {}}) == 0
    assert ready_replicas({"status": {"readyReplicas": 2}}) == 2
    looping = {"status": {"containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    starting = {"status": {"containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    assert crash_looping([starting, looping])
    assert not crash_looping([starting])


def test_overrides_from_annotations() -> None:
    got = overrides({"folio.dev/promote": "", "folio.dev/abort": "yes", "example.com/retry": "x"})
    assert got == frozenset({"promote", "abort"})


def test_router_metrics_urls() -> None:
    def pod(ip: str | None, phase: str = "Running", port: int | None = None) -> dict[str, Any]:
        ports = [{"name": "http", "containerPort": port}] if port else []
        return {"metadata": {}, "status": {"phase": phase, "podIP": ip}, "spec": {"containers": [{"ports": ports}]}}

    pods = [pod("10.0.0.2", port=9090), pod("10.0.0.1"), pod("10.0.0.3", "Pending"), pod(None), pod("fd00::1")]
    assert router_metrics_urls(pods) == [
        "http://10.0.0.1:8080/metrics", "http://10.0.0.2:9090/metrics", "http://[fd00::1]:8080/metrics",
    ]


def test_engine_capacity_scrapes_each_ready_engine_at_its_metrics_port() -> None:
    """The autoscaler reads the engines' /metrics at the `metrics` port the planned pods declare (the
    NetworkPolicy admits the operator there), and at the API port on a pod from before that port."""
    import copy

    from folio.operator.spec import InferenceServiceStatus
    from tests.serving.helpers import make_spec, objects_by_key, revision

    spec = make_spec()
    rev = revision(spec)
    planned = objects_by_key(spec, rev)
    deployment = copy.deepcopy(planned[("Deployment", f"chat-{rev.name}")])
    deployment["status"] = {"readyReplicas": 3}
    template = deployment["spec"]["template"]

    def pod(ip: str, ready: bool = True, old: bool = False) -> dict[str, Any]:
        spec_ = copy.deepcopy(template["spec"])
        if old:  # started by an operator whose engines had no metrics port
            for c in spec_["containers"]:
                c["ports"] = [p for p in c["ports"] if p["name"] != "metrics"]
        ready_ = {"type": "Ready", "status": "True" if ready else "False"}
        return {"metadata": {"labels": dict(template["metadata"]["labels"])}, "spec": spec_,
                "status": {"podIP": ip, "phase": "Running", "conditions": [ready_]}}

    children = Children({key(deployment): deployment},
                        [pod("10.0.0.1"), pod("10.0.0.2", ready=False), pod("fd00::3"), pod("10.0.0.4", old=True)])
    ready, _, urls = engine_capacity(children, "chat", InferenceServiceStatus(revisions=[rev]))
    assert ready == 3
    assert urls == ["http://10.0.0.1:8001/metrics", "http://10.0.0.4:8000/metrics", "http://[fd00::3]:8001/metrics"]


# --------------------------------------------------------------------------- executor


class FakeKube(Kube):
    """Answers scripted errors, records calls; stands in for the API where the emulator cannot."""

    def __init__(self, apply_errors: Sequence[int] = (), create_errors: Sequence[int] = ()) -> None:
        self.apply_errors, self.create_errors = list(apply_errors), list(create_errors)
        self.calls: list[tuple[str, str]] = []

    def apply(self, obj: dict[str, Any], *, force: bool = True) -> dict[str, Any]:
        self.calls.append(("apply", obj["metadata"]["name"]))
        if self.apply_errors:
            raise ApiError(self.apply_errors.pop(0), "Scripted", "scripted")
        return obj

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("create", obj["metadata"]["name"]))
        if self.create_errors:
            raise ApiError(self.create_errors.pop(0), "Scripted", "scripted")
        return obj

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        self.calls.append(("delete", name))
        return True


def children(*objects: dict[str, Any]) -> Children:
    return Children({key(o): o for o in objects})


def obj(kind: str = "Deployment", name: str = "chat", **spec: Any) -> dict[str, Any]:
    api = {"Deployment": "apps/v1", "Job": "batch/v1", "Service": "v1"}[kind]
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def test_apply_creates_on_404_and_reapplies_after_a_create_race() -> None:
    kube = FakeKube(apply_errors=[404])
    assert apply_one(kube, obj()) is True
    assert kube.calls == [("apply", "chat"), ("create", "chat")]
    kube = FakeKube(apply_errors=[404], create_errors=[409])  # someone else created it meanwhile
    assert apply_one(kube, obj()) is False
    assert kube.calls == [("apply", "chat"), ("create", "chat"), ("apply", "chat")]


def test_apply_retries_conflicts_then_gives_up() -> None:
    kube = FakeKube(apply_errors=[409, 409])
    assert apply_one(kube, obj()) is False
    kube = FakeKube(apply_errors=[409, 409, 409])
    with pytest.raises(ApiError) as info:
        apply_one(kube, obj())
    assert info.value.status == 409


def test_apply_raises_other_errors_at_once() -> None:
    kube = FakeKube(apply_errors=[403])
    with pytest.raises(ApiError):
        apply_one(kube, obj())
    assert kube.calls == [("apply", "chat")]


def test_an_immutable_job_is_replaced() -> None:
    kube = FakeKube(apply_errors=[422, 404])
    assert apply_one(kube, obj("Job", "chat-prepull-r1")) is True
    assert kube.calls == [("apply", "chat-prepull-r1"), ("delete", "chat-prepull-r1"),
                          ("apply", "chat-prepull-r1"), ("create", "chat-prepull-r1")]


def test_a_router_role_binding_with_an_old_role_ref_is_replaced() -> None:
    """An older operator bound each router to a Role of its own; roleRef is immutable (422 on apply)."""
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "chat-router", "namespace": "ml"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "folio-router"}}
    kube = FakeKube(apply_errors=[422])
    assert apply_one(kube, binding) is False
    assert kube.calls == [("apply", "chat-router"), ("delete", "chat-router"), ("apply", "chat-router")]


def test_apply_plan_skips_what_is_in_place_and_prunes_what_is_not_planned() -> None:
    in_place = obj("Deployment", "chat", replicas=2)
    live_in_place = {**in_place, "status": {"readyReplicas": 2},
                     "spec": {"replicas": 2, "strategy": {"type": "RollingUpdate"}}}  # server defaults added
    drifted = obj("Service", "chat", ports=[{"port": 80}])
    new = obj("Job", "chat-prepull-new")
    stale = obj("Job", "chat-prepull-old")
    kube = FakeKube()
    live = children(live_in_place, {**drifted, "spec": {"ports": [{"port": 8080}]}}, stale)
    result = apply_plan(kube, [in_place, drifted, new], live, Expectations())
    assert kube.calls == [("apply", "chat"), ("apply", "chat-prepull-new"), ("delete", "chat-prepull-old")]
    assert result.applied == [("v1", "Service", "chat")]
    assert result.created == [("batch/v1", "Job", "chat-prepull-new")]
    assert result.deleted == [("batch/v1", "Job", "chat-prepull-old")]


def test_a_write_the_index_has_not_caught_up_with_is_not_repeated() -> None:
    """The watch lags the write: the next pass must not create again what it just created, nor look
    at what it just deleted; once the index shows the write (or the expectation expires), it does."""
    kube, expect = FakeKube(), Expectations()
    new, stale = obj("Job", "chat-prepull-new"), obj("Job", "chat-prepull-old")
    assert apply_plan(kube, [new], children(stale), expect).created == [key(new)]
    again = apply_plan(kube, [new], expect.view(children(stale)), expect)  # the index still shows the old world
    assert (again.created, again.applied, again.deleted) == ([], [], [])
    assert kube.calls == [("apply", "chat-prepull-new"), ("delete", "chat-prepull-old")]
    # The index catches up: the expectations are settled, and a later loss of the object is repaired.
    assert expect.view(children(new)).objects == {key(new): new}
    assert not expect.applied and not expect.deleted
    assert apply_plan(kube, [new], expect.view(children()), expect).created == [key(new)]
    # A changed desired object is applied at once, expectation or not.
    changed = obj("Job", "chat-prepull-new", backoffLimit=5)
    assert apply_plan(kube, [changed], expect.view(children()), expect).created == [key(changed)]
    # An expectation the index never meets is given up.
    later = expect.view(children(stale), now=time.monotonic() + 3600)
    assert key(stale) in later.objects and not expect.applied and not expect.deleted


def test_contains() -> None:
    assert contains({"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}}, {"b": {"c": [1, {"d": 2}]}})
    assert not contains({"b": {"c": [1]}}, {"b": {"c": [1, 2]}})
    assert not contains({"a": "1"}, {"a": 1})
    assert not contains({}, {"a": None})


# ------------------------------------------------------------------------- controller


def test_operator_command_line() -> None:
    parser = argparse.ArgumentParser()
    controller.add_arguments(parser)
    args = parser.parse_args(["-n", "ml", "-n", "prod", "--resync-seconds", "5", "--metrics-port", "0"])
    assert args.namespace == ["ml", "prod"] and not args.all_namespaces and args.resync_seconds == 5
    assert parser.parse_args(["--all-namespaces"]).all_namespaces
    with pytest.raises(SystemExit):
        parser.parse_args(["-n", "ml", "--all-namespaces"])


def test_operator_main_wires_kopf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    point_kubeconfig_at_nothing(tmp_path, monkeypatch)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    captured: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: captured.update(kwargs))
    parser = argparse.ArgumentParser()
    controller.add_arguments(parser)
    args = parser.parse_args(["-n", "ml", "--metrics-port", "0", "--health-port", "0", "--peering", "",
                              "--image", "registry.example/folio:2"])
    assert controller.main(args) == 0
    assert captured["namespaces"] == ["ml"] and captured["standalone"] is True
    assert captured["settings"].persistence.finalizer == "folio.dev/finalizer"
    ctx = captured["memo"].ctx
    assert ctx.plan_settings.image == "registry.example/folio:2"
    assert ctx.kube.client.configuration.host == "http://127.0.0.1:1"
    logins = [h.fn for h in captured["registry"]._activities.get_all_handlers()]
    assert kopf.login_via_client in logins  # a custom registry has no login of its own
