"""Router and engine metrics read as the autoscaler's load."""

from __future__ import annotations

from datetime import datetime, timezone

from folio.operator.autoscaling.load import LoadMeter, read_engine, read_router
from folio.operator.router.metrics import RouterMetrics
from folio.operator.spec import AutoscalingSpec

NOW = datetime(2026, 12, 3, tzinfo=timezone.utc)
ENGINE = """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.5
"""


def router_text(in_flight: int = 0, held: int = 0, requests: int = 0) -> str:
    metrics = RouterMetrics("chat")
    for _ in range(in_flight):
        metrics.attempt_started("r1")
    for _ in range(requests):
        metrics.attempt_started("r1")
        metrics.attempt_finished("r1", "200", 0.1)
    metrics.held.labels("chat").set(held)
    return metrics.render().decode()


def test_readings() -> None:
    r = read_router(router_text(in_flight=3, held=2, requests=5), "chat")
    assert (r.in_flight, r.held, r.requests) == (3, 2, 5)
    assert read_router(router_text(in_flight=3), "other").in_flight == 0
    e = read_engine(ENGINE)
    assert (e.waiting, e.running, e.kv_cache) == (3, 2, 0.5)


def test_meter_per_metric_and_activity() -> None:
    spec = AutoscalingSpec(metric="InFlight")
    meter = LoadMeter("chat")
    load = meter.load(spec, NOW, {"a": router_text(in_flight=3, held=2)}, {}, ready=1, starting=0)
    assert load.value == 5 and load.held == 2 and load.active
    idle = router_text(requests=4)
    assert meter.load(spec, NOW, {"b": idle}, {}, ready=1, starting=0).active is False  # first look: a baseline
    assert meter.load(spec, NOW, {"b": idle}, {}, ready=1, starting=0).active is False
    assert meter.load(spec, NOW, {"b": router_text(requests=5)}, {}, ready=1, starting=0).active  # one came
    assert meter.load(spec, NOW, {}, {}, ready=1, starting=0).value is None  # no router answered
    assert meter.load(spec, NOW, {}, {}, ready=0, starting=0, asked=True).held == 1
    waiting = meter.load(AutoscalingSpec(metric="Waiting", target=2), NOW, {"a": router_text(held=1)},
                         {"e1": ENGINE, "e2": ENGINE}, ready=2, starting=0)
    assert waiting.value == 7 and waiting.active
    kv = meter.load(AutoscalingSpec(metric="KVCache", target=0.8), NOW, {}, {"e1": ENGINE}, ready=1, starting=0)
    assert kv.value == 0.5
