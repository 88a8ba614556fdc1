"""Each adapter's rollout: the base revisions' state machine, run once per adapter.

An adapter revision is rolled out exactly as a base revision is: admitted as the stable revision while
nothing of the adapter has served yet, else as its canary; held before step 1 by the parity gate; walked
through the adapter's steps (its own ``rollout``, else ``spec.rollout``) on its own analysis; promoted, or
rolled back alone. So `advance` itself runs per adapter, on a projection (`adapter_view`): a spec whose
model is the adapter's pin and whose rollout is the adapter's, and the adapter's `AdapterStatus`, which
has the rollout fields of the service's status. An adapter revision's facts are its pre-pull (weights)
and the engine replicas that have loaded it (ready replicas); the caller observes both.

`fold` then carries what the adapters' rollouts say up to the service's own conditions: a rolled-back
adapter makes the service Degraded (naming the adapter and the figures) while it keeps serving, an
adapter being pulled or failing to is WeightsReady=False, an adapter's canary is Progressing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from folio.operator.rollout.advance import advance
from folio.operator.rollout.conditions import set_condition
from folio.operator.rollout.types import AdapterObserved, Event, Observed
from folio.operator.spec import (
    ADAPTER_IMAGE,
    RUNNING_ROLES,
    AdapterSpec,
    AdapterStatus,
    Condition,
    ConditionStatus,
    EngineSpec,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RolloutStatus,
    adapter_revision_name,
    engine_args,
    revision_name,
)

_ROLLOUT_FIELDS = tuple(RolloutStatus.model_fields)


def adapter_view(spec: InferenceServiceSpec, adapter: AdapterSpec) -> InferenceServiceSpec:
    """The spec `advance` rolls ``adapter`` out by: its pin as the model, its own rollout (else the service's);
    its analysis reads the routers' series of that adapter (`folio.operator.analysis`, scraped or by PromQL)."""
    view = InferenceServiceSpec(model=adapter.pin(), engine=EngineSpec(image=ADAPTER_IMAGE),
                                rollout=adapter.rollout or spec.rollout)
    assert revision_name(view) == adapter_revision_name(adapter), "one identity for an adapter revision"
    return view


def as_service_status(status: RolloutStatus) -> InferenceServiceStatus:
    return InferenceServiceStatus(**{f: getattr(status, f) for f in _ROLLOUT_FIELDS})


def as_adapter_status(name: str, status: RolloutStatus) -> AdapterStatus:
    return AdapterStatus(name=name, **{f: getattr(status, f) for f in _ROLLOUT_FIELDS})


@dataclass
class AdaptersDecision:
    adapters: list[AdapterStatus]
    events: list[Event] = field(default_factory=list)
    overrides_done: dict[str, frozenset[str]] = field(default_factory=dict)  # by adapter
    requeue_after: float | None = None


def advance_adapters(spec: InferenceServiceSpec, generation: int | None, status: InferenceServiceStatus,
                     observed: Observed) -> AdaptersDecision:
    """Every adapter of the spec one step on; an adapter the spec no longer names is left out (unloaded by
    the plan that follows: its requests get 404 from then on)."""
    out = AdaptersDecision([])
    requeue: list[float] = []
    for adapter in spec.adapters:
        seen = observed.adapters.get(adapter.name, AdapterObserved())
        before = status.adapter(adapter.name) or AdapterStatus(name=adapter.name)
        d = advance(adapter_view(spec, adapter), generation, as_service_status(before),
                    Observed(now=observed.now, revisions=seen.revisions, analysis=seen.analysis, parity=seen.parity,
                             overrides=seen.overrides))
        out.adapters.append(as_adapter_status(adapter.name, d.status))
        out.events += [Event(e.type, e.reason, f"adapter {adapter.name}: {e.message}") for e in d.events]
        if d.overrides_done:
            out.overrides_done[adapter.name] = d.overrides_done
        if d.requeue_after is not None:
            requeue.append(d.requeue_after)
    out.requeue_after = min(requeue) if requeue else None
    return out


FITS = "AdaptersFit"  # a condition of services with adapters: False warns of thrashing, refuses nothing


def set_fit(previous: Sequence[Condition], spec: InferenceServiceSpec, status: InferenceServiceStatus, *,
            generation: int | None, now: datetime) -> Event | None:
    """The `FITS` condition (gone without adapters); a Warning event when it turns False."""
    fit = fits(spec, status)
    old = next((c for c in previous if c.type == FITS), None)
    rest = [c for c in status.conditions if c.type != FITS]
    if fit is None:
        status.conditions = rest
        return None
    status.conditions = set_condition([*rest, *([old] if old else [])], *fit, generation=generation, now=now)
    return Event("Warning", fit[2], fit[3]) if fit[1] == "False" and (old is None or old.status != "False") else None


def fits(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> tuple[str, ConditionStatus, str, str] | None:
    """Whether the engines can keep the running adapter revisions in memory: each caches ``maxCpuLoras``
    (default ``maxLoras``, default 1) and the routers send an adapter's requests to the replicas holding it,
    so the stable revision's replicas hold that many times their count. Beyond, engines read adapter files
    from disk again and again. None without adapters."""
    if not spec.adapters:
        return None
    args = engine_args(spec)
    loras = args.get("maxLoras", 1)
    cache = args.get("maxCpuLoras", loras)
    stable = status.revision(status.stable_revision)
    replicas = max(1, stable.ready_replicas if stable is not None else spec.replicas)
    held = sum(r.role in RUNNING_ROLES for a in status.adapters for r in a.revisions)
    if not isinstance(cache, int) or held <= cache * replicas:
        return FITS, "True", "Fits", (f"{held} adapter revision(s) running; the engines keep {cache} each in memory "
                                      f"(maxCpuLoras) on {replicas} replica(s)")
    return FITS, "False", "TooManyAdapters", (
        f"{held} adapter revisions run but {replicas} replica(s) keep {cache} each in memory (spec.engine.args."
        "maxCpuLoras, default maxLoras): requests under the others read their files from disk again and again; "
        "raise maxCpuLoras (and maxLoras) or the replicas"
    )


def fold(previous: Sequence[Condition], status: InferenceServiceStatus, *, generation: int | None,
         now: datetime) -> None:
    """The adapters' conditions carried up to the service's: where the base revisions' say all is well
    (Degraded False, WeightsReady True, Progressing False), the first adapter that says otherwise speaks.
    ``previous``: the service's conditions before the pass, whose transition times stand while a
    condition keeps its status."""
    calm = {"Degraded": "False", "WeightsReady": "True", "Progressing": "False"}
    for type_, fine in calm.items():
        own = status.condition(type_)
        if own is None or own.status != fine:
            continue
        worse = next(((a, c) for a in status.adapters if (c := a.condition(type_)) is not None and c.status != fine),
                     None)
        if worse is None:
            continue
        adapter, c = worse
        kept = [c2 for c2 in status.conditions if c2.type != type_]
        old = next((c2 for c2 in previous if c2.type == type_), None)
        status.conditions = set_condition([*kept, *([old] if old else [])], type_, c.status, c.reason,
                                          f"adapter {adapter.name}: {c.message}", generation=generation, now=now)
