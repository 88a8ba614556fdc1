"""Where a pass runs: the small I/O protocol the cluster and `folio up` each implement once.

A runtime answers what the pass observes (each revision's facts, the routers and engines to scrape, a
revision's replicas for the parity gate, where a gate's prompt suite comes from) and carries out what
the pass decided (`execute`: objects applied and status written in a cluster; processes started and
stopped, the router's file written and status saved on this machine). Everything between is the pass's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

import httpx

from folio.operator.parity import SuitePrompt
from folio.operator.rollout import Decision, Observed
from folio.operator.serving.plan import Placement, ServingPlan
from folio.operator.serving.validate import Site
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, ParitySpec


@dataclass(frozen=True)
class Capacity:
    """The running revisions' engines as the autoscaler counts them."""

    ready: int  # ready replicas
    starting: int  # asked for and not ready yet (pending, loading weights)
    metrics: Sequence[str] = ()  # `/metrics` of each ready engine (Waiting and KVCache read them)
    asked: bool = False  # someone asked for a scale up (a cluster's `folio.dev/scale-up` annotation)


class Runtime(Protocol):
    @property
    def site(self) -> Site:
        """What this runtime can run (model sources, replica ceilings, suite sources): validation's input."""
        ...

    @property
    def placement(self) -> Placement:
        """Where engines listen and find their weights (the serving plan's input)."""
        ...

    @property
    def keda(self) -> bool:
        """Whether KEDA scales here when the spec asks for it (a cluster); else the pass's autoscaler does."""
        ...

    @property
    def http(self) -> httpx.AsyncClient | None:
        """A client that outlives passes (the parity gate runs across them), or None: each opens its own."""
        ...

    async def observe(self, spec: InferenceServiceSpec, status: InferenceServiceStatus, now: datetime) -> Observed:
        """Each revision's facts (weights, ready replicas, crash loops), the overrides asked for and the
        optional kinds that are asked for but not served here."""
        ...

    def adapter_weights(self, revision: str) -> tuple[Literal["pending", "ready", "failed"], str]:
        """Where the pre-pull of an adapter revision not verified yet stands (the plan's `AdapterPlan.pulls`
        starts it), and what to show about it."""
        ...

    def engines(self, revision: str) -> Sequence[str]:
        """Base URLs of each running engine replica of ``revision`` that answers (whether or not it holds its
        adapters yet): where adapters are loaded and unloaded (`folio.operator.reconcile.adapters`)."""
        ...

    async def mark_engines(self, holding: Mapping[str, bool]) -> None:
        """Say which engines (by `engines` URL) hold every adapter revision that takes traffic: only those may
        take requests (a cluster's pods carry it as a readiness gate; here `endpoints` are filtered by it)."""
        ...

    def router_metrics(self) -> list[str]:
        """`/metrics` of every router of the InferenceService (the analysis' and the autoscaler's source)."""
        ...

    def capacity(self, status: InferenceServiceStatus) -> Capacity:
        """The running revisions' engines, for the autoscaler."""
        ...

    def replica_urls(self, revision: str) -> Sequence[str]:
        """Base URLs that reach a ready replica of ``revision`` (the parity gate asks the first)."""
        ...

    def suite(self, gate: ParitySpec) -> Callable[[], Awaitable[list[SuitePrompt]]]:
        """The loader of the parity gate's prompt suite (a file here, a ConfigMap in a cluster)."""
        ...

    def endpoints(self) -> Mapping[str, Sequence[str]]:
        """Each revision's ready replicas, for the router config the plan gives (a cluster's routers find
        them in EndpointSlices themselves: empty there)."""
        ...

    async def execute(self, serving: ServingPlan | None, decision: Decision) -> None:
        """Make it so: run what ``serving`` says (None: leave what runs alone), record ``decision.status``,
        post its events and clear the overrides it acted on."""
        ...
