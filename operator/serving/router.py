"""The router config of an InferenceService: decided here, for the cluster's routers and `folio up`'s.

A router follows typed status: ``traffic`` (the weights the rollout decided), the stable revision
(where failed attempts are retried) and the canary (where shadow copies go), plus the ready
endpoints of each revision it may send to and the spec's shadow and overflow settings. The
in-cluster router builds it from its InferenceService and the revisions' EndpointSlices;
`folio up` from its status and its engine processes, and writes it to the file its router follows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from folio.operator.rollout import parity_gate
from folio.operator.router.config import RouterConfig
from folio.operator.spec import AutoscalingSpec, InferenceServiceSpec, InferenceServiceStatus


def routable(status: InferenceServiceStatus) -> list[str]:
    """The revisions a router may send a request to: those in ``traffic``, the stable and the canary."""
    names = {t.revision for t in status.traffic} | {status.stable_revision, status.canary_revision}
    return sorted(n for n in names if n)


def router_config(
    spec: InferenceServiceSpec | None,
    status: InferenceServiceStatus,
    endpoints: Mapping[str, Sequence[str]],
    *,
    overflow_api_key: str | None = None,
) -> RouterConfig:
    """What a router should do now; ``endpoints`` maps a revision to its ready replicas' base URLs.

    ``spec`` None (it could not be read) leaves shadow and overflow out. Raises
    `folio.operator.router.config.ConfigError` when the result is not a usable config.
    """
    data: dict[str, Any] = {
        "traffic": [t.to_wire() for t in status.traffic],
        "endpoints": {rev: list(endpoints.get(rev, ())) for rev in routable(status)},
        "stable": status.stable_revision,
        "canary": status.canary_revision,
    }
    if spec is not None and spec.shadow is not None and not parity_gate.holds_shadow(spec, status):
        data["shadow"] = spec.shadow.to_wire()  # (a canary waiting for its parity gate gets no user request)
    if spec is not None:
        data["outlierDetection"] = spec.router.outlier_detection.to_wire()
        data["requestTimeout"] = spec.rollout.analysis.request_timeout
        data["loadBalancing"] = spec.router.load_balancing.to_wire()
    if spec is not None and spec.autoscaling is not None:
        data["holding"] = holding(spec.autoscaling)
    if spec is not None and spec.overflow is not None:
        data["overflow"] = {"url": spec.overflow.url, "apiKey": overflow_api_key}
    return RouterConfig.parse(data)


def holding(auto: AutoscalingSpec) -> dict[str, Any]:
    """How the router holds requests while a revision scales up from zero. Held requests are released
    as many at a time per ready replica as the autoscaler aims to give it (InFlight's target)."""
    per_replica = max(1, int(auto.target)) if auto.metric == "InFlight" else 4
    return {"maxHeldRequests": auto.max_held_requests, "holdTimeout": auto.hold_timeout_seconds,
            "releasePerReplica": per_replica}
