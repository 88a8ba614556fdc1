"""The in-cluster config source: the InferenceService's status and its revisions' EndpointSlices.

Two list-then-watch loops over the Kubernetes API (aiohttp, the same client the proxy uses; the
official `kubernetes` package only loads the credentials): one for the InferenceService, one for
the EndpointSlices of the namespace, kept when labelled `kubernetes.io/service-name={isvc}-{rev}`
for a revision the status mentions. Every change rebuilds the whole `RouterConfig`.

A watch that ends (server timeout, network, 410 Gone) is simply listed and watched again: the
objects are few, so relisting is cheaper than being clever with resource versions.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from folio.operator.router.config import ConfigError, RouterConfig
from folio.operator.router.sources import Apply
from folio.operator.spec import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
ENGINE_PORT = 8000  # when a slice names no port
WATCH_TIMEOUT_S = 300
SECRET_TTL_S = 60.0  # a rotated overflow key is picked up within this long

Object = dict[str, Any]


def in_cluster_namespace() -> str | None:
    try:
        return (SERVICE_ACCOUNT / "namespace").read_text().strip() or None
    except OSError:
        return None


@dataclass
class KubeApi:
    """Where the API server is and how to authenticate: enough for GETs and watches."""

    base_url: str
    ssl: ssl.SSLContext | bool = True
    auth_headers: Callable[[], dict[str, str]] = field(default=dict)

    @classmethod
    def from_environment(cls) -> KubeApi:
        """The pod's service account in a cluster, else the current kubeconfig context."""
        from kubernetes import client, config

        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
        context: ssl.SSLContext | bool = False
        if cfg.verify_ssl:
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, cfg.key_file)

        def auth_headers() -> dict[str, str]:
            # Asked per request: the in-cluster loader's refresh hook re-reads the rotating token.
            return {
                a["key"]: a["value"]
                for a in cfg.auth_settings().values()
                if a.get("in") == "header" and a.get("value")
            }

        return cls(cfg.host.rstrip("/"), context, auth_headers)

    def headers(self) -> dict[str, str]:
        return self.auth_headers()


class KubernetesSource:
    def __init__(
        self, isvc: str, namespace: str, api: KubeApi | None = None, *, retry_max_s: float = 30.0
    ) -> None:
        self.isvc = isvc
        self.namespace = namespace
        self._api = api
        self._retry_max_s = retry_max_s
        self._service: Object | None = None
        self._slices: dict[str, Object] = {}
        self._overflow_key: tuple[tuple[str, str] | None, str | None, float] = (None, None, 0.0)
        self._session: aiohttp.ClientSession | None = None

    async def run(self, apply: Apply) -> None:
        api = self._api = self._api or KubeApi.from_environment()
        ns = self.namespace
        isvc_path = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{PLURAL}"
        slices_path = f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"

        publishing = asyncio.Lock()  # one at a time, so an older snapshot never lands after a newer one

        async def publish() -> None:
            async with publishing:
                try:
                    apply(await self.config())
                except ConfigError as exc:
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

        connector = aiohttp.TCPConnector(ssl=api.ssl)
        async with aiohttp.ClientSession(connector=connector) as session:
            self._session = session
            try:
                await asyncio.gather(
                    self._watch(
                        isvc_path, {"fieldSelector": f"metadata.name={self.isvc}"}, on_isvcs, on_isvc
                    ),
                    self._watch(slices_path, {"labelSelector": SERVICE_NAME_LABEL}, on_slices, on_slice),
                )
            finally:
                self._session = None

    # ------------------------------------------------------------------------------ config

    async def config(self) -> RouterConfig:
        """The router config the current objects describe."""
        svc = self._service or {}
        spec, status = svc.get("spec") or {}, svc.get("status") or {}
        traffic = status.get("traffic") or []
        stable, canary = status.get("stableRevision"), status.get("canaryRevision")
        revisions = {t.get("revision") for t in traffic} | {stable, canary}
        revisions.discard(None)
        endpoints: dict[str, list[str]] = {rev: [] for rev in sorted(revisions)}
        prefix = f"{self.isvc}-"
        for name in sorted(self._slices):
            obj = self._slices[name]
            service = ((obj.get("metadata") or {}).get("labels") or {}).get(SERVICE_NAME_LABEL, "")
            revision = service[len(prefix) :] if service.startswith(prefix) else None
            if revision in endpoints:
                endpoints[revision].extend(slice_urls(obj))
        data: dict[str, Any] = {
            "traffic": traffic,
            "endpoints": endpoints,
            "stable": stable,
            "canary": canary,
        }
        if spec.get("shadow"):
            data["shadow"] = spec["shadow"]
        if (overflow := spec.get("overflow")) and overflow.get("url"):
            data["overflow"] = {
                "url": overflow["url"],
                "apiKey": await self._secret(overflow.get("apiKeySecretRef")),
            }
        return RouterConfig.parse(data)

    async def _secret(self, ref: Object | None) -> str | None:
        if not ref or not ref.get("name"):
            return None
        key = (ref["name"], ref.get("key") or "token")
        cached_ref, cached, at = self._overflow_key
        if cached_ref == key and time.monotonic() - at < SECRET_TTL_S:
            return cached
        value: str | None = None
        try:
            secret = await self._get(f"/api/v1/namespaces/{self.namespace}/secrets/{key[0]}")
            raw = (secret.get("data") or {}).get(key[1])
            if raw is None:
                log.error(
                    "Secret %s/%s has no key %r for the overflow API key", self.namespace, key[0], key[1]
                )
            else:
                value = base64.b64decode(raw).decode().strip()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            log.error("cannot read the overflow API key from Secret %s/%s: %s", self.namespace, key[0], exc)
        self._overflow_key = (key, value, time.monotonic())
        return value

    # ------------------------------------------------------------------------------- watching

    async def _get(self, path: str, params: dict[str, str] | None = None) -> Object:
        assert self._session is not None and self._api is not None
        timeout = aiohttp.ClientTimeout(total=30)
        url = self._api.base_url + path  # the API may sit under a path prefix behind a proxy
        async with self._session.get(
            url, params=params, headers=self._api.headers(), timeout=timeout
        ) as resp:
            if resp.status != 200:
                raise aiohttp.ClientResponseError(
                    resp.request_info, (), status=resp.status, message=(await resp.text())[:500]
                )
            return await resp.json(content_type=None)

    async def _watch(
        self,
        path: str,
        params: dict[str, str],
        on_list: Callable[[list[Object]], Awaitable[None]],
        on_event: Callable[[str, Object], Awaitable[None]],
    ) -> None:
        assert self._session is not None and self._api is not None
        delay = 0.5
        while True:
            try:
                listing = await self._get(path, params)
                await on_list(listing.get("items") or [])
                version = (listing.get("metadata") or {}).get("resourceVersion", "")
                watch = {
                    **params,
                    "watch": "true",
                    "resourceVersion": version,
                    "timeoutSeconds": str(WATCH_TIMEOUT_S),
                }
                timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=WATCH_TIMEOUT_S + 30)
                url = self._api.base_url + path
                async with self._session.get(
                    url, params=watch, headers=self._api.headers(), timeout=timeout
                ) as resp:
                    if resp.status != 200:
                        raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
                    delay = 0.5
                    async for event in _json_lines(resp.content):
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":  # typically 410 Gone: our version is too old, list again
                            log.info("watch %s ended: %s", path, obj.get("message", obj))
                            break
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            await on_event(kind, obj)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                log.warning("watching %s failed (%s); retrying in %.1f s", path, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max_s)


async def _json_lines(stream: aiohttp.StreamReader) -> AsyncIterator[Object]:
    """Newline-delimited JSON of any line length (a big object can exceed readline's limit)."""
    buffer = b""
    async for chunk in stream.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)


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
