"""Each tenant's usage over the last minute and hour (`folio status NAME --tenants`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from folio.operator import metric_names as m
from folio.operator.k8s.names import COMPONENT_LABEL
from folio.operator.local.render_tenants import tenants_table
from folio.operator.local.target import Cluster
from folio.operator.router.metrics import RouterMetrics
from folio.operator.router.usage import FIELDS, Ring, TenantUsage, merge


def test_a_ring_forgets_what_left_its_window() -> None:
    ring = Ring(60, 1.0)
    ring.add(0.5, (1, 0, 0, 10, 20))
    ring.add(30.0, (1, 1, 0, 0, 0))
    assert ring.total(30.0) == {"requests": 2, "rate_limited": 1, "errors": 0, "prompt_tokens": 10,
                                "completion_tokens": 20}  # fmt: skip
    assert ring.total(60.4)["requests"] == 1  # the first slot (0-1 s) is over a minute old
    ring.add(90.0, (1, 0, 1, 0, 0))  # slot 30 again, a minute on: the old count there is gone
    assert ring.total(90.0) == {"requests": 1, "rate_limited": 0, "errors": 1, "prompt_tokens": 0,
                                "completion_tokens": 0}  # fmt: skip
    assert ring.total(1000.0)["requests"] == 0


def test_usage_by_tenant_minute_and_hour_and_merged() -> None:
    usage = TenantUsage(())
    usage.record("search", "200", 5, 7, now=0.0)
    usage.record("search", "429", 0, 0, now=10.0)
    usage.record("batch", "503", 0, 0, now=100.0)
    snap = usage.snapshot(now=100.0)
    assert snap["search"]["minute"]["requests"] == 0 and snap["search"]["hour"]["requests"] == 2
    assert snap["search"]["hour"] == {"requests": 2, "rate_limited": 1, "errors": 0, "prompt_tokens": 5,
                                      "completion_tokens": 7}  # fmt: skip
    assert snap["batch"]["minute"]["errors"] == 1
    both = merge([snap, snap])
    assert both["search"]["hour"]["completion_tokens"] == 14 and list(both) == ["batch", "search"]
    console = Console(record=True, width=160)
    console.print(tenants_table("chat", both, 2))
    text = console.export_text()
    assert "2 routers" in text and "search" in text and "0 / 14" in text


def test_seconds_join_the_hour_as_they_end() -> None:
    """A second's counts move from the minute's current slot into the hour once a later second begins; the
    windows read the same before and after."""
    usage = TenantUsage(())
    for t in range(0, 200, 2):  # a request every two seconds, 5 + 1 tokens each
        usage.record("a", "200", 5, 1, now=t + 0.5)
        snap = usage.snapshot(now=t + 0.9)["a"]
        assert snap["hour"]["requests"] == t // 2 + 1 and snap["hour"]["prompt_tokens"] == 5 * (t // 2 + 1)
        assert snap["minute"]["requests"] == min(t // 2 + 1, 30)
    assert usage.snapshot(now=3700.0)["a"]["hour"]["requests"] == 40  # minutes 2-3 (120-198 s) are within it
    assert usage.snapshot(now=4000.0)["a"] == {name: dict.fromkeys(FIELDS, 0) for name in ("minute", "hour")}


def test_the_prometheus_series_are_rendered_from_the_counts() -> None:
    metrics = RouterMetrics("chat")
    metrics.tenants.record("search", "200", 10, 4, now=1.0)
    metrics.tenants.record("search", "429", 0, 0, now=2.0)
    metrics.tenants.queued("search", 0.0)
    metrics.tenants.queued("search", 0.02)
    metrics.tenants.queued("search", 100.0)
    metrics.tenants.shed("batch", "full")

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"isvc": "chat", **labels})

    assert value(m.TENANT_REQUESTS, tenant="search", code="200") == 1
    assert value(m.TENANT_REQUESTS, tenant="search", code="429") == 1
    assert value(m.TENANT_TOKENS, tenant="search", kind="prompt") == 10
    assert value(m.TENANT_TOKENS, tenant="search", kind="completion") == 4
    assert value(m.TENANT_QUEUE + "_bucket", tenant="search", le="0.001") == 1
    assert value(m.TENANT_QUEUE + "_bucket", tenant="search", le="0.02") == 2  # le: at most the bound
    assert value(m.TENANT_QUEUE + "_bucket", tenant="search", le="60.0") == 2
    assert value(m.TENANT_QUEUE + "_bucket", tenant="search", le="+Inf") == 3
    assert value(m.TENANT_QUEUE + "_count", tenant="search") == 3
    assert value(m.TENANT_QUEUE + "_sum", tenant="search") == 100.02
    assert value(m.TENANT_SHED, tenant="batch", reason="full") == 1
    assert value(m.TENANT_REQUESTS, tenant="batch", code="200") is None  # shed only: no answer series
    text = metrics.render().decode()
    assert "# TYPE folio_router_tenant_requests_total counter" in text
    assert "# TYPE folio_router_tenant_queue_seconds histogram" in text


class _Kube:
    """The two calls `Cluster.router_usage` makes, answered as an API server would."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def list(self, api_version: str, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        assert (api_version, kind, namespace) == ("v1", "Pod", "ml") and labels[COMPONENT_LABEL] == "router"
        return [{"metadata": {"name": "chat-a"}, "status": {"phase": "Running"}},
                {"metadata": {"name": "chat-b"}, "status": {"phase": "Pending"}}]  # fmt: skip

    def call(self, method: str, path: str) -> dict[str, Any]:
        self.paths.append(path)
        return {"tenants": {"search": {"minute": {"requests": 3}, "hour": {"requests": 9}}}}


def test_a_cluster_asks_each_running_router_through_the_api_servers_proxy() -> None:
    cluster = Cluster("ml")
    kube = cluster._kube = _Kube()  # type: ignore[assignment]
    usage = cluster.router_usage("chat")
    assert kube.paths == ["/api/v1/namespaces/ml/pods/chat-a:8080/proxy/folio/v1/tenants"]
    assert merge(usage)["search"]["hour"]["requests"] == 9
