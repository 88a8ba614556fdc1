"""Replicas per revision and the pick among the healthy ones: by prefix affinity with bounded load
(`ring`), or the least loaded.

A replica's load is its in-flight requests from this router plus, while its last scrape
(`loadscrape`) is fresh, the requests its engine holds (running and waiting) that are not this
router's: those of other router replicas and of anything calling the engine directly. The engine's
own count includes this router's requests, so adding it whole would count each of ours twice — a
queue of our own requests would then double a replica's load and push its keys off it. Its KV cache
usage breaks ties between equally loaded replicas.

Each pool remembers, for its last `RECENT_KEYS` keys, the replicas each went to: a key goes back to
the least loaded of those under the bound (where its prefix is cached), else along the ring. A prefix
key that is not among them is new to every cache there: it goes to the least loaded replica (ties by
KV cache usage, then in its ring order) rather than to its owner regardless of load, so requests that
share nothing spread like LeastLoaded's (`ring.place`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from folio.operator.metric_names import AFFINITY_HIT, AFFINITY_NEW, AFFINITY_SPILL
from folio.operator.router.affinity import from_text
from folio.operator.router.outliers import OutlierDetector
from folio.operator.router.ring import HashRing, key_hash, load_bound, place
from folio.operator.spec import LoadBalancingSpec

STALE_AFTER = 3.0  # seconds: an older scrape is not used (three missed ones at the 1 s cadence)
# prefix keys a pool remembers having placed: about as many distinct prefixes as its caches can hold
RECENT_KEYS = 8192


@dataclass(eq=False)
class Replica:
    """One engine replica. Identity matters: in-flight counts and health survive config reloads."""

    url: str
    revision: str
    in_flight: int = 0
    healthy: bool = True  # optimistic: sources list replicas their owner already considers ready
    failures: int = 0  # consecutive failed health checks
    last_error: str = ""
    # from the replica's /metrics (loadscrape): requests its engine holds (running + waiting), how many of
    # ours were in flight at that moment, KV cache usage in [0, 1], and when
    engine_requests: int = 0
    ours_at_scrape: int = 0
    kv_usage: float = 0.0
    scraped_at: float | None = None
    resident: frozenset[str] = frozenset()  # adapters its engine holds in memory (engine names), at that scrape

    def mark_up(self) -> None:
        self.healthy, self.failures, self.last_error = True, 0, ""

    def mark_down(self, reason: str) -> None:
        self.healthy, self.last_error = False, reason


def _url(replica: Replica) -> str:
    return replica.url


@dataclass
class _Pool:
    replicas: list[Replica] = field(default_factory=list)
    cursor: int = 0  # rotates the starting point so idle replicas share the load
    ring: HashRing[Replica] = field(default_factory=lambda: HashRing([], _url))
    # key hash -> the URLs of the replicas it went to lately (their caches may hold its prefix), oldest first
    recent: OrderedDict[int, set[str]] = field(default_factory=OrderedDict)

    def holders(self, hashed: int) -> list[Replica] | None:
        """The replicas the key went to lately; None when it has not been placed here lately."""
        urls = self.recent.get(hashed)
        if urls is None:
            return None
        self.recent.move_to_end(hashed)
        return [r for r in self.replicas if r.url in urls]

    def placed(self, hashed: int, replica: Replica) -> None:
        urls = self.recent.get(hashed)
        if urls is None:
            self.recent[hashed] = {replica.url}
            if len(self.recent) > RECENT_KEYS:
                self.recent.popitem(last=False)
        else:
            urls.add(replica.url)


class Balancer:
    """PrefixHash: a request with an affinity key goes to the key's replica on the revision's ring unless
    that one is over the load bound; otherwise (LeastLoaded, or no key) the least loaded wins, ties
    round-robin. Placement never leaves the revision the split chose."""

    def __init__(
        self,
        outliers: OutlierDetector | None = None,
        settings: LoadBalancingSpec | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pools: dict[str, _Pool] = {}
        self.outliers = outliers or OutlierDetector()
        self.settings = settings or LoadBalancingSpec()
        self._clock = clock
        # called with (revision, result: hit | spill | new) for every request placed by its affinity key
        self.on_affinity: Callable[[str, str], None] | None = None

    def configure(self, settings: LoadBalancingSpec) -> None:
        self.settings = settings

    @property
    def by_prefix(self) -> bool:
        """Whether requests should carry an affinity key at all."""
        return self.settings.strategy == "PrefixHash"

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
            if old is not None and [r.url for r in old.replicas] == [r.url for r in replicas]:
                ring = old.ring
            else:  # the ring hashes URLs: replicas that stay keep their keys
                ring = HashRing(replicas, _url)
            pools[revision] = _Pool(replicas, old.cursor if old else 0, ring, old.recent if old else OrderedDict())
        self._pools = pools
        self.outliers.forget(self.replicas())
        return added

    def pick(
        self, revision: str | None, exclude: Collection[Replica] = (), key: str | None = None,
        adapter: str | None = None,
    ) -> Replica | None:
        """``adapter``: the request runs under this adapter revision (its engine name): placed among the replicas
        that hold it in memory while one of them is under the load bound, else anywhere (one loads it)."""
        pool = self._pools.get(revision) if revision is not None else None
        if pool is None or not pool.replicas:
            return None
        now = self._clock()
        allowed = self._allowed(pool, exclude, adapter, now)
        if key is not None and self.by_prefix and len(pool.replicas) > 1:
            hashed = key_hash(key)
            holders = pool.holders(hashed)
            new = holders is None and from_text(key)  # a new session is placed for its next turns: by the ring
            best, spilled = place(
                pool.ring, hashed, lambda r: self.queue_load(r, now), allowed, self.settings.mean_load_factor,
                holders=None if new else holders or (), tie=lambda r: self.load(r, now)[1],
            )  # fmt: skip
            if best is not None:
                pool.placed(hashed, best)
                if self.on_affinity is not None:
                    self.on_affinity(best.revision, AFFINITY_NEW if new else AFFINITY_SPILL if spilled else AFFINITY_HIT)
        else:
            best = self._least_loaded(pool, allowed, now)
        if best is not None:
            self.outliers.started(best)  # a half-open replica's one trial request
        return best

    def _allowed(self, pool: _Pool, exclude: Collection[Replica], adapter: str | None,
                 now: float) -> Callable[[Replica], bool]:
        """Which replicas may take the request: usable and not excluded; for an adapter, those holding it in
        memory (fresh scrapes) while one of them is under the pool's load bound."""

        def usable(r: Replica) -> bool:
            return self.usable(r) and r not in exclude

        if adapter is None:
            return usable
        hot = {r for r in pool.replicas if usable(r) and self.fresh(r, now) and adapter in r.resident}
        if not hot:
            return usable
        loads = [self.queue_load(r, now) for r in pool.replicas if usable(r)]
        bound = load_bound(sum(loads), len(loads), self.settings.mean_load_factor)
        if not any(self.queue_load(r, now) + 1 <= bound for r in hot):
            return usable  # every holder is loaded beyond the bound: another replica loads the adapter
        return hot.__contains__

    def _least_loaded(self, pool: _Pool, allowed: Callable[[Replica], bool], now: float) -> Replica | None:
        replicas = pool.replicas
        n = len(replicas)
        start = pool.cursor % n
        pool.cursor = start + 1
        best: Replica | None = None
        best_load = (0, 0.0)
        for i in range(n):
            r = replicas[(start + i) % n]
            if not allowed(r):
                continue
            load = self.load(r, now)
            if best is None or load < best_load:
                best, best_load = r, load
        return best

    def fresh(self, replica: Replica, now: float) -> bool:
        return replica.scraped_at is not None and now - replica.scraped_at <= STALE_AFTER

    def queue_load(self, replica: Replica, now: float) -> int:
        """Requests on the replica: ours in flight, plus, while the scrape is fresh, the ones its engine held
        then that were not ours."""
        if not self.fresh(replica, now):
            return replica.in_flight
        return replica.in_flight + max(0, replica.engine_requests - replica.ours_at_scrape)

    def load(self, replica: Replica, now: float) -> tuple[int, float]:
        """Ordering for LeastLoaded: queue load first, then how full its KV cache is."""
        return self.queue_load(replica, now), (replica.kv_usage if self.fresh(replica, now) else 0.0)

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

    def in_rotation(self) -> dict[str, int]:
        """Per revision, the replicas a request may go to now (healthy and not ejected)."""
        return {revision: sum(map(self.usable, pool.replicas)) for revision, pool in self._pools.items()}
