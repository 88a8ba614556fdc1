"""Where `folio status|promote|abort|retry` go: the local `folio up` in the state folder, or the cluster.

Kept light (no FastAPI, kubernetes or torch at import time) because `folio --help` imports every
command module. In a cluster the InferenceService is read with Folio's one Kubernetes client, and
the manual overrides are annotations (`folio.dev/promote|abort|retry`) that the operator acts on
and clears, exactly as the rollout state machine's ``overrides`` input expects.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from folio.operator.k8s.client import Kube
    from folio.operator.local.client import LocalClient

DEFAULT_STATE_DIR = ".folio"


def add_state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help=f"state folder of the local `folio up` (default: {DEFAULT_STATE_DIR} in the working directory)",
    )


def add_target_arguments(parser: argparse.ArgumentParser, *, name_required: bool = True) -> None:
    parser.add_argument("name", nargs=None if name_required else "?", help="InferenceService name")
    add_state_dir(parser)
    parser.add_argument(
        "--kubernetes", action="store_true", help="talk to the cluster even when a local `folio up` runs here"
    )
    parser.add_argument("-n", "--namespace", help="cluster namespace (default: the kube context's)")


def fail(command: str, message: str) -> int:
    """A command's error: one line on stderr, exit code 1."""
    print(f"folio {command}: {message}", file=sys.stderr)
    return 1


class ClusterError(RuntimeError):
    """No usable cluster, or the API server refused; the message says why."""


class Cluster:
    """The InferenceServices of one namespace, through the API server (connected on first use)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._kube: Kube | None = None

    def get(self, name: str) -> dict[str, Any]:
        from folio.operator.spec import API_VERSION, KIND

        found = self._call(lambda kube: kube.get(API_VERSION, KIND, self.namespace, name), f"InferenceService {name!r}")
        if found is None:
            raise ClusterError(f"InferenceService {name!r} not found in namespace {self.namespace!r}")
        return found

    def list(self) -> list[dict[str, Any]]:
        from folio.operator.spec import API_VERSION, KIND

        return self._call(lambda kube: kube.list(API_VERSION, KIND, self.namespace, {}), "the InferenceService resource")

    def request_override(self, name: str, override: str, adapter: str | None = None) -> None:
        """Set ``folio.dev/<override>`` (the value records when it was asked), or for ``adapter``'s rollout
        ``folio.dev/<override>-adapter`` (the value names it)."""
        from folio.operator.k8s.names import override_annotation
        from folio.operator.spec import API_VERSION, KIND, now_iso

        key = override_annotation(f"{override}@{adapter}" if adapter else override)
        value = adapter or now_iso(datetime.now(timezone.utc))
        patch = {"metadata": {"annotations": {key: value}}}
        self._call(lambda kube: kube.merge_patch(API_VERSION, KIND, self.namespace, name, patch),
                   f"InferenceService {name!r}")

    def router_usage(self, name: str) -> list[dict[str, Any]]:
        """Each running router's tenant usage (`folio.operator.router.usage`), through the API server's proxy to
        its pod: every router sees its own share of the requests."""
        from folio.operator.k8s.names import ROUTER_PORT, selector
        from folio.operator.router.app import TENANTS_PATH

        pods = self._call(lambda kube: kube.list("v1", "Pod", self.namespace, selector(name, "router")),
                          f"the routers of {name!r}")  # fmt: skip
        running = [p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        where = f"/api/v1/namespaces/{self.namespace}/pods/{{}}:{ROUTER_PORT}/proxy{TENANTS_PATH}"
        return [self._call(lambda kube, pod=pod: kube.call("GET", where.format(pod)), f"router pod {pod!r}")["tenants"]
                for pod in running]  # fmt: skip

    def _call(self, fn: Any, what: str) -> Any:
        from folio.operator.k8s.client import ApiError, Kube

        if self._kube is None:
            import kubernetes

            try:
                self._kube = Kube.from_environment()
            except (kubernetes.config.ConfigException, OSError) as exc:
                raise ClusterError(f"no running `folio up` here and no Kubernetes cluster configured ({exc})") from None
        try:
            return fn(self._kube)
        except ApiError as exc:
            if exc.status == 0:
                raise ClusterError(f"cannot reach the API server: {exc.message}") from None
            if exc.status == 404:
                raise ClusterError(f"{what} not found in namespace {self.namespace!r}") from None
            raise ClusterError(f"the API server answered {exc.status} {exc.reason}") from None


@dataclass
class Target:
    """Where a command goes: a local `folio up` (client set) or the cluster."""

    client: LocalClient | None = None
    cluster: Cluster | None = None


def resolve_target(args: argparse.Namespace) -> Target:
    """The local `folio up` in --state-dir unless --kubernetes; the cluster when none runs here."""
    from folio.operator.local.client import LocalClient

    if not args.kubernetes:
        client = LocalClient.find(args.state_dir)
        if client is not None:
            return Target(client=client)
    from folio.operator.k8s.names import current_namespace

    return Target(cluster=Cluster(args.namespace or current_namespace()))
