"""The router config, decided once from typed status for the cluster's routers and `folio up`'s."""

from __future__ import annotations

from folio.operator.serving.router import RoutedSpec, RouterConfig, routable, router_config
from folio.operator.spec import (
    CanaryStatus,
    InferenceServiceStatus,
    LoadBalancingSpec,
    MigrationSpec,
    OutlierDetectionSpec,
    TrafficTarget,
    engine_args,
)
from tests.serving.helpers import make_spec


def status(*weights: tuple[str, int], stable: str = "s1", canary: str | None = None) -> InferenceServiceStatus:
    return InferenceServiceStatus(
        stable_revision=stable, canary_revision=canary, canary=CanaryStatus() if canary else None,
        traffic=[TrafficTarget(revision=r, weight=w) for r, w in weights],
    )  # fmt: skip


def test_traffic_stable_canary_and_the_endpoints_of_routable_revisions() -> None:
    st = status(("s1", 90), ("c1", 10), canary="c1")
    endpoints = {"s1": ["http://10.0.0.1:8000"], "c1": ["http://10.0.0.2:8000"], "old": ["http://10.0.0.3:8000"]}
    cfg = router_config(RoutedSpec.of(make_spec(shadow={"percent": 5})), st, endpoints, overflow_api_key="sk-1")
    assert [(t.revision, t.weight) for t in cfg.traffic] == [("s1", 90), ("c1", 10)]
    assert (cfg.stable, cfg.canary) == ("s1", "c1")
    assert cfg.endpoints == {"c1": ["http://10.0.0.2:8000"], "s1": ["http://10.0.0.1:8000"]}, "not a retiring one"
    assert cfg.shadow_fraction == 0.05
    assert cfg.overflow is not None and (cfg.overflow.url, cfg.overflow.api_key) == ("https://overflow.example", "sk-1")


def test_a_canary_without_traffic_is_still_named() -> None:
    """Both runtimes name the canary, so shadow copies go to it before its first step (as in a cluster)."""
    st = status(("s1", 100), canary="c1")
    cfg = router_config(None, st, {"c1": ["http://127.0.0.1:9002"]})
    assert cfg.canary == "c1" and cfg.endpoints == {"c1": ["http://127.0.0.1:9002"], "s1": []}
    assert cfg.overflow is None and cfg.shadow is None  # no spec to read them from
    assert routable(st) == ["c1", "s1"]


def test_the_canary_serves_only_with_a_positive_weight() -> None:
    assert status(("s1", 90), ("c1", 10), canary="c1").serving_canary == "c1"
    assert status(("s1", 100), canary="c1").serving_canary is None
    assert status(("s1", 100), ("c1", 0), canary="c1").serving_canary is None
    assert status(("s1", 100)).serving_canary is None


def test_the_wire_form_is_what_the_file_source_reads() -> None:
    cfg = router_config(RoutedSpec.of(make_spec()), status(("s1", 80), ("c1", 20), canary="c1"), {"s1": ["http://a:1"]})
    assert RouterConfig.parse(cfg.to_wire()) == cfg
    assert set(cfg.to_wire()) == {
        "traffic", "endpoints", "stable", "canary", "overflow", "outlierDetection", "requestTimeout",
        "loadBalancing", "migration", "adapters",
    }  # fmt: skip


def test_the_spec_load_balancing_reaches_the_router() -> None:
    spec = make_spec()
    chosen = LoadBalancingSpec(strategy="LeastLoaded", prefix_char_length=400, mean_load_factor=1.5)
    spec = spec.model_copy(update={"router": spec.router.model_copy(update={"load_balancing": chosen})})
    cfg = router_config(RoutedSpec.of(spec), status(("s1", 100)), {"s1": ["http://a:1"]})
    assert cfg.load_balancing == chosen
    default = router_config(RoutedSpec.of(make_spec()), status(("s1", 100)), {"s1": ["http://a:1"]}).load_balancing
    assert (default.strategy, default.prefix_char_length, default.mean_load_factor) == ("PrefixHash", 100, 1.25)


def test_the_spec_outlier_detection_reaches_the_router() -> None:
    spec = make_spec()
    spec = spec.model_copy(update={"router": spec.router.model_copy(update={
        "outlier_detection": OutlierDetectionSpec(consecutive_errors=2, base_ejection_time="5s")})})
    cfg = router_config(RoutedSpec.of(spec), status(("s1", 100)), {"s1": ["http://a:1"]})
    assert cfg.outlier_detection == OutlierDetectionSpec(consecutive_errors=2, base_ejection_time="5s")


def test_the_spec_migration_reaches_the_router_in_both_runtimes() -> None:
    spec = make_spec()
    default = router_config(RoutedSpec.of(spec), status(("s1", 100)), {}).migration
    assert (default.max_attempts, default.inter_chunk_timeout_seconds) == (3, 30.0)
    chosen = MigrationSpec(max_attempts=0, inter_chunk_timeout="1500ms")
    spec = spec.model_copy(update={"router": spec.router.model_copy(update={"migration": chosen})})
    cfg = router_config(RoutedSpec.of(spec), status(("s1", 100)), {"s1": ["http://a:1"]})
    assert cfg.migration == chosen
    assert cfg.to_wire()["migration"] == {"maxAttempts": 0, "interChunkTimeout": "1500ms"}  # `folio up`'s file
    assert RouterConfig.parse(cfg.to_wire()).migration == chosen
    assert RoutedSpec.from_wire(spec.to_wire())[0].router.migration == chosen  # the in-cluster watch
    bad = RouterConfig.parse({**cfg.to_wire(), "migration": {"maxAttempts": 11}})
    assert bad.migration == MigrationSpec() and "migration" in bad.problems[0]  # dropped, not the whole config


def test_the_analysis_request_timeout_reaches_the_router() -> None:
    spec = make_spec()
    assert router_config(RoutedSpec.of(spec), status(("s1", 100)), {}).request_timeout_seconds == 60.0  # the spec's default
    analysis = spec.rollout.analysis.model_copy(update={"request_timeout": "1500ms"})
    spec = spec.model_copy(update={"rollout": spec.rollout.model_copy(update={"analysis": analysis})})
    assert router_config(RoutedSpec.of(spec), status(("s1", 100)), {}).request_timeout_seconds == 1.5


def test_the_watch_reads_the_routing_parts_alone() -> None:
    """An in-cluster router parses only what routing needs: a part it cannot read is left at its default and
    named, and a problem elsewhere in the spec (an engine arg the operator refuses) is none of its business."""
    wire = make_spec(shadow={"percent": 5}).to_wire()
    wire["engine"] = {"args": {"noSuchFlag": 1}}
    wire["router"]["loadBalancing"] = {"strategy": "Nearest"}
    routed, problems = RoutedSpec.from_wire(wire)
    assert routed.shadow is not None and routed.shadow.percent == 5
    assert routed.router.load_balancing == LoadBalancingSpec() and len(problems) == 1
    assert "spec.router.loadBalancing.strategy" in problems[0]
    assert RoutedSpec.from_wire(make_spec().to_wire()) == (RoutedSpec.of(make_spec()), [])


def test_a_canary_waiting_for_its_parity_gate_gets_no_shadow_copy() -> None:
    spec = RoutedSpec.of(make_spec(shadow={"percent": 5})).model_copy(update={"parity_gate": True})
    waiting = status(("s1", 100), canary="c1")
    assert router_config(spec, waiting, {}).shadow is None
    stepping = waiting.model_copy(update={"canary": CanaryStatus(step_started_at="2026-01-01T00:00:00Z")})
    assert router_config(spec, stepping, {}).shadow is not None


def test_tenants_queue_past_the_engines_max_num_seqs_and_priorities_turn_on_the_priority_policy() -> None:
    tenants = [{"name": "search", "priority": "Critical"}, {"name": "batch"}]
    spec = make_spec(access={"anonymous": True, "tenants": tenants})
    assert engine_args(spec)["schedulingPolicy"] == "priority"
    assert "schedulingPolicy" not in engine_args(make_spec(access={"anonymous": True, "tenants": [{"name": "a"}]}))
    assert router_config(RoutedSpec.of(spec), status(("s1", 100)), {}).access.slots == 256  # the engine's default
    spec.engine.args["maxNumSeqs"] = 24
    spec.engine.args["schedulingPolicy"] = "fcfs"  # the spec's own word stands
    assert engine_args(spec)["schedulingPolicy"] == "fcfs"
    cfg = router_config(RoutedSpec.of(spec), status(("s1", 100)), {})
    assert cfg.access is not None and cfg.access.slots == 24
    assert RouterConfig.parse(cfg.to_wire()).access == cfg.access  # `folio up`'s file
    assert RoutedSpec.from_wire(spec.to_wire())[0].slots == 24  # the in-cluster watch
    wire = spec.to_wire()
    wire["engine"]["args"]["maxNumSeqs"] = "lots"  # refused in status by the operator; routing keeps the default
    assert RoutedSpec.from_wire(wire)[0].slots == 256
