"""The in-cluster config source: the InferenceService's status and its revisions' EndpointSlices.

Two list-then-watch loops over the Kubernetes API (`folio.operator.k8s.client.AsyncKube`, on the
router's own event loop): one for the InferenceService, one for the EndpointSlices of the
namespace, kept when labelled `kubernetes.io/service-name={isvc}-{rev}`. Every change rebuilds the
whole `RouterConfig` with the planner's own `folio.operator.serving.router.router_config`, from the
typed status and the routing parts of the spec (`RoutedSpec.from_wire`: this watch is a boundary that
parses, and it parses only what routing needs), as `folio up` does for its own router.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from folio.operator.k8s.client import AsyncKube, path
from folio.operator.k8s.names import (
    ENGINE_PORT,
    OVERFLOW_KEY_FILE,
    SERVICE_NAME_LABEL,
    revision_of_service,
    router_name,
)
from folio.operator.router.secrets import Deliver, decode_secret
from folio.operator.router.sources import Apply
from folio.operator.serving.router import RoutedSpec, RouterConfig, routable, router_config
from folio.operator.spec import API_VERSION, KIND, InferenceServiceStatus

log = logging.getLogger(__name__)

# The kubelet refreshes a mounted Secret within about a minute; re-read the file as often.
SECRET_TTL_S = 60.0

Object = dict[str, Any]


class KubernetesSource:
    def __init__(
        self, isvc: str, namespace: str, api: AsyncKube | None = None, *, retry_max_s: float = 30.0,
        overflow_key_file: Path = OVERFLOW_KEY_FILE,
    ) -> None:
        self.isvc = isvc
        self.namespace = namespace
        self._api = api
        self._retry_max_s = retry_max_s
        self._service: Object | None = None
        self._spec: RoutedSpec | None = None  # the routing parts of the spec
        self._spec_problems: list[str] = []
        self._slices: dict[str, Object] = {}
        # The overflow API key's Secret is mounted into the router's pod (the operator names it in the
        # Deployment): the router reads no Secret through the API but spec.access's one (`follow`).
        self._overflow_key_file = overflow_key_file
        self._overflow_key: tuple[tuple[str, str] | None, str | None, float] = (None, None, 0.0)
        self._connected = asyncio.Event()  # `run` has opened the API session `follow` shares

    async def run(self, apply: Apply) -> None:
        api = self._api = self._api or AsyncKube.from_environment()
        ns = self.namespace
        publishing = asyncio.Lock()  # one at a time, so an older snapshot never lands after a newer one

        async def publish() -> None:
            async with publishing:
                try:
                    apply(await self.config())
                except ValueError as exc:  # (ConfigError, or a status no router can follow)
                    log.error("InferenceService %s/%s: %s (keeping the last good config)", ns, self.isvc, exc)

        async def on_isvcs(items: list[Object]) -> None:
            self._service = next((o for o in items if _name(o) == self.isvc), None)
            await publish()

        async def on_isvc(kind: str, obj: Object) -> None:
            if _name(obj) == self.isvc:
                self._service = None if kind == "DELETED" else obj
                await publish()

        async def on_slices(items: list[Object]) -> None:
            self._slices = {_name(o): o for o in items}
            await publish()

        async def on_slice(kind: str, obj: Object) -> None:
            if kind == "DELETED":
                self._slices.pop(_name(obj), None)
            else:
                self._slices[_name(obj)] = obj
            await publish()

        async with api:
            self._connected.set()
            await asyncio.gather(
                api.follow(path(API_VERSION, KIND, ns), {"fieldSelector": f"metadata.name={self.isvc}"},
                           on_isvcs, on_isvc, retry_max_s=self._retry_max_s),
                api.follow(path("discovery.k8s.io/v1", "EndpointSlice", ns), {"labelSelector": SERVICE_NAME_LABEL},
                           on_slices, on_slice, retry_max_s=self._retry_max_s),
            )

    async def follow(self, name: str, deliver: Deliver) -> None:
        """The API keys' Secret ``name`` (`folio.operator.router.secrets.SecretReader`), watched through the
        API: the router's Role may get, list and watch that Secret alone."""
        await self._connected.wait()
        assert self._api is not None

        async def on_list(items: list[Object]) -> None:
            deliver(decode_secret(items[0]) if items else None)

        async def on_event(kind: str, obj: Object) -> None:
            deliver(None if kind == "DELETED" else decode_secret(obj))

        await self._api.follow(path("v1", "Secret", self.namespace), {"fieldSelector": f"metadata.name={name}"},
                               on_list, on_event, retry_max_s=self._retry_max_s)  # fmt: skip

    # ------------------------------------------------------------------------------ config

    async def config(self) -> RouterConfig:
        """The router config the current objects describe."""
        svc = self._service or {}
        status = InferenceServiceStatus.model_validate(svc.get("status") or {})
        if self._service is None:
            self._spec = None
        elif isinstance(svc.get("spec"), dict):
            self._spec, problems = RoutedSpec.from_wire(svc["spec"])
            if problems != self._spec_problems:  # the operator reports them in status; say so once here
                for problem in problems:
                    log.error("InferenceService %s/%s: %s; routing without it", self.namespace, self.isvc, problem)
                self._spec_problems = problems
        wanted = set(routable(status))
        endpoints: dict[str, list[str]] = {}
        routers = 0  # the ready routers of the service (its own Service's endpoints): they share each quota
        for name in sorted(self._slices):
            obj = self._slices[name]
            service = ((obj.get("metadata") or {}).get("labels") or {}).get(SERVICE_NAME_LABEL, "")
            if service == router_name(self.isvc):
                routers += len(slice_urls(obj))
            revision = revision_of_service(self.isvc, service)
            if revision in wanted:
                endpoints.setdefault(revision, []).extend(slice_urls(obj))
        overflow = self._spec.overflow if self._spec is not None else None
        key = await self._secret(overflow.api_key_secret_ref) if overflow is not None else None
        return router_config(self._spec, status, endpoints, overflow_api_key=key, routers=max(1, routers))

    async def _secret(self, ref: Any) -> str | None:
        if ref is None:
            return None
        key = (ref.name, ref.key)
        cached_ref, cached, at = self._overflow_key
        if cached_ref == key and time.monotonic() - at < SECRET_TTL_S:
            return cached
        value: str | None = None
        try:
            value = self._overflow_key_file.read_text().strip() or None
            if value is None:
                log.error("the overflow API key from Secret %s/%s (key %r) is empty", self.namespace, ref.name, ref.key)
        except (OSError, UnicodeDecodeError) as exc:  # a missing Secret or key leaves the optional volume empty
            log.error("cannot read the overflow API key from Secret %s/%s (key %r, mounted at %s): %s",
                      self.namespace, ref.name, ref.key, self._overflow_key_file, exc)
        self._overflow_key = (key, value, time.monotonic())
        return value


def _name(obj: Object) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def slice_urls(obj: Object) -> list[str]:
    """Base URLs of the ready endpoints in one EndpointSlice."""
    ports = obj.get("ports") or []
    port = next((p.get("port") for p in ports if p.get("name") == "http"), None)
    if port is None:
        port = ports[0].get("port", ENGINE_PORT) if ports else ENGINE_PORT
    urls = []
    for endpoint in obj.get("endpoints") or []:
        if (endpoint.get("conditions") or {}).get("ready") is False:  # unset means ready
            continue
        for address in (endpoint.get("addresses") or [])[:1]:  # one pod, one address
            host = f"[{address}]" if ":" in address else address
            urls.append(f"http://{host}:{port}")
    return urls
