"""The routing state a config turns into: split, replica pools, auth keys, weight gauges."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from folio.operator.router.auth import ApiKeys
from folio.operator.router.balancer import Balancer, Replica
from folio.operator.router.metrics import Adapter, RouterMetrics
from folio.operator.router.quota import Limits
from folio.operator.router.split import WeightedSplit
from folio.operator.router.tenants import TenantPolicy, Tenants, check_keys
from folio.operator.serving.router import Access, RouterConfig

log = logging.getLogger(__name__)


class RoutingState:
    def __init__(self, metrics: RouterMetrics, static_keys: Iterable[str] = ()) -> None:
        self.metrics = metrics
        self.config = RouterConfig()
        self.split = WeightedSplit(())
        self.adapters: dict[str, WeightedSplit] = {}  # adapter name -> the split over its revisions
        self.balancer = Balancer()
        self.balancer.outliers.on_change = self._ejection_changed
        self.balancer.on_affinity = metrics.affinity
        self._static_keys = list(static_keys)
        self.api_keys = ApiKeys(self._static_keys)
        self.loaded = False  # a source has delivered at least one config
        self.fingerprint: str | None = None  # the config in force (`RouterConfig.fingerprint`), once loaded
        self.tenants: Tenants | None = None  # None: no spec.access, anyone is served (static keys aside)
        self.access_problems: tuple[str, ...] = ()
        self._secret: tuple[str, dict[str, list[str]] | None] | None = None  # (name, its keys) as last read

    def apply(self, config: RouterConfig) -> None:
        """Swap in a new config; the next request already follows it."""
        old = self.config
        # Series of revisions and replicas the config no longer names go (first: nothing recorded while
        # it is swapped in may bring them back).
        revisions = {*(t.revision for t in config.traffic), *config.endpoints}
        revisions.update(r for r in (config.stable, config.canary) if r is not None)
        self.metrics.retain(revisions, {(rev, url) for rev, urls in config.endpoints.items() for url in urls})
        weights = [(t.revision, t.weight) for t in config.traffic]
        if not self.loaded or weights != [(t.revision, t.weight) for t in old.traffic]:
            # A fresh split restarts the interleaving; keeping the old one would bias the next picks.
            self.split = WeightedSplit(weights)
            self.metrics.set_weights(dict(weights))
            log.info("traffic: %s", ", ".join(f"{r}={w}" for r, w in weights) or "(none)")
        self._apply_adapters(config, old)
        self.balancer.outliers.configure(config.outlier_detection)
        self.balancer.configure(config.load_balancing)
        self.balancer.update(config.endpoints)
        if config.api_keys != old.api_keys or not self.loaded:
            self.api_keys = ApiKeys([*self._static_keys, *(config.api_keys or [])])
        if config.access != old.access or not self.loaded:
            self._apply_access(config.access)
        if config.problems != old.problems:
            for problem in config.problems:  # what the config held that the router could not use
                log.error("router config: %s; serving without it", problem)
        self.config = config
        self.fingerprint = config.fingerprint()
        self.loaded = True

    def set_secret(self, name: str, keys: dict[str, list[str]] | None) -> None:
        """The keys read from Secret ``name`` (`folio.operator.router.secrets`); None: it is missing."""
        if self._secret != (name, keys):
            self._secret = (name, keys)
            self._apply_access(self.config.access)

    @property
    def secret_name(self) -> str | None:
        """The Secret of API keys to follow: the access in force names it."""
        access = self.config.access
        return access.api_keys_secret if access is not None else None

    def _apply_access(self, access: Access | None) -> None:
        if access is None:
            self.tenants, problems = None, ()
        else:
            name = access.api_keys_secret
            secret = self._secret if self._secret is not None and self._secret[0] == name else None
            # (not read yet, at start: no key is accepted, and nothing is wrong yet)
            tenant_keys, problems = check_keys(name if secret else None, secret[1] if secret else None,
                                               [t.name for t in access.tenants])  # fmt: skip
            policies = [TenantPolicy(t.name, t.priority, Limits(t.requests_per_minute, t.tokens_per_minute,
                                                                t.max_in_flight)) for t in access.tenants]  # fmt: skip
            self.tenants = Tenants(policies, tenant_keys, anonymous=access.anonymous, share=1.0 / access.routers,
                                   now=time.monotonic(), previous=self.tenants)  # fmt: skip
        if problems != self.access_problems:
            for problem in problems:
                log.error("access: %s", problem)
            self.access_problems = problems

    def _apply_adapters(self, config: RouterConfig, old: RouterConfig) -> None:
        """A split per adapter; one whose weights did not change keeps its interleaving."""
        splits = {}
        for name, route in config.adapters.items():
            weights = [(t.revision, t.weight) for t in route.traffic]
            before = old.adapters.get(name)
            kept = self.adapters.get(name)
            if kept is not None and before is not None and weights == [(t.revision, t.weight) for t in before.traffic]:
                splits[name] = kept
            else:
                splits[name] = WeightedSplit(weights)
                log.info("adapter %s: %s", name, ", ".join(f"{r}={w}" for r, w in weights) or "(none)")
        self.adapters = splits

    def adapter(self, model: object) -> Adapter | None:
        """(adapter, revision) for a request whose ``model`` names an adapter: its revision by the weights."""
        split = self.adapters.get(model) if isinstance(model, str) else None
        revision = split.choose() if split is not None else None
        return None if revision is None else (str(model), revision)

    def adapter_stable(self, adapter: Adapter) -> Adapter | None:
        """Where a failed attempt on ``adapter``'s revision is retried: its stable revision, when another."""
        route = self.config.adapters.get(adapter[0])
        stable = route.stable if route is not None else None
        return (adapter[0], stable) if stable is not None and stable != adapter[1] else None

    def _ejection_changed(self, replica: object, ejected: bool) -> None:
        assert isinstance(replica, Replica)
        self.metrics.replica_ejected(replica.revision, replica.url, ejected)
        if ejected:
            log.warning("ejecting replica %s (%s): consecutive failures", replica.url, replica.revision)
        else:
            log.info("replica %s (%s) readmitted after ejection", replica.url, replica.revision)

    def ready(self) -> tuple[bool, str]:
        if not self.loaded:
            return False, "no traffic config yet"
        if not self.split.weights:
            return False, "no revision has a positive traffic weight"
        if not self.balancer.ready_count() and self.config.holding is None:  # holding: requests wait here
            return False, "no ready endpoint"
        return True, "ok"
