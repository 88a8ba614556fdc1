"""The adapters' part of the serving plan: which adapter revisions to pull, and which every engine must hold.

From the adapters' status (`folio.operator.rollout.adapters` keeps it) the plan takes each running
adapter revision (Stable, Canary or Retiring): one whose files are not verified yet is pulled into the
cache (``{root}/adapters/{revision}/<name>``, beside the base revisions' weights, where the engines
already read); a verified one is loaded onto every ready engine replica of the running base revisions,
through the engines' runtime endpoints, so that no pod restarts. An engine knows each adapter revision
as ``NAME@REVISION`` (`engine_name`) and answers under NAME: the router sends a request for NAME to the
revision its weights pick. ``required`` holds the revisions that take traffic: a replica is in rotation
only once it holds all of them (a new base revision's replicas load every current adapter before they
take traffic; a restarted one loads them again before it takes any).
"""

from __future__ import annotations

from dataclasses import dataclass

from folio.operator import prepull
from folio.operator.spec import RUNNING_ROLES, InferenceServiceStatus, ModelSource

ADAPTERS_DIR = "adapters"  # under the weights cache


def engine_name(adapter: str, revision: str) -> str:
    """How an engine knows one revision of an adapter (adapter names have no '@')."""
    return f"{adapter}@{revision}"


def adapter_path(revision: str, pin: ModelSource, root: str) -> str:
    return prepull.weights_path(f"{ADAPTERS_DIR}/{revision}", pin, root=root)


@dataclass(frozen=True)
class AdapterRevisionPlan:
    adapter: str
    revision: str
    pin: ModelSource
    path: str  # where the pre-pull puts the verified files and the engines read them
    pull: bool  # not verified yet: pre-pulled, not loaded

    @property
    def engine_name(self) -> str:
        return engine_name(self.adapter, self.revision)


@dataclass(frozen=True)
class AdapterPlan:
    revisions: tuple[AdapterRevisionPlan, ...] = ()
    required: frozenset[str] = frozenset()  # engine names of the revisions that take traffic

    @property
    def loads(self) -> dict[str, AdapterRevisionPlan]:
        """Engine name → the verified revisions every ready replica holds."""
        return {r.engine_name: r for r in self.revisions if not r.pull}

    @property
    def pulls(self) -> tuple[AdapterRevisionPlan, ...]:
        return tuple(r for r in self.revisions if r.pull)


def adapter_plan(status: InferenceServiceStatus, root: str) -> AdapterPlan:
    revisions = tuple(
        AdapterRevisionPlan(a.name, rev.name, rev.model, adapter_path(rev.name, rev.model, root),
                            pull=not rev.weights_ready)
        for a in status.adapters for rev in a.revisions if rev.role in RUNNING_ROLES
    )  # fmt: skip
    return AdapterPlan(revisions, required_adapters(status))


def required_adapters(status: InferenceServiceStatus) -> frozenset[str]:
    """The engine names of the adapter revisions that take traffic: what a replica must hold to serve."""
    return frozenset(engine_name(a.name, t.revision) for a in status.adapters for t in a.traffic if t.weight > 0)
