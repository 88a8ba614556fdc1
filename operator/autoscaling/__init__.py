"""Autoscaling: replicas that follow load, for the operator and `folio up` alike.

- `decide.decide(spec, previous, load)`: the pure decision, ``desired = f(spec, observed, now)``: up at
  once, down only after ``scaleDownDelay`` of lower demand, never while replicas are still starting;
- `share.revision_replicas`: the decision split over the running revisions (the canary follows
  its traffic share), which `folio.operator.serving.plan` takes its replica counts from;
- `load`: the metric readings (router and engine `/metrics` texts) as a `decide.Load`.
"""

from folio.operator.autoscaling.decide import Decision, Event, Load, decide
from folio.operator.autoscaling.share import promotion_ready, revision_replicas

__all__ = ["Decision", "Event", "Load", "decide", "promotion_ready", "revision_replicas"]
