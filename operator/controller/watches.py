"""Which resources kopf watches, and asking it to look again when an optional kind's CRD arrives later.

kopf finds the resources it watches once, at start (`settings.scanning.disabled`, in both modes: watching
CustomResourceDefinitions takes a cluster-wide grant the chart does not give). A kind whose CRD is
installed afterwards would be applied by a pass (`discovery.Discovery` sees it served within its TTL) but
never watched: never in the index, so never pruned, never deleted with its InferenceService, and applied
again whenever the write expectation runs out. `Watches.ensure` closes the gap: for a kind a pass needs
that the cluster serves but kopf does not watch, it runs kopf's own scan of that API group (discovery
only, which every client may read) and hands the result to kopf as kopf does after a CRD event, so kopf
starts the kind's watch and index; logged once per kind.

This reaches into kopf's reactor (`revise_resources`, `scan_resources`: unchanged since kopf 1.30); where
they are missing, a kind installed later is logged as needing a restart instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import kopf

from folio.operator.k8s.names import PLURALS

log = logging.getLogger(__name__)

Kind = tuple[str, str]  # (apiVersion, kind)
# A group kopf's scan did not find the kind in (an API server's discovery lags a CRD by a moment) is
# scanned again after this.
RESCAN_S = 10.0

try:  # kopf's reactor internals (see the module docstring)
    from kopf._cogs.clients.scanning import scan_resources
    from kopf._cogs.structs.references import Insights
    from kopf._core.reactor.observation import revise_resources
except ImportError:  # pragma: no cover - a kopf that moved them: restart to pick up a late CRD
    scan_resources = revise_resources = Insights = None  # type: ignore[assignment,misc]


def _resource(kind: Kind) -> tuple[str, str, str]:
    group, _, version = kind[0].rpartition("/")
    return group, version, PLURALS[kind]


@dataclass
class Watches:
    """kopf's view of the served resources (its `Insights`, passed to `kopf.run`), shared with the passes."""

    registry: kopf.OperatorRegistry
    settings: kopf.OperatorSettings
    insights: Any = field(default_factory=lambda: Insights() if Insights is not None else None)
    rescan_s: float = RESCAN_S
    clock: Callable[[], float] = time.monotonic
    _scanned: dict[str, float] = field(default_factory=dict)  # group -> when kopf was last asked to scan it
    _told: set[Kind] = field(default_factory=set)  # kinds whose late arrival was logged

    def watched(self, kind: Kind) -> bool:
        """Whether kopf watches (and so indexes) ``kind``."""
        if self.insights is None:
            return True  # nothing to tell: kopf's own view is out of reach
        wanted = _resource(kind)
        return any((r.group, r.version, r.plural) == wanted for r in self.insights.watched_resources)

    async def ensure(self, kinds: Iterable[Kind], logger: logging.Logger | logging.LoggerAdapter = log) -> None:
        """Make kopf watch each of ``kinds`` (which the cluster serves); a group at most once per ``rescan_s``."""
        late = [kind for kind in kinds if not self.watched(kind)]
        for group in dict.fromkeys(_resource(kind)[0] for kind in late):
            last = self._scanned.get(group)
            if last is not None and self.clock() - last < self.rescan_s:
                continue
            self._scanned[group] = self.clock()
            if scan_resources is None:  # pragma: no cover
                logger.warning("the cluster serves %s now, but this kopf cannot be asked to watch it: restart "
                               "the operator", group)
                continue
            try:
                resources = await scan_resources(groups={group}, settings=self.settings, logger=logger)
            except Exception as exc:  # kopf's client errors: the pass goes on, the scan is tried again later
                logger.warning("could not read the API group %s to watch its new kinds (again in %gs): %s",
                               group, self.rescan_s, exc)
                continue
            async with self.insights.revised:  # as kopf does on a CRD event (observation.py)
                revise_resources(resources=resources, insights=self.insights, registry=self.registry, group=group)
                await self.insights.backbone.fill(resources=resources)
                self.insights.revised.notify_all()
        for kind in late:
            if kind not in self._told and self.watched(kind):
                self._told.add(kind)
                logger.info("the cluster serves %s (%s) now, its CRD installed after the operator started: "
                            "watching it", kind[1], kind[0])
