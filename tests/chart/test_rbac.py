"""The operator's RBAC is exactly what `folio operator` does: an explicit allow-list, checked both ways."""

from __future__ import annotations

import pytest

from folio.operator.k8s.names import MANAGED_KINDS
from folio.operator.serving.objects import Owner, PlanSettings, router_objects
from folio.operator.spec import InferenceServiceSpec
from tests.chart import helm as h

Rule = tuple[str, str]  # (apiGroup, resource)

# Every permission the operator holds, and why. A new need is added here on purpose, in review.
ALLOWED: dict[Rule, frozenset[str]] = {
    # kopf: list+watch the custom resource, patch finalizers/annotations, then status on its subresource
    ("serving.folio.dev", "inferenceservices"): frozenset({"get", "list", "watch", "patch"}),
    ("serving.folio.dev", "inferenceservices/status"): frozenset({"patch"}),
    ("serving.folio.dev", "inferenceservices/finalizers"): frozenset({"update"}),  # blockOwnerDeletion
    # the planner's objects: server-side apply, create where apply cannot, prune; indexed (list+watch)
    ("apps", "deployments"): frozenset({"get", "list", "watch", "create", "patch", "delete"}),
    ("", "services"): frozenset({"get", "list", "watch", "create", "patch", "delete"}),
    ("", "serviceaccounts"): frozenset({"get", "list", "watch", "create", "patch", "delete"}),
    ("", "persistentvolumeclaims"): frozenset({"get", "list", "watch", "create", "patch", "delete"}),
    ("batch", "jobs"): frozenset({"get", "list", "watch", "create", "patch", "delete"}),
    ("policy", "poddisruptionbudgets"): frozenset({"get", "list", "watch", "create", "patch", "delete"}),
    ("rbac.authorization.k8s.io", "roles"): frozenset({"get", "list", "watch", "create", "patch", "delete"}),
    ("rbac.authorization.k8s.io", "rolebindings"): frozenset({"get", "list", "watch", "create", "patch", "delete"}),
    # observation, indexed: crash loops, pre-pull failures, router pods for the analysis
    ("", "pods"): frozenset({"get", "list", "watch"}),
    # held only so that the operator may grant them to each router's Role
    ("discovery.k8s.io", "endpointslices"): frozenset({"get", "list", "watch"}),
    ("", "secrets"): frozenset({"get"}),
    ("", "events"): frozenset({"create"}),
    # spec.autoscaling.keda: the planner's ScaledObjects
    ("keda.sh", "scaledobjects"): frozenset({"get", "list", "watch", "create", "patch", "delete"}),
}
PEERING = {
    False: {("kopf.dev", "kopfpeerings"): frozenset({"get", "list", "watch", "patch"})},
    True: {("kopf.dev", "clusterkopfpeerings"): frozenset({"get", "list", "watch", "patch"})},
}
NEVER = {"*", "escalate", "bind", "impersonate", "deletecollection"}


def granted(role: h.Obj) -> dict[Rule, frozenset[str]]:
    out: dict[Rule, set[str]] = {}
    for rule in role["rules"]:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return {k: frozenset(v) for k, v in out.items()}


def _role(objects: list[h.Obj]) -> h.Obj:
    (role,) = h.find(objects, "Role") + h.find(objects, "ClusterRole")
    return role


@pytest.mark.parametrize(
    ("name", "clusterwide", "peering"),
    [
        ("defaults", False, False),
        ("all-namespaces", True, False),
        ("peering-namespaced", False, True),
        ("peering-cluster", True, True),
    ],
)
def test_rules_are_exactly_the_allow_list(rendered: dict[str, list[h.Obj]], name: str, clusterwide: bool,
                                          peering: bool) -> None:
    role = _role(rendered[name])
    expected = {**ALLOWED, **(PEERING[clusterwide] if peering else {})}
    assert granted(role) == expected
    for rule in role["rules"]:
        assert not NEVER & set(rule["verbs"]) and "*" not in rule["resources"] and "*" not in rule["apiGroups"]


@pytest.mark.parametrize(
    ("name", "kind", "namespace"),
    [
        ("defaults", "Role", h.NAMESPACE),
        ("peering-namespaced", "Role", "models"),  # the watched namespace, not the release's
        ("all-namespaces", "ClusterRole", None),
        ("peering-cluster", "ClusterRole", None),
    ],
)
def test_cluster_scope_only_for_all_namespaces(rendered: dict[str, list[h.Obj]], name: str, kind: str,
                                               namespace: str | None) -> None:
    objects = rendered[name]
    role = _role(objects)
    (binding,) = h.find(objects, f"{kind}Binding")
    assert role["kind"] == kind
    assert role["metadata"].get("namespace") == namespace == binding["metadata"].get("namespace")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": kind,
                                  "name": role["metadata"]["name"]}
    account = h.one(objects, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": h.NAMESPACE}]
    pod = h.one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    if kind == "Role":
        assert not h.find(objects, "ClusterRole") and not h.find(objects, "ClusterRoleBinding")


def test_every_kind_the_executor_manages_is_granted() -> None:
    plurals = {
        ("apps/v1", "Deployment"): ("apps", "deployments"), ("v1", "Service"): ("", "services"),
        ("v1", "ServiceAccount"): ("", "serviceaccounts"),
        ("v1", "PersistentVolumeClaim"): ("", "persistentvolumeclaims"), ("batch/v1", "Job"): ("batch", "jobs"),
        ("policy/v1", "PodDisruptionBudget"): ("policy", "poddisruptionbudgets"),
        ("rbac.authorization.k8s.io/v1", "Role"): ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rbac.authorization.k8s.io", "rolebindings"),
        ("keda.sh/v1alpha1", "ScaledObject"): ("keda.sh", "scaledobjects"),
    }
    assert set(MANAGED_KINDS) == set(plurals), "the executor manages a kind this test does not know"
    for kind in MANAGED_KINDS:
        assert {"get", "list", "watch", "create", "patch", "delete"} <= ALLOWED[plurals[kind]]


def test_every_kind_the_operator_indexes_may_be_watched() -> None:
    from folio.operator.controller.children import INDEXED_KINDS
    from folio.operator.k8s.names import PLURALS

    for api_version, kind in INDEXED_KINDS:
        group = api_version.rpartition("/")[0]
        assert {"list", "watch"} <= ALLOWED[(group, PLURALS[(api_version, kind)])], kind


def test_operator_can_grant_the_router_role(rendered: dict[str, list[h.Obj]]) -> None:
    """RBAC refuses to create a Role granting more than its creator holds: check the planner's router Role."""
    spec = InferenceServiceSpec.model_validate({
        "model": {"source": "hf://org/model", "revision": "0" * 40},
        "overflow": {"url": "https://api.example", "apiKeySecretRef": {"name": "overflow-key"}},
    })
    objects = router_objects(Owner("chat", "models", "uid-1"), spec, PlanSettings())
    (router_role,) = [o for o in objects if o["kind"] == "Role"]
    held = granted(_role(rendered["defaults"]))
    for rule in router_role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                missing = set(rule["verbs"]) - held.get((group, resource), frozenset())
                assert not missing, f"operator cannot grant {sorted(missing)} on {group or 'core'}/{resource}"
