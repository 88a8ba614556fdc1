"""The serving plan: what should run for an InferenceService now, for the operator and `folio up` alike.

`plan(isvc, spec, status, placement, endpoints)` is pure. From the status (which revisions run, in
which role, whether their weights are verified: `folio.operator.rollout` keeps it), the spec (what
every revision shares: replicas, the served name, routing) and what was observed (each revision's
ready endpoints) it gives a `ServingPlan`:

- a `RevisionPlan` per running revision (Stable, Canary or Retiring; a Failed one runs nothing):
  its replicas (each one `group_size` pods or processes: several when its ranks need more GPUs than
  one pod holds, `folio.operator.serving.parallel`) (`spec.replicas`, or the autoscaler's decision shared by traffic:
  `folio.operator.autoscaling.share`), none until its weights are verified, so that no engine starts before the weights
  it must serve are in place; whether they still have to be pulled, and where to; its engine
  command line (`folio.operator.serving.engine`);
- the adapter revisions to pre-pull, and those every engine holds (`folio.operator.serving.adapters`);
- the router config (`folio.operator.serving.router`).

The two deployments differ only in their `Placement`: in a cluster every engine is a pod on
0.0.0.0:8000 that reads `/weights/{rev}/<model>` from the cache volume; on this machine each
replica is a process on its own loopback port, with the cache in the state folder.
`folio.operator.serving.objects` renders a plan as Kubernetes objects for the operator's executor;
`folio up`'s runtime runs it as processes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from folio.operator import prepull
from folio.operator.autoscaling.share import revision_replicas
from folio.operator.k8s.names import (
    ENGINE_MASTER_PORT,
    ENGINE_METRICS_PORT,
    ENGINE_PORT,
    LWS_GROUP_SIZE,
    LWS_LEADER_ADDRESS,
    LWS_WORKER_INDEX,
)
from folio.operator.serving import draft, engine, parallel
from folio.operator.serving.adapters import AdapterPlan, adapter_plan
from folio.operator.serving.router import RoutedSpec, RouterConfig, router_config
from folio.operator.spec import (
    RUNNING_ROLES,
    EngineArgValue,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ModelSource,
    PinnedSource,
    RevisionRole,
)


@dataclass(frozen=True)
class Placement:
    """Where engines listen and find their weights."""

    weights_root: str
    host: str
    port: int | None  # the same for every engine (one pod each), or None: a port per replica
    # /metrics on a port of its own (`--metrics-port`), so that a NetworkPolicy can admit a scraper to it
    # and not to the API; None: /metrics on the API port only (a `folio up` replica has one port)
    metrics_port: int | None = None

    @classmethod
    def cluster(cls) -> Placement:
        return cls(weights_root=prepull.CACHE_MOUNT, host="0.0.0.0", port=ENGINE_PORT, metrics_port=ENGINE_METRICS_PORT)

    @classmethod
    def this_machine(cls, cache_dir: Path) -> Placement:
        return cls(weights_root=str(cache_dir), host="127.0.0.1", port=None, metrics_port=None)


@dataclass(frozen=True)
class RevisionPlan:
    """One running revision: how many engines, from which weights, with which command line."""

    name: str
    role: RevisionRole
    model: ModelSource
    image: str
    args: Mapping[str, EngineArgValue]  # its spec.engine.args
    flags: tuple[str, ...]  # ... as `folio serve` flags
    replicas: int
    pull_weights: bool  # not verified yet: a pre-pull fills `weights`, and no engine runs
    weights: str  # where the pre-pull puts the verified weights and the engines read them
    served_name: str
    host: str
    port: int | None
    metrics_port: int | None = None  # the placement's: `--metrics-port` when set
    # Pods (`folio up`: processes) per replica: 1, or a LeaderWorkerSet's group of a leader (node rank 0,
    # which serves) and workers (`--headless`), wired by LeaderWorkerSet's environment (`group_env`).
    group_size: int = 1
    # speculative decoding's draft model (`spec.draftModel`): pulled with the weights, into `draft_weights`
    draft: PinnedSource | None = None
    draft_weights: str | None = None

    @property
    def draft_pull(self) -> prepull.DraftPull | None:
        """What the pre-pull fetches beside the weights (None: no draft): the draft model, where it goes, and
        the context it must read (the revision's maxModelLen; None: the model's own)."""
        if self.draft is None or self.draft_weights is None:
            return None
        max_model_len = self.args.get("maxModelLen")
        return prepull.DraftPull(self.draft, Path(self.draft_weights),
                                 max_model_len=max_model_len if isinstance(max_model_len, int) else None)

    def serve_args(self, port: int | None = None, master_port: int = ENGINE_MASTER_PORT) -> list[str]:
        """The arguments of `folio serve` for one replica, its group's leader when it has workers (``port``:
        where a `folio up` replica listens; ``master_port``: its group's rendezvous, one per replica there)."""
        listen = self.port if port is None else port
        assert listen is not None, "a per-replica placement needs the replica's port"
        return [*engine.serve_args(self.model, self.flags, weights=self.weights, served_name=self.served_name,
                                   host=self.host, port=listen, metrics_port=self.metrics_port),
                *engine.group_flags(self.group_size, master_port)]

    @property
    def parallel(self) -> tuple[int, int]:
        """(tensorParallelSize, pipelineParallelSize): what its pre-pull checks the model against."""
        return parallel.tensor_parallel_size(self.args), parallel.pipeline_parallel_size(self.args)

    def worker_args(self, master_port: int = ENGINE_MASTER_PORT) -> list[str]:
        """The arguments of `folio serve` for a group's worker (no HTTP: only its ranks)."""
        assert self.group_size > 1, "only a replica of several pods has workers"
        return engine.worker_args(self.model, self.flags, weights=self.weights, served_name=self.served_name,
                                  nnodes=self.group_size, master_port=master_port)

    def group_env(self, index: int, leader: str) -> dict[str, str]:
        """What LeaderWorkerSet puts in the environment of the group's pod ``index`` (0: the leader), and
        `folio up` in its processes', the leader at ``leader``."""
        return {LWS_LEADER_ADDRESS: leader, LWS_GROUP_SIZE: str(self.group_size), LWS_WORKER_INDEX: str(index)}


@dataclass(frozen=True)
class ServingPlan:
    isvc: str
    revisions: tuple[RevisionPlan, ...]
    spec: InferenceServiceSpec
    status: InferenceServiceStatus
    endpoints: Mapping[str, Sequence[str]]
    adapters: AdapterPlan = field(default_factory=AdapterPlan)  # adapter revisions to pull, and to load onto every engine

    def revision(self, name: str) -> RevisionPlan | None:
        return next((r for r in self.revisions if r.name == name), None)

    @functools.cached_property
    def router(self) -> RouterConfig:
        """The router's config (worked out on first use: a cluster's routers derive it themselves, from the
        same `router_config`, the InferenceService they watch and its EndpointSlices)."""
        return router_config(RoutedSpec.of(self.spec), self.status, self.endpoints)


def plan(
    isvc: str,
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    placement: Placement,
    endpoints: Mapping[str, Sequence[str]] | None = None,
) -> ServingPlan:
    """What should run now; raises `PlanningError` when a running revision's engine args are invalid."""
    served_name = spec.model.served_name or isvc
    drafts = {rev.name: prepull.draft_weights_path(rev.name, rev.draft_model, root=placement.weights_root)
              for rev in status.revisions if rev.draft_model is not None}  # fmt: skip
    revisions = tuple(
        RevisionPlan(
            name=rev.name,
            role=rev.role,
            model=rev.model,
            image=rev.image,
            args=dict(rev.args),
            flags=tuple(engine.engine_flags(draft.with_draft(rev.args, drafts.get(rev.name)))),
            replicas=revision_replicas(spec, status, rev) if rev.weights_ready else 0,
            pull_weights=not rev.weights_ready,
            weights=prepull.weights_path(rev.name, rev.model, root=placement.weights_root),
            served_name=served_name,
            host=placement.host,
            port=placement.port,
            metrics_port=placement.metrics_port,
            group_size=parallel.group_size(spec.engine, rev.args),
            draft=rev.draft_model,
            draft_weights=drafts.get(rev.name),
        )
        for rev in status.revisions
        if rev.role in RUNNING_ROLES
    )
    return ServingPlan(isvc, revisions, spec, status, dict(endpoints or {}),
                       adapter_plan(status, placement.weights_root))

