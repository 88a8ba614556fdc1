"""Replicas per revision and the least-loaded pick among the healthy ones."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from folio.operator.router.outliers import OutlierDetector


@dataclass(eq=False)
class Replica:
    """One engine replica. Identity matters: in-flight counts and health survive config reloads."""

    url: str
    revision: str
    in_flight: int = 0
    healthy: bool = True  # optimistic: sources list replicas their owner already considers ready
    failures: int = 0  # consecutive failed health checks
    last_error: str = ""

    def mark_up(self) -> None:
        self.healthy, self.failures, self.last_error = True, 0, ""

    def mark_down(self, reason: str) -> None:
        self.healthy, self.last_error = False, reason


@dataclass
class _Pool:
    replicas: list[Replica] = field(default_factory=list)
    cursor: int = 0  # rotates the starting point so idle replicas share the load


class Balancer:
    """Fewest in-flight requests wins; ties go round-robin."""

    def __init__(self, outliers: OutlierDetector | None = None) -> None:
        self._pools: dict[str, _Pool] = {}
        self.outliers = outliers or OutlierDetector()

    def update(self, endpoints: Mapping[str, Sequence[str]]) -> list[Replica]:
        """Adopt a new endpoint map, keeping the state of replicas that stay; returns the new ones."""
        known = {(r.revision, r.url): r for pool in self._pools.values() for r in pool.replicas}
        added: list[Replica] = []
        pools: dict[str, _Pool] = {}
        for revision, urls in endpoints.items():
            replicas = []
            for url in urls:
                replica = known.get((revision, url))
                if replica is None:
                    replica = Replica(url=url, revision=revision)
                    added.append(replica)
                replicas.append(replica)
            old = self._pools.get(revision)
            pools[revision] = _Pool(replicas, old.cursor if old else 0)
        self._pools = pools
        self.outliers.forget(self.replicas())
        return added

    def pick(self, revision: str | None, exclude: Collection[Replica] = ()) -> Replica | None:
        pool = self._pools.get(revision) if revision is not None else None
        if pool is None or not pool.replicas:
            return None
        replicas = pool.replicas
        n = len(replicas)
        start = pool.cursor % n
        pool.cursor = start + 1
        best: Replica | None = None
        for i in range(n):
            r = replicas[(start + i) % n]
            if self.usable(r) and r not in exclude and (best is None or r.in_flight < best.in_flight):
                best = r
        if best is not None:
            self.outliers.started(best)  # a half-open replica's one trial request
        return best

    def usable(self, replica: Replica) -> bool:
        """Passes its health checks and is not ejected (or is half-open with no trial out)."""
        return replica.healthy and self.outliers.usable(replica)

    def pool(self, revision: str) -> list[Replica]:
        pool = self._pools.get(revision)
        return pool.replicas if pool else []

    def pick_any(self, order: Iterable[str | None], exclude: Collection[Replica]) -> Replica | None:
        """The first revision in `order` with a usable replica, then any other revision."""
        seen: set[str] = set()
        for revision in [*order, *self._pools]:
            if revision is None or revision in seen:
                continue
            seen.add(revision)
            replica = self.pick(revision, exclude)
            if replica is not None:
                return replica
        return None

    def replicas(self) -> list[Replica]:
        return [r for pool in self._pools.values() for r in pool.replicas]

    def ready_count(self) -> int:
        return sum(r.healthy for r in self.replicas())
