"""The operator's RBAC is exactly what `folio operator` does: an explicit allow-list, checked both ways."""

from __future__ import annotations

import pytest

from folio.operator.k8s.names import MANAGED_KINDS
from folio.operator.serving.objects import Owner, PlanSettings, router_objects
from folio.operator.spec import InferenceServiceSpec
from tests.chart import helm as h

Rule = tuple[str, str]  # (apiGroup, resource)

# Every permission the operator holds, and why. A new need is added here on purpose, in review;
# tests/operator/test_api_calls.py checks these against what the operator really calls.
ALLOWED: dict[Rule, frozenset[str]] = {
    # kopf: list+watch the custom resource, patch finalizers/annotations, then status on its subresource
    ("serving.folio.dev", "inferenceservices"): frozenset({"get", "list", "watch", "patch"}),
    ("serving.folio.dev", "inferenceservices/status"): frozenset({"patch"}),
    ("serving.folio.dev", "inferenceservices/finalizers"): frozenset({"update"}),  # blockOwnerDeletion
    # fleet rollouts: RolloutPolicies indexed and clocked by kopf (finalizer: patch), read by name, status written
    ("serving.folio.dev", "rolloutpolicies"): frozenset({"get", "list", "watch", "patch"}),
    ("serving.folio.dev", "rolloutpolicies/status"): frozenset({"patch"}),
    # the planner's objects: server-side apply (create through apply needs `create`), prune; indexed
    ("apps", "deployments"): frozenset({"list", "watch", "create", "patch", "delete"}),
    ("", "services"): frozenset({"list", "watch", "create", "patch", "delete"}),
    ("", "serviceaccounts"): frozenset({"list", "watch", "create", "patch", "delete"}),
    ("", "persistentvolumeclaims"): frozenset({"list", "watch", "create", "patch", "delete"}),
    ("batch", "jobs"): frozenset({"list", "watch", "create", "patch", "delete"}),
    ("policy", "poddisruptionbudgets"): frozenset({"list", "watch", "create", "patch", "delete"}),
    ("rbac.authorization.k8s.io", "roles"): frozenset({"list", "watch", "create", "patch", "delete"}),
    ("rbac.authorization.k8s.io", "rolebindings"): frozenset({"list", "watch", "create", "patch", "delete"}),
    ("networking.k8s.io", "networkpolicies"): frozenset({"list", "watch", "create", "patch", "delete"}),
    # observation, indexed: crash loops, pre-pull failures, router pods for the analysis
    ("", "pods"): frozenset({"list", "watch"}),
    # the adapters readiness gate of engine pods (serving.folio.dev/adapters-loaded)
    ("", "pods/status"): frozenset({"patch"}),
    ("", "events"): frozenset({"create"}),
    # a parity gate's own suite (spec.rollout.parity.configMapRef), read by name
    ("", "configmaps"): frozenset({"get"}),
    # spec.access: the routers' Role reads its Secret of API keys (the operator must hold what it grants);
    # the operator reads it by name to report its problems in status
    ("", "secrets"): frozenset({"get", "list", "watch"}),
    # the opt-in Gateway API InferencePool per InferenceService (spec.router.inferencePool)
    ("inference.networking.k8s.io", "inferencepools"): frozenset({"list", "watch", "create", "patch", "delete"}),
    # ...and the HTTPRoute splitting a Gateway's traffic over those pools (spec.router.gateway)
    ("gateway.networking.k8s.io", "httproutes"): frozenset({"list", "watch", "create", "patch", "delete"}),
    # spec.autoscaling.keda: the planner's ScaledObjects, indexed like the rest (no get)
    ("keda.sh", "scaledobjects"): frozenset({"list", "watch", "create", "patch", "delete"}),
    # a revision whose replica spans several pods: its LeaderWorkerSet, indexed like the Deployments (no get)
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): frozenset({"list", "watch", "create", "patch", "delete"}),
}
# `bind` on exactly one ClusterRole (the chart's router role), never on anything else.
BIND = ("rbac.authorization.k8s.io", "clusterroles")
PEERING = {
    False: {("kopf.dev", "kopfpeerings"): frozenset({"get", "list", "watch", "patch"})},
    True: {("kopf.dev", "clusterkopfpeerings"): frozenset({"get", "list", "watch", "patch"})},
}
ROUTER_ROLE: dict[Rule, frozenset[str]] = {
    ("serving.folio.dev", "inferenceservices"): frozenset({"get", "list", "watch"}),
    ("discovery.k8s.io", "endpointslices"): frozenset({"get", "list", "watch"}),
}
# The endpoint pickers' (operator.inferencePool.endpointPickerImage): read their pool and its pods.
PICKER_ROLE: dict[Rule, frozenset[str]] = {
    ("", "pods"): frozenset({"get", "list", "watch"}),
    ("inference.networking.k8s.io", "inferencepools"): frozenset({"get", "list", "watch"}),
    ("inference.networking.x-k8s.io", "inferenceobjectives"): frozenset({"get", "list", "watch"}),
    ("inference.networking.x-k8s.io", "inferencemodelrewrites"): frozenset({"get", "list", "watch"}),
}
NEVER = {"*", "escalate", "impersonate", "deletecollection"}


def granted(role: h.Obj, *, bind_to: str | None = None) -> dict[Rule, frozenset[str]]:
    out: dict[Rule, set[str]] = {}
    for rule in role["rules"]:
        assert not rule.get("nonResourceURLs")
        if (rule["apiGroups"], rule["resources"]) == ([BIND[0]], [BIND[1]]):
            assert rule["verbs"] == ["bind"] and rule["resourceNames"] == [bind_to], rule
            continue
        assert not rule.get("resourceNames") and "bind" not in rule["verbs"], rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return {k: frozenset(v) for k, v in out.items()}


def _role(objects: list[h.Obj]) -> h.Obj:
    (role,) = [r for r in h.find(objects, "Role") + h.find(objects, "ClusterRole")
               if not r["metadata"]["name"].endswith(("-router", "-endpoint-picker"))]
    return role


def _router_role(objects: list[h.Obj]) -> h.Obj:
    (role,) = [r for r in h.find(objects, "ClusterRole") if r["metadata"]["name"].endswith("-router")]
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
    router_role = _router_role(rendered[name])["metadata"]["name"]
    assert granted(role, bind_to=router_role) == expected
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
    if kind == "Role":  # the one cluster-scoped object is the routers' role, bound per namespace
        assert [r["metadata"]["name"] for r in h.find(objects, "ClusterRole")] == [f"{h.RELEASE}-router"]
        assert not h.find(objects, "ClusterRoleBinding")


def test_every_kind_the_executor_manages_is_granted() -> None:
    plurals = {
        ("apps/v1", "Deployment"): ("apps", "deployments"), ("v1", "Service"): ("", "services"),
        ("v1", "ServiceAccount"): ("", "serviceaccounts"),
        ("v1", "PersistentVolumeClaim"): ("", "persistentvolumeclaims"), ("batch/v1", "Job"): ("batch", "jobs"),
        ("policy/v1", "PodDisruptionBudget"): ("policy", "poddisruptionbudgets"),
        ("rbac.authorization.k8s.io/v1", "Role"): ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rbac.authorization.k8s.io", "rolebindings"),
        ("networking.k8s.io/v1", "NetworkPolicy"): ("networking.k8s.io", "networkpolicies"),
        ("inference.networking.k8s.io/v1", "InferencePool"): ("inference.networking.k8s.io", "inferencepools"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"): ("gateway.networking.k8s.io", "httproutes"),
        ("keda.sh/v1alpha1", "ScaledObject"): ("keda.sh", "scaledobjects"),
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): ("leaderworkerset.x-k8s.io", "leaderworkersets"),
    }
    assert set(MANAGED_KINDS) == set(plurals), "the executor manages a kind this test does not know"
    for kind in MANAGED_KINDS:
        assert {"list", "watch", "create", "patch", "delete"} <= ALLOWED[plurals[kind]]


def test_every_kind_the_operator_indexes_may_be_watched() -> None:
    from folio.operator.controller.children import INDEXED_KINDS
    from folio.operator.k8s.names import PLURALS

    for api_version, kind in INDEXED_KINDS:
        group = api_version.rpartition("/")[0]
        assert {"list", "watch"} <= ALLOWED[(group, PLURALS[(api_version, kind)])], kind


@pytest.mark.parametrize("name", ["defaults", "all-namespaces"])
def test_operator_binds_the_charts_router_role(rendered: dict[str, list[h.Obj]], name: str) -> None:
    """The planner's RoleBinding refers to the ClusterRole the chart makes, which the operator may bind."""
    spec = InferenceServiceSpec.model_validate({
        "model": {"source": "hf://org/model", "revision": "0" * 40},
        "overflow": {"url": "https://api.example", "apiKeySecretRef": {"name": "overflow-key"}},
    })
    router_role = _router_role(rendered[name])
    assert granted(router_role) == ROUTER_ROLE  # no Secret: the overflow key is a mounted volume
    deployment = h.one(rendered[name], "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--router-cluster-role={router_role['metadata']['name']}" in args
    settings = PlanSettings(router_cluster_role=router_role["metadata"]["name"])
    objects = router_objects(Owner("chat", "models", "uid-1"), spec, settings)
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": router_role["metadata"]["name"]}
    assert not [o for o in objects if o["kind"] in ("Role", "ClusterRole")]


def test_with_access_the_routers_may_read_their_one_secret_which_the_operator_may_grant() -> None:
    spec = InferenceServiceSpec.model_validate({
        "model": {"source": "hf://org/model", "revision": "0" * 40},
        "access": {"apiKeysSecretRef": {"name": "llm-keys"}, "tenants": [{"name": "search"}]},
    })
    objects = router_objects(Owner("chat", "models", "uid-1"), spec, PlanSettings())
    (role,) = [o for o in objects if o["kind"] == "Role"]
    assert role["metadata"]["name"] == "chat-router-keys" and role["metadata"]["namespace"] == "models"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["llm-keys"],
                              "verbs": ["get", "list", "watch"]}]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding" and o["roleRef"]["kind"] == "Role"]
    assert binding["roleRef"]["name"] == "chat-router-keys"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chat-router", "namespace": "models"}]
    # the API server lets the operator grant only what it holds itself
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert set(rule["verbs"]) <= ALLOWED[(group, resource)]
    without = spec.model_copy(update={"access": None})
    assert not [o for o in router_objects(Owner("chat", "models", "uid-1"), without, PlanSettings())
                if o["kind"] == "Role"]


def test_the_operator_binds_the_charts_endpoint_picker_role_only_when_it_deploys_pickers(
    rendered: dict[str, list[h.Obj]],
) -> None:
    """With an endpoint-picker image the chart makes the pickers' read-only ClusterRole, and the operator may
    bind it (besides the routers'), not hold its rules; without one there is neither."""
    assert not [r for r in h.find(rendered["defaults"], "ClusterRole") if r["metadata"]["name"].endswith("-picker")]
    objects = rendered["observability"]
    (picker_role,) = [r for r in h.find(objects, "ClusterRole") if r["metadata"]["name"].endswith("-endpoint-picker")]
    assert granted(picker_role) == PICKER_ROLE
    role = _role(objects)
    (bind,) = [r for r in role["rules"] if "bind" in r["verbs"]]
    assert bind["resourceNames"] == [_router_role(objects)["metadata"]["name"], picker_role["metadata"]["name"]]
    without_bind = {**role, "rules": [r for r in role["rules"] if r is not bind]}
    assert granted(without_bind) == ALLOWED
    args = h.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--endpoint-picker-cluster-role={picker_role['metadata']['name']}" in args


def test_the_security_docs_table_lists_exactly_the_allow_list() -> None:
    # docs/security.md's table of the operator's Role, row by row: each resource (named in backticks, the
    # API group in parentheses where it is not the core or Folio's) with its verbs, as the allow-list says
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    table = text.split("The operator's Role", 1)[1].split("\n\n", 2)[1]
    documented: dict[str, frozenset[str]] = {}
    for row in table.splitlines()[2:]:
        resources, verbs = row.split("|")[1:3]
        # resources are plain lowercase words; groups (`keda.sh`) and names (`<release>-router`) are not
        for name in (t for t in re.findall(r"`([^`]+)`", resources) if re.fullmatch(r"[a-z/]+", t)):
            documented[name] = frozenset(v.strip() for v in verbs.split(","))
    expected = {resource: verbs for (_, resource), verbs in {**ALLOWED, **PEERING[False], **PEERING[True]}.items()}
    expected[BIND[1]] = frozenset({"bind"})
    assert documented == expected
