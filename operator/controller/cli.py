"""`folio operator`: run the kopf operator for InferenceServices, with its own /metrics port."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import random
import sys
from typing import TYPE_CHECKING, Any

from folio.operator.k8s.names import ENDPOINT_PICKER_CLUSTER_ROLE, ROUTER_CLUSTER_ROLE
from folio.operator.spec import DEFAULT_IMAGE

if TYPE_CHECKING:
    from folio.operator.serving.validate import Site

# The peering object replicas use when `--peering` is not given (and only if kopf's CRD is served).
AUTO_PEERING = "folio"
# A killed active replica's heartbeat counts this long: the standby takes over within it (plus a pass).
# kopf's default of 60 s would leave a canary unwatched for a minute; heartbeats then go every 1-5 s.
PEERING_LIFETIME_S = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS",
                       help="watch this namespace (repeatable; default: the current one)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument("--metrics-port", type=int, default=8090, help="port of /metrics (0: off)")
    parser.add_argument("--health-port", type=int, default=8081, help="port of kopf's /healthz (0: off)")
    parser.add_argument("--resync-seconds", type=float, default=10.0,
                        help="the longest an InferenceService goes unchecked (drift repair); rollout steps "
                        "and drains are acted on when they are due")
    parser.add_argument("--image", default=os.environ.get("FOLIO_IMAGE", DEFAULT_IMAGE),
                        help="image for the router and pre-pull pods (default: $FOLIO_IMAGE or the release)")
    parser.add_argument("--cache-access-mode", action="append", default=None,
                        choices=["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"],
                        help="access mode of the weights cache PVCs (default ReadWriteMany, which engines "
                        "on several nodes need; ReadWriteOnce suits a one-node cluster)")
    parser.add_argument("--router-cluster-role", default=os.environ.get("FOLIO_ROUTER_CLUSTER_ROLE", ROUTER_CLUSTER_ROLE),
                        help="the ClusterRole each router's RoleBinding refers to (the chart creates it; "
                        f"default: $FOLIO_ROUTER_CLUSTER_ROLE or {ROUTER_CLUSTER_ROLE})")
    parser.add_argument("--operator-pod-labels", default=os.environ.get("FOLIO_OPERATOR_POD_LABELS", ""),
                        metavar="K=V,...", help="labels of the operator's own pods, which the engines' "
                        "NetworkPolicies admit (with $POD_NAMESPACE; the chart sets both)")
    parser.add_argument("--peering", default=None, metavar="NAME",
                        help="kopf peering object that replicas elect the active one through; named, it is "
                        "required: the replica waits, paused, until it sees no live peer of a higher priority. "
                        f"'' runs standalone; unset, {AUTO_PEERING!r} is used if its CRD is served (else standalone)")
    parser.add_argument("--peering-lifetime", type=int, default=PEERING_LIFETIME_S, metavar="SECONDS",
                        help="how long a replica's heartbeat in the peering object counts: a standby takes "
                        "over this long after the active replica's last one at the latest (each is renewed "
                        "5-10 s before it runs out, at least 1 s apart; kopf's own default is 60)")
    parser.add_argument("--priority", type=int, default=None,
                        help="peering priority of this replica (default: random, so replicas of one "
                        "Deployment never tie; kopf pauses every peer of equal priority)")
    parser.add_argument("--inference-pool", action=argparse.BooleanOptionalAction, default=False,
                        help="publish a Gateway API InferencePool for InferenceServices that leave "
                        "spec.router.inferencePool unset (default: no)")
    parser.add_argument("--endpoint-picker-port", type=int, default=9002, metavar="PORT",
                        help="port of each InferencePool's endpoint picker Service {name}-epp (0: no endpointPickerRef)")
    parser.add_argument("--endpoint-picker-image", default="", metavar="IMAGE",
                        help="deploy each InferencePool's endpoint picker (the Gateway API inference extension's "
                        "EPP) with this image; empty (default): deploy none, users bring their own")
    parser.add_argument("--endpoint-picker-cluster-role",
                        default=os.environ.get("FOLIO_ENDPOINT_PICKER_CLUSTER_ROLE", ENDPOINT_PICKER_CLUSTER_ROLE),
                        help="the ClusterRole each InferenceService's endpoint pickers are bound to (the chart "
                        f"creates it; default: $FOLIO_ENDPOINT_PICKER_CLUSTER_ROLE or {ENDPOINT_PICKER_CLUSTER_ROLE})")
    parser.add_argument("--allow-fault-injection", action="store_true",
                        help="accept InferenceServices that set the engine's fault-injection test aids "
                        "(spec.engine.args faultErrorRate, faultLatencyMs, faultLogitNoise, faultCrashAfterTokens; "
                        "refused by default)")
    parser.add_argument("-v", "--verbose", action="store_true")


def parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    """``k=v,k2=v2`` as sorted pairs; raises ValueError on an item without ``=``."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--operator-pod-labels: expected KEY=VALUE, got {item!r}")
        pairs.append((key, value))
    return tuple(sorted(pairs))


def site(args: argparse.Namespace) -> Site:
    """The validation rules the operator applies: a cluster's, with `--allow-fault-injection` as asked."""
    from folio.operator.serving.validate import CLUSTER

    return dataclasses.replace(CLUSTER, fault_injection=args.allow_fault_injection)


def main(args: argparse.Namespace) -> int:
    import kopf
    import kubernetes
    from prometheus_client import start_http_server

    from folio.operator.controller.handlers import configure, register, start_heap_keeper
    from folio.operator.controller.peering import check as check_peering
    from folio.operator.controller.reconcile import Context
    from folio.operator.controller.watches import Watches
    from folio.operator.k8s.client import Kube
    from folio.operator.k8s.names import current_namespace
    from folio.operator.serving.objects import PlanSettings

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    namespaces = args.namespace or ([] if args.all_namespaces else [current_namespace()])
    peering = AUTO_PEERING if args.peering is None else args.peering or None
    settings = configure(kopf.OperatorSettings(), peering=peering, clusterwide=args.all_namespaces,
                         peering_required=bool(args.peering), peering_lifetime=args.peering_lifetime)
    registry = register(kopf.OperatorRegistry())
    # kopf logs in as our own client does: the pod's service account, else the kubeconfig.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    try:
        kube = Kube.from_environment()
    except (kubernetes.config.ConfigException, OSError) as exc:
        print(f"folio operator: no Kubernetes credentials (in-cluster or kubeconfig): {exc}", file=sys.stderr)
        return 2
    try:
        operator_labels = parse_labels(args.operator_pod_labels)
    except ValueError as exc:
        print(f"folio operator: {exc}", file=sys.stderr)
        return 2
    kopf.on.startup(registry=registry)(start_heap_keeper)
    if settings.peering.mandatory:  # a replica that would wait in vain for its peering object says so
        kopf.on.startup(registry=registry)(check_peering(kube, settings.peering.name, namespaces or [None]))
    plan_settings = PlanSettings(image=args.image,
                                 cache_access_modes=tuple(args.cache_access_mode or ["ReadWriteMany"]),
                                 router_cluster_role=args.router_cluster_role,
                                 operator_namespace=os.environ.get("POD_NAMESPACE") or None,
                                 operator_labels=operator_labels,
                                 inference_pool=args.inference_pool, endpoint_picker_port=args.endpoint_picker_port,
                                 endpoint_picker_image=args.endpoint_picker_image,
                                 endpoint_picker_cluster_role=args.endpoint_picker_cluster_role)
    watches = Watches(registry, settings)
    ctx = Context(kube=kube, plan_settings=plan_settings, resync_s=args.resync_seconds, site=site(args),
                  watches=watches)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    options: dict[str, Any] = {"clusterwide": True} if args.all_namespaces else {"namespaces": namespaces}
    kopf.run(
        registry=registry,
        settings=settings,
        memo=kopf.Memo(ctx=ctx),
        insights=watches.insights,
        standalone=peering is None,
        priority=args.priority if args.priority is not None else random.randint(1, 2**31 - 1),
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None,
        **options,
    )
    return 0
