"""The autoscaler's decision: ``desired = f(spec, previous decision, load)``, pure.

- The recommendation is ``ceil(load / target)`` within ``[minReplicas, maxReplicas]``: InFlight and
  Waiting are totals over the service (the requests in flight and held by the routers; the engines'
  waiting queues), KVCache is the ready replicas' mean cache use, so it scales the ready count by
  ``usage / target`` (the HPA's utilization form). A service with any request in sight (in flight,
  held, waiting, or counted since the last look) never recommends zero.
- Up at once. Down only once the recommendation has stayed below the desired count for
  ``scaleDownDelay``, and then to the most it asked for in that time (Kubernetes' stabilization
  window, kept as two status fields instead of a history), so a dip never flaps the replicas and
  nothing scales down within ``scaleDownDelay`` of a scale up.
- Never down while replicas are still starting (Pending, pulling weights, loading): a Deployment
  removes unready pods first, so it would kill exactly the ones paid for and nearly there. The
  window only starts once they are up, so a replica always gets ``scaleDownDelay`` to serve.
- No reading (metrics unreachable) changes nothing, except that held requests always get a replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from folio.operator.spec import AutoscalingSpec, AutoscalingStatus, as_utc, now_iso, parse_time


@dataclass(frozen=True)
class Load:
    """What the autoscaler saw just now, summed over the service's serving revisions."""

    now: datetime
    value: float | None  # the metric's reading (see the module doc); None: nothing could be read
    ready: int = 0  # ready replicas
    starting: int = 0  # asked for and not ready yet
    active: bool = False  # a request was in flight, held, waiting or counted since the last look
    held: int = 0  # requests the routers hold until a replica is ready


@dataclass(frozen=True)
class Event:
    """An Event to post (the shape of `folio.operator.rollout.Event`, which this package does not import:
    the rollout asks `share` about promotions)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    status: AutoscalingStatus
    event: Event | None  # one per change of desiredReplicas
    requeue_after: float | None  # seconds until a pending scale down comes due


def initial_replicas(spec: AutoscalingSpec) -> int:
    """Where a service starts: at least one replica, so that a new revision proves it can serve."""
    return clamp(spec, max(spec.min_replicas, 1))


def clamp(spec: AutoscalingSpec, replicas: int) -> int:
    return max(spec.min_replicas, min(spec.max_replicas, replicas))


def recommend(spec: AutoscalingSpec, load: Load) -> int | None:
    """Replicas the load asks for right now (None: no reading)."""
    if load.value is None:
        return None
    if spec.metric == "KVCache":
        raw = math.ceil(load.ready * load.value / spec.target - 1e-9) if load.ready else 0
    else:
        raw = math.ceil(load.value / spec.target - 1e-9)  # 8 in flight at target 4 is 2, not 3
    floor = 1 if load.active or load.held else 0
    return clamp(spec, max(raw, floor))


def decide(spec: AutoscalingSpec, previous: AutoscalingStatus | None, load: Load) -> Decision:
    now = as_utc(load.now)
    at = now_iso(now)
    current = clamp(spec, previous.desired_replicas) if previous is not None else initial_replicas(spec)
    asked = recommend(spec, load)
    if asked is None:
        asked = max(current, 1) if load.held else current
    st = AutoscalingStatus(
        desired_replicas=current,
        current_replicas=load.ready,
        metric=spec.metric,
        value=None if load.value is None else round(load.value, 4),
        last_scale_time=previous.last_scale_time if previous is not None else None,
        reason=previous.reason if previous is not None else f"starting with {current} replica(s)",
    )
    reading = _reading(spec, load)
    requeue: float | None = None
    if asked > current:
        st.desired_replicas, st.last_scale_time = asked, at
        st.reason = f"scaled up: {reading} asks for {asked} replica(s)"
    elif asked < current:
        since = previous.lower_since if previous is not None and previous.lower_since else at
        peak = max(asked, previous.lower_peak or 0) if previous is not None and previous.lower_since else asked
        left = parse_time(since).timestamp() + spec.scale_down_delay_seconds - now.timestamp()
        st.lower_since, st.lower_peak = since, peak
        if load.starting > 0:  # the window starts once they are up: a new replica serves before it may go
            st.lower_since, st.lower_peak = at, asked
            st.reason = f"{reading} asks for {asked}; not scaling down while {load.starting} replica(s) start"
        elif left > 0:
            st.reason = f"{reading} asks for {asked}; scaling down to {peak} if that lasts {spec.scale_down_delay}"
            requeue = left
        else:
            st.desired_replicas, st.last_scale_time = peak, at
            st.lower_since = st.lower_peak = None
            st.reason = (
                "scaled to zero: no requests for " + spec.scale_down_delay if peak == 0
                else f"scaled down: {reading} asked for at most {peak} replica(s) for {spec.scale_down_delay}"
            )
    elif previous is None or previous.desired_replicas != current:
        st.reason = f"replicas kept within [{spec.min_replicas}, {spec.max_replicas}]"
    before = previous.desired_replicas if previous is not None else None
    event = None
    if before is not None and st.desired_replicas != before:
        kind = ("ScaledUp" if st.desired_replicas > before else
                "ScaledToZero" if st.desired_replicas == 0 else "ScaledDown")
        event = Event("Normal", kind, f"replicas {before} -> {st.desired_replicas}: {st.reason}")
    assert spec.min_replicas <= st.desired_replicas <= spec.max_replicas
    return Decision(st, event, requeue)


def _reading(spec: AutoscalingSpec, load: Load) -> str:
    if load.value is None:
        return f"no {spec.metric} reading" + (f", {load.held} held request(s)" if load.held else "")
    held = f" ({load.held} held)" if load.held else ""
    return f"{spec.metric} {load.value:g}{held} at target {spec.target:g}"
