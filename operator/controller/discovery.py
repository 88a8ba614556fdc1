"""Which optional kinds the cluster serves: children whose CRD may not be installed.

An InferenceService may ask for a child of a kind from someone else's CRD; `OPTIONALS` lists each one
Folio may create (every kind of `MANAGED_KINDS` outside Kubernetes' own groups), table-driven:

| kind                                           | asked for by                                         | reason when absent          |
| ---------------------------------------------- | ---------------------------------------------------- | --------------------------- |
| InferencePool (inference.networking.k8s.io/v1) | spec.router.inferencePool (or --inference-pool)      | InferencePoolUnavailable    |
| HTTPRoute (gateway.networking.k8s.io/v1)       | spec.router.gateway, with InferencePools             | HTTPRouteUnavailable        |
| ScaledObject (keda.sh/v1alpha1)                | spec.autoscaling.keda                                | ScaledObjectUnavailable     |
| LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)  | a replica spanning several pods (args and GPUs)      | LeaderWorkerSetUnavailable  |

A service that asks for none of them never looks (no discovery call, nothing in status). Where the CRD
of one it asks for is absent, kopf leaves the kind's index empty and an apply would fail every pass; instead the pass leaves such children out of the plan, keeps serving, and
reports the gap in status (`rollout.Observed.unavailable`, then Degraded=True with the reason below and
a Warning Event). The answer is kept for `TTL_S`, so a CRD installed later is picked up within it
without one discovery call per pass (and `watches.Watches` has kopf watch the kind from then on).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from folio.operator.k8s.client import Kube
from folio.operator.k8s.names import HTTP_ROUTE, INFERENCE_POOL, LEADER_WORKER_SET, PLURALS, SCALED_OBJECT
from folio.operator.serving import keda, parallel
from folio.operator.serving.inference_pool import wanted
from folio.operator.serving.objects import PlanSettings
from folio.operator.spec import InferenceServiceSpec

TTL_S = 30.0

Kind = tuple[str, str]  # (apiVersion, kind)


def _crd(kind: Kind) -> str:
    """The CRD's name: ``{plural}.{group}``."""
    return f"{PLURALS[kind]}.{kind[0].split('/')[0]}"


@dataclass(frozen=True)
class OptionalKind:
    """One optional kind: who asks for it, and what status says when the cluster does not serve it."""

    kind: Kind
    reason: str  # the Degraded condition's reason
    message: str  # what to tell the user: which CRD to install, and how serving goes on without it
    asks: Callable[[InferenceServiceSpec, PlanSettings], bool]


OPTIONALS: tuple[OptionalKind, ...] = (
    OptionalKind(
        INFERENCE_POOL,
        "InferencePoolUnavailable",
        f"an InferencePool is asked for (spec.router.inferencePool, or the operator's --inference-pool), "
        f"but the cluster does not serve {_crd(INFERENCE_POOL)} ({INFERENCE_POOL[0]}): install the Gateway "
        f"API inference extension's CRDs. Serving goes on through Folio's router without it",
        lambda spec, settings: wanted(spec.router.inference_pool, settings.inference_pool),
    ),
    OptionalKind(
        HTTP_ROUTE,
        "HTTPRouteUnavailable",
        f"an HTTPRoute over the InferencePools is asked for (spec.router.gateway), but the cluster does not serve "
        f"{_crd(HTTP_ROUTE)} ({HTTP_ROUTE[0]}): install the Gateway API's CRDs. Serving goes on through "
        f"Folio's router without it",
        lambda spec, settings: spec.router.gateway is not None
        and wanted(spec.router.inference_pool, settings.inference_pool),
    ),
    OptionalKind(
        SCALED_OBJECT,
        "ScaledObjectUnavailable",
        f"KEDA scaling is asked for (spec.autoscaling.keda), but the cluster does not serve "
        f"{_crd(SCALED_OBJECT)} ({SCALED_OBJECT[0]}): install KEDA (its CRDs and operator). "
        f"Serving goes on, scaled by Folio's own autoscaler, until it is installed",
        lambda spec, settings: keda.enabled(spec),
    ),
    OptionalKind(
        LEADER_WORKER_SET,
        "LeaderWorkerSetUnavailable",
        f"a replica spans several pods (tensorParallelSize × pipelineParallelSize needs more GPUs than "
        f"spec.engine.resources gives one pod), but the cluster does not serve {_crd(LEADER_WORKER_SET)} "
        f"({LEADER_WORKER_SET[0]}): install LeaderWorkerSet (kubernetes-sigs/lws). The revision's engines "
        f"cannot start until it is installed; revisions already serving go on",
        lambda spec, settings: parallel.group_size(spec.engine, spec.engine.args) > 1,
    ),
)
# Optional kind -> (the condition's reason, what to tell the user) when the cluster does not serve it.
OPTIONAL: dict[Kind, tuple[str, str]] = {o.kind: (o.reason, o.message) for o in OPTIONALS}


def asked_for(spec: InferenceServiceSpec, settings: PlanSettings) -> list[Kind]:
    """The optional kinds among the children `spec` asks for (whatever its rollout's state)."""
    return [o.kind for o in OPTIONALS if o.asks(spec, settings)]


@dataclass
class Discovery:
    kube: Kube
    ttl_s: float = TTL_S
    clock: Callable[[], float] = time.monotonic
    _known: dict[Kind, tuple[bool, float]] = field(default_factory=dict)

    def serves(self, kind: Kind) -> bool:
        """Whether the cluster serves `kind` (synchronous: a discovery call at most once per `ttl_s`)."""
        now = self.clock()
        known = self._known.get(kind)
        if known is not None and now - known[1] < self.ttl_s:
            return known[0]
        served = self.kube.serves(*kind)
        self._known[kind] = (served, now)
        return served

    def unavailable(self, kinds: Iterable[Kind]) -> list[Kind]:
        """Of `kinds`, the optional ones the cluster does not serve (each once, in order)."""
        out: list[Kind] = []
        for kind in kinds:
            if kind in OPTIONAL and kind not in out and not self.serves(kind):
                out.append(kind)
        return out
