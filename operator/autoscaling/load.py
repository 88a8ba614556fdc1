"""The autoscaler's readings: router and engine `/metrics` texts turned into a `decide.Load`.

- routers (`folio_router_in_flight`, `folio_router_held_requests`, `folio_router_requests_total`):
  what InFlight counts (requests in flight upstream plus those held for a replica), and whether any
  request came since the last look (a counter that grew: a short request between two looks counts);
- engines (`vllm:num_requests_waiting`, `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`):
  Waiting is the sum of the queues (plus the held requests: they wait too), KVCache the mean use.

`LoadMeter` keeps the previous request counters per router (in memory: after a restart the first look
only sets them, which at worst delays a scale down by one look).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from prometheus_client.parser import text_string_to_metric_families

from folio.operator import metric_names as m
from folio.operator.autoscaling.decide import Load
from folio.operator.spec import AutoscalingSpec

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE = "vllm:kv_cache_usage_perc"


@dataclass(frozen=True)
class RouterReading:
    in_flight: float = 0.0
    held: int = 0
    requests: float = 0.0  # the requests counter's total


@dataclass(frozen=True)
class EngineReading:
    waiting: float = 0.0
    running: float = 0.0
    kv_cache: float = 0.0


def read_router(text: str, isvc: str) -> RouterReading:
    in_flight = held = requests = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get(m.ISVC) != isvc:
                continue
            if s.name == m.IN_FLIGHT:
                in_flight += s.value
            elif s.name == m.HELD:
                held += s.value
            elif s.name == m.REQUESTS:
                requests += s.value
    return RouterReading(max(in_flight, 0.0), int(held), requests)


def read_engine(text: str) -> EngineReading:
    values = {WAITING: 0.0, RUNNING: 0.0, KV_CACHE: 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in values:
                values[s.name] += s.value
    return EngineReading(values[WAITING], values[RUNNING], values[KV_CACHE])


class LoadMeter:
    def __init__(self, isvc: str) -> None:
        self.isvc = isvc
        self._requests: dict[str, float] = {}

    def load(self, spec: AutoscalingSpec, now: datetime, routers: Mapping[str, str], engines: Mapping[str, str],
             *, ready: int, starting: int, asked: bool = False) -> Load:
        """A `Load` from ``{url: metrics text}`` of every router and ready engine; ``asked``: the
        scale-up annotation is present (someone wants a replica: count one held request)."""
        seen: dict[str, RouterReading] = {}
        for url, text in routers.items():
            try:
                seen[url] = read_router(text, self.isvc)
            except ValueError:
                continue  # unreadable: as if not scraped
        engine_readings = []
        for text in engines.values():
            try:
                engine_readings.append(read_engine(text))
            except ValueError:
                continue
        arrived = any(r.requests > self._requests.get(url, r.requests) for url, r in seen.items())
        self._requests = {url: r.requests for url, r in seen.items()}
        held = sum(r.held for r in seen.values()) or int(asked)
        in_flight = sum(r.in_flight for r in seen.values())
        busy = any(e.running > 0 or e.waiting > 0 for e in engine_readings)
        value: float | None
        if spec.metric == "InFlight":
            value = in_flight + held if seen else None
        elif spec.metric == "Waiting":
            value = sum(e.waiting for e in engine_readings) + held if (engine_readings or seen) else None
        else:
            value = sum(e.kv_cache for e in engine_readings) / len(engine_readings) if engine_readings else (
                0.0 if seen else None)
        active = arrived or busy or in_flight > 0 or held > 0
        return Load(now=now, value=value, ready=ready, starting=starting, active=active, held=held)
