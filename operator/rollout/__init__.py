"""The rollout state machine: pure, deterministic, and driven by status alone.

``advance(spec, generation, status, observed)`` looks at what the spec asks for, what status says
has happened so far and what was just observed (weights, ready replicas, an analysis sample, manual
overrides, the time) and returns the next status plus the Events to emit. It does no I/O, so the
operator's kopf handlers and the local runtime (`folio up`) share it, and a restarted controller
continues exactly where the last one stopped: everything it needs is in ``status``.

    types        what it reads besides spec and status (Observed) and what it answers (Decision)
    advance      one pass: the order of the parts below; state: the pass's working copy
    transitions  revisions admitted, superseded, failed, retired; overrides abort and retry
    canary       the canary's steps, what a sample counts for, promotion; it acts on the parity gate's
                 decision before step 1 (`folio.operator.parity`, which knows nothing of the rollout)
    inconclusive a step without a verdict for maxInconclusiveDuration: Pause, Rollback or Promote
    traffic      who gets traffic (status.traffic)
    conditions   phase, the four conditions and their messages

The model, in short (docs/rollouts.md has the long version with a worked example):

- The first revision goes straight to Stable once its weights are verified and a replica is ready.
- A later revision becomes the Canary. It gets no traffic until its weights are verified and it
  has ready replicas; then it walks ``spec.rollout.steps``. A step ends when its pause is over
  *and* the latest analysis during the step passed (an inconclusive sample is not a pass; after
  ``maxInconclusiveDuration`` of them ``onInconclusive`` decides).
  After the last step it is promoted: it becomes Stable with 100% and the old stable is Retiring
  (weight 0) for ``drainPeriod`` before it is dropped.
- ``failureLimit`` consecutive failing samples, a crash-looping canary, weights that fail
  verification or the ``abort`` override fail the revision: traffic returns to 100% stable, the
  revision is listed in ``failedRevisions`` with the figures, and ``Degraded=True`` says why. It is
  not tried again until the spec names a different revision or the ``retry`` override is given.
- A newer revision mid-canary supersedes the canary: its traffic goes back to stable first and it
  drains like a retiring revision.
"""

from folio.operator.rollout.advance import advance
from folio.operator.rollout.conditions import describe_sample
from folio.operator.rollout.types import OVERRIDES, Decision, Event, Observed, RevisionFacts

__all__ = ["OVERRIDES", "Decision", "Event", "Observed", "RevisionFacts", "advance", "describe_sample"]
