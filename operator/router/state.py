"""The routing state a config turns into: split, replica pools, auth keys, weight gauges."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from folio.operator.router.auth import ApiKeys
from folio.operator.router.balancer import Balancer, Replica
from folio.operator.router.metrics import Adapter, RouterMetrics
from folio.operator.router.split import WeightedSplit
from folio.operator.serving.router import RouterConfig

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
        if config.problems != old.problems:
            for problem in config.problems:  # what the config held that the router could not use
                log.error("router config: %s; serving without it", problem)
        self.config = config
        self.fingerprint = config.fingerprint()
        self.loaded = True

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
