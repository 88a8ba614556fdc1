"""Each tenant's usage over the last minute and hour (`folio status NAME --tenants`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from folio.operator.k8s.names import COMPONENT_LABEL
from folio.operator.local.render_tenants import tenants_table
from folio.operator.local.target import Cluster
from folio.operator.router.usage import Ring, TenantUsage, merge


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
    usage = TenantUsage()
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
