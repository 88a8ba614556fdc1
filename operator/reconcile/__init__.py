"""One reconcile pass of an InferenceService, the same for the operator and `folio up`.

    validate → observe → sample → gate → advance → scale → execute

    passes   `run_pass`: the pass, in that order, and `Memory`, what it keeps between passes
    runtime  `Runtime`: where a pass runs (the cluster, or this machine): what it observes, how it executes
    scale    the autoscaling step: the runtime's load sources read and decided on

The pass is the only place where the parts meet: the spec's validation (`folio.operator.serving.validate`),
the analysis sampler (`folio.operator.analysis`), the parity gate (`folio.operator.parity`), the rollout
state machine (`folio.operator.rollout.advance`), the autoscaler (`folio.operator.autoscaling`) and the
serving plan (`folio.operator.serving.plan`). A new observed fact is added to `Runtime.observe` and read
by the pure parts; it is never grafted onto one runtime's loop.
"""

from folio.operator.reconcile.passes import Memory, Outcome, Target, run_pass
from folio.operator.reconcile.runtime import Capacity, Runtime

__all__ = ["Capacity", "Memory", "Outcome", "Runtime", "Target", "run_pass"]
