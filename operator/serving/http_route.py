"""The HTTPRoute that splits a Gateway's traffic over an InferenceService's InferencePools.

With InferencePools (`folio.operator.serving.inference_pool`) and `spec.router.gateway`, Folio publishes
one `gateway.networking.k8s.io/v1` HTTPRoute named after the InferenceService, attached to that Gateway
(the platform team's), whose one rule sends the OpenAI API's paths (`API_PATHS`: never the engines' others,
such as their runtime adapter endpoints) to the revisions' pools with the weights of
`status.traffic`: stable 100 - w and canary w at a canary step, 100/0 after a promotion or a rollback,
0 for a revision that is running but takes no traffic (a retiring one, a canary still starting). The
rollout writes `status.traffic` at every step and every pass renders the route from it, so the
Gateway follows the same split as Folio's router. Without a Gateway to attach to there is no route
(the pools alone, for a route of the platform's own).

The schema it must satisfy is vendored in `tests/serving/schemas/` with its version and source.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from folio.operator.k8s.names import HTTP_ROUTE, PLURALS, base_labels, http_route_name, inference_pool_name
from folio.operator.serving.inference_pool import GROUP as POOL_GROUP
from folio.operator.serving.inference_pool import KIND as POOL_KIND
from folio.operator.spec import GatewayRef, TrafficTarget

Obj = dict[str, Any]

API_VERSION, KIND = HTTP_ROUTE  # declared in k8s.names, with its plural
# What a client may reach through the Gateway: the paths Folio's own router serves too
API_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/models")
GROUP = API_VERSION.split("/")[0]
PLURAL = PLURALS[HTTP_ROUTE]


def weights(revisions: Iterable[str], traffic: Sequence[TrafficTarget]) -> dict[str, int]:
    """Each running revision's share of the Gateway's traffic: its weight in status.traffic, else 0."""
    split = {t.revision: t.weight for t in traffic}
    return {rev: split.get(rev, 0) for rev in revisions}


def http_route(
    isvc: str, namespace: str, gateway: GatewayRef, revisions: Iterable[str], traffic: Sequence[TrafficTarget],
    owner_reference: Obj,
) -> Obj:  # fmt: skip
    parent: Obj = {"group": GROUP, "kind": "Gateway", "name": gateway.name}
    if gateway.namespace:
        parent["namespace"] = gateway.namespace
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    backends = [
        {"group": POOL_GROUP, "kind": POOL_KIND, "name": inference_pool_name(isvc, rev), "weight": weight}
        for rev, weight in weights(revisions, traffic).items()
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": http_route_name(isvc), "namespace": namespace, "labels": base_labels(isvc),
                     "ownerReferences": [owner_reference]},
        "spec": {
            "parentRefs": [parent],
            "rules": [{"matches": [{"path": {"type": "Exact", "value": p}} for p in API_PATHS],
                       "backendRefs": backends}],
        },
    }
