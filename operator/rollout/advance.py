"""`advance`: one pass of the rollout state machine, the order of its parts.

Each part reads and writes the same working copy (`state.Pass`); the order matters: drained
revisions go and overrides are read first, the spec's revision is admitted, broken revisions fail
before the canary may progress, traffic is routed from the result, and phase and conditions
summarize it last.
"""

from __future__ import annotations

from folio.operator.rollout import canary, conditions, traffic, transitions
from folio.operator.rollout.state import Pass
from folio.operator.rollout.types import Decision, Observed
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus

# Never ask to be called back sooner than this: status timestamps have one-second resolution.
MIN_REQUEUE_S = 1.0


def advance(
    spec: InferenceServiceSpec,
    generation: int | None,
    status: InferenceServiceStatus,
    observed: Observed,
) -> Decision:
    """Compute the next status from spec, the current status and what was observed."""
    p = Pass(spec, generation, status, observed)
    transitions.drop_drained(p)
    transitions.retry(p)
    transitions.admit_target(p)
    transitions.refresh_facts(p)
    transitions.fail_broken(p)
    transitions.abort(p)
    canary.progress(p)
    traffic.route(p)
    conditions.summarize(p)
    p.st.observed_generation = generation
    requeue = max(min(p.requeue), MIN_REQUEUE_S) if p.requeue else None
    return Decision(p.st, p.events, frozenset(p.done), requeue)
