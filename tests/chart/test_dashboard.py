"""The Grafana dashboard queries only series that the engine and the router really export."""

from __future__ import annotations

import json
import re

from tests.chart import helm as h
from tests.chart.conftest import ENGINE_TARGET_LABELS, MATCHER, METRIC_NAME, SUM_BY

DASHBOARD = json.loads((h.CHART / "files" / "grafana-dashboard.json").read_text())
def _queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p.get("targets", [])]


def test_every_query_uses_exported_series_and_labels(series: dict[str, set[str]]) -> None:
    used = set()
    for title, expr in _queries():
        metrics = METRIC_NAME.findall(expr)
        assert metrics, f"{title}: no Folio metric in {expr}"
        for name, matchers in metrics:
            assert name in series, f"{title}: {name} is not exported by Folio"
            used.add(name)
            for label in MATCHER.findall(matchers):
                assert label in series[name], f"{title}: {name} has no label {label!r}"
            for group in SUM_BY.findall(expr):
                for label in (x.strip() for x in group.split(",")):
                    assert label in series[name], f"{title}: {name} has no label {label!r} to sum by"
    # the figures the canary analysis decides on are all on the dashboard
    assert {"folio_router_requests_total", "folio_router_request_duration_seconds_bucket",
            "folio_router_time_to_first_token_seconds_bucket", "folio_router_traffic_weight"} <= used
    assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total",
            "vllm:time_to_first_token_seconds_bucket"} <= used
    assert {"folio_operator_reconciles_total", "folio_operator_reconcile_duration_seconds_bucket"} <= used


def test_variables_are_defined_and_panels_are_unique() -> None:
    defined = {v["name"] for v in DASHBOARD["templating"]["list"]}
    for title, expr in _queries():
        for var in re.findall(r"\$([a-zA-Z_]+)", expr):
            assert var in defined | {"__rate_interval"}, f"{title}: ${var} is not a dashboard variable"
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in DASHBOARD["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert {t["refId"] for t in panel["targets"]} == {chr(65 + i) for i in range(len(panel["targets"]))}


def test_dashboard_configmap(rendered: dict[str, list[h.Obj]]) -> None:
    (cm,) = [o for o in h.find(rendered["observability"], "ConfigMap") if o["metadata"]["name"].endswith("dashboard")]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["folio.json"]) == DASHBOARD
    assert not h.find(rendered["defaults"], "ConfigMap")


def test_service_monitors_select_what_the_operator_creates(rendered: dict[str, list[h.Obj]]) -> None:
    """Selectors and port names must match the planner's router and engine Services."""
    from folio.operator.serving.objects import Owner, PlanSettings, engine_service, router_objects
    from folio.operator.spec import InferenceServiceSpec

    spec = InferenceServiceSpec.model_validate({"model": {"source": "hf://org/m", "revision": "a" * 40}})
    owner = Owner("chat", "models", "uid")
    services = {
        "routers": next(o for o in router_objects(owner, spec, PlanSettings()) if o["kind"] == "Service"),
        "engines": engine_service(owner, "r1"),
    }
    monitors = {m["metadata"]["name"].rsplit("-", 1)[1]: m for m in h.find(rendered["observability"], "ServiceMonitor")}
    assert set(monitors) == {"operator", "routers", "engines"}
    for which, service in services.items():
        monitor = monitors[which]["spec"]
        assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        ports = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in monitor["endpoints"]} <= ports
        assert monitor["namespaceSelector"] == {"matchNames": [h.NAMESPACE]}
    relabeled = {r["targetLabel"] for r in monitors["engines"]["spec"]["endpoints"][0]["relabelings"]}
    assert relabeled == ENGINE_TARGET_LABELS
    operator = h.one(rendered["observability"], "Service")
    assert monitors["operator"]["spec"]["selector"]["matchLabels"].items() <= operator["metadata"]["labels"].items()
    assert monitors["operator"]["metadata"]["labels"]["release"] == "prometheus"


def test_service_monitors_follow_the_watch_scope(helm: str) -> None:
    objects = h.template(helm, {"operator": {"allNamespaces": True}, "metrics": {"serviceMonitor": {"enabled": True}}})
    selectors = [m["spec"].get("namespaceSelector") for m in h.find(objects, "ServiceMonitor")]
    assert selectors == [None, {"any": True}, {"any": True}]  # the operator's own lives in its namespace
