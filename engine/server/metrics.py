"""Prometheus metrics under vLLM's names, so existing dashboards, autoscalers and the Gateway API
inference extension work unchanged. Every engine metric is labelled ``model_name``.

Gauges and engine-side totals come from the engine's latest stats snapshot at scrape time; request
counters and latency histograms are fed as outputs reach the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from folio.engine.outputs import EngineStats, RequestOutput
from folio.engine.spec_decode.speculator import SpecDecodeStats

disable_created_metrics()  # vLLM exports no *_created series either

# vLLM's bucket boundaries, so histogram_quantile() queries carry over.
# Adapters in memory on an engine, one series each by lora_name: the router prefers these replicas for them.
LORA_RESIDENT = "folio_engine_lora_resident"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class _EngineStatsCollector(Collector):
    """Reads the engine's stats snapshot when Prometheus scrapes."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self._model = model_name
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        label = ["model_name"]
        for name, doc, value in (
            ("vllm:num_requests_running", "Requests in the running batch.", s.num_running),
            ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", s.kv_cache_usage),
        ):
            g = GaugeMetricFamily(name, doc, labels=label)
            g.add_metric([self._model], value)
            yield g
        for name, doc, value in (
            ("vllm:num_preemptions", "Cumulative preemptions.", s.num_preemptions_total),
            (
                "vllm:prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache.",
                s.prefix_cache_queries_total,
            ),
            ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_cache_hits_total),
        ):
            c = CounterMetricFamily(name, doc, labels=label)
            c.add_metric([self._model], value)
            yield c
        if s.spec_decode is not None:
            yield from _spec_decode_families(self._model, s.spec_decode)


def _spec_decode_families(model: str, spec: SpecDecodeStats) -> Iterator[Metric]:
    """vLLM v1's speculative decoding counters."""
    for name, doc, value in (
        ("vllm:spec_decode_num_drafts", "Verify steps of proposed tokens (one per sequence and step).",
         spec.num_drafts),
        ("vllm:spec_decode_num_draft_tokens", "Proposed tokens verified.", spec.num_draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", "Proposed tokens the target kept.", spec.num_accepted_tokens),
    ):  # fmt: skip
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([model], value)
        yield c
    per_position = CounterMetricFamily(
        "vllm:spec_decode_num_accepted_tokens_per_pos", "Proposed tokens kept, by their position in the proposal.",
        labels=["model_name", "position"],
    )  # fmt: skip
    for position, value in enumerate(spec.accepted_per_position):
        per_position.add_metric([model, str(position)], value)
    yield per_position


class _LoRAInfoCollector(Collector):
    """vLLM's ``vllm:lora_requests_info``: one series whose labels name the adapters of the running and of
    the waiting requests (comma-joined) and ``max_lora``; its value is the time it was read, as vLLM's
    ``set_to_current_time()``. Built at scrape time, so a series of a state gone does not linger."""

    def __init__(self, max_loras: int, state: Callable[[], tuple[list[str], list[str]]]) -> None:
        self._max_loras = max_loras
        self._state = state

    def collect(self) -> Iterator[Metric]:
        running, waiting = self._state()
        g = GaugeMetricFamily(
            "vllm:lora_requests_info", "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )  # fmt: skip
        g.add_metric([str(self._max_loras), _joined(waiting), _joined(running)], time.time())
        yield g


class _LoRAResidentCollector(Collector):
    """Folio's ``folio_engine_lora_resident``: 1 for each adapter in memory (device slots or host cache), by
    ``lora_name``; a request under one starts without reading its files, so a router prefers these replicas for
    it (`folio.operator.router.balancer`). Built at scrape time, like the info series above."""

    def __init__(self, resident: Callable[[], list[str]]) -> None:
        self._resident = resident

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(LORA_RESIDENT, "Adapters in memory (device slots or host cache).", labels=["lora_name"])
        for name in sorted(set(self._resident())):
            g.add_metric([name], 1.0)
        yield g


def _joined(names: list[str]) -> str:
    """Each adapter once, in a stable order, whatever the engine's order of requests."""
    return ",".join(sorted(set(names)))


@dataclass
class _Timing:
    arrival: float
    model_name: str  # the served model's or the request's adapter's
    last: float | None = None  # when the last token arrived; None before the first


class ServerMetrics:
    """The metrics of one served model, in a registry of their own (several apps can share a process)."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(_EngineStatsCollector(model_name, stats))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        reg, label = self.registry, ["model_name"]
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", label, registry=reg)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", label, registry=reg)
        self.request_success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            [*label, "finished_reason"],
            registry=reg,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            label,
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Time between tokens.",
            label,
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Request latency.", label, buckets=E2E_BUCKETS, registry=reg
        )
        self.request_errors = Counter(
            "folio_engine_request_errors",
            "Requests failed by an error inside an engine step (answered 500); the engine kept running.",
            label,
            registry=reg,
        )
        self.request_errors.labels(model_name)  # exported as 0 from the start, so rate() has a baseline
        self._timings: dict[str, _Timing] = {}

    def track_lora(self, max_loras: int, state: Callable[[], tuple[list[str], list[str]]],
                   resident: Callable[[], list[str]] = list) -> None:
        """Exports ``vllm:lora_requests_info`` (with `--enable-lora` only, as vLLM does) and Folio's
        ``folio_engine_lora_resident``."""
        self.registry.register(_LoRAInfoCollector(max_loras, state))
        self.registry.register(_LoRAResidentCollector(resident))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # The hooks below run on the event loop, one sequence (engine request id) at a time.

    def on_added(self, request_id: str, prompt_tokens: int, model_name: str | None = None) -> None:
        """``model_name``: the request's adapter, which labels its request metrics (vLLM's); None: the base."""
        t = self._timings[request_id] = _Timing(arrival=time.monotonic(), model_name=model_name or self.model_name)
        self.prompt_tokens.labels(t.model_name).inc(prompt_tokens)

    def on_output(self, out: RequestOutput, now: float) -> None:
        t = self._timings.get(out.request_id)
        if t is None or not out.outputs:
            return
        if out.error is not None:
            self._timings.pop(out.request_id)
            self.request_errors.labels(t.model_name).inc()
            return
        new = len(out.outputs[0].token_ids)  # a step output carries only its new tokens
        if new > 0:
            self.generation_tokens.labels(t.model_name).inc(new)
            if t.last is None:
                self.ttft.labels(t.model_name).observe(now - t.arrival)
                new -= 1  # the first token has no inter-token gap
            elif new:
                gap = (now - t.last) / new
                for _ in range(new):
                    self.itl.labels(t.model_name).observe(gap)
            t.last = now
        if out.finished:
            reason = out.outputs[0].finish_reason or "stop"
            self._finish(out.request_id, reason, now)

    def on_aborted(self, request_id: str) -> None:
        if request_id in self._timings:
            self._finish(request_id, "abort", time.monotonic())

    def _finish(self, request_id: str, reason: str, now: float) -> None:
        t = self._timings.pop(request_id)
        self.request_success.labels(t.model_name, reason).inc()
        self.e2e.labels(t.model_name).observe(now - t.arrival)
