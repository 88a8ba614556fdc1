"""Which optional kinds the cluster serves: children whose CRD may not be installed.

An InferenceService may ask for a child of a kind from someone else's CRD (the Gateway API inference
extension's InferencePool). Where that CRD is absent, kopf leaves the kind's index empty and an apply
would fail every pass; instead the pass leaves such children out of the plan, keeps serving, and
reports the gap in status (`rollout.Observed.unavailable`, then Degraded=True with the reason below and
a Warning Event). The answer is kept for `TTL_S`, so a CRD installed later is picked up within it
without one discovery call per pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from folio.operator.k8s.client import Kube
from folio.operator.k8s.names import INFERENCE_POOL, PLURALS
from folio.operator.serving.inference_pool import wanted
from folio.operator.serving.objects import PlanSettings
from folio.operator.spec import InferenceServiceSpec

TTL_S = 30.0

Kind = tuple[str, str]  # (apiVersion, kind)

# Optional kind -> (the condition's reason, what to tell the user) when the cluster does not serve it.
OPTIONAL: dict[Kind, tuple[str, str]] = {
    INFERENCE_POOL: (
        "InferencePoolUnavailable",
        f"an InferencePool is asked for (spec.router.inferencePool, or the operator's --inference-pool), "
        f"but the cluster does not serve {PLURALS[INFERENCE_POOL]}.{INFERENCE_POOL[0].split('/')[0]} "
        f"({INFERENCE_POOL[0]}): install the Gateway API inference extension's CRDs. "
        f"Serving goes on through Folio's router without it",
    ),
}


def asked_for(spec: InferenceServiceSpec, settings: PlanSettings) -> list[Kind]:
    """The optional kinds among the children `spec` asks for (whatever its rollout's state)."""
    return [INFERENCE_POOL] if wanted(spec.router.inference_pool, settings.inference_pool) else []


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
