"""The one Kubernetes client: credentials, REST by (apiVersion, kind), and list-then-watch.

Folio handles a fixed set of kinds as plain dicts (the planner's output), so it talks to the API by
path rather than through one typed client per kind. Credentials, TLS and token refresh come from
`kubernetes.config` (the pod's service account, else the kubeconfig), read by `load_configuration`
for both faces of the client:

- `Kube`: synchronous verbs (get, list, create, server-side apply, merge patch, delete) for the
  operator and the command line; async callers run them with `asyncio.to_thread`.
- `AsyncKube`: reads and list-then-watch loops over aiohttp, for the router, which serves on the
  same event loop and must never block it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
import kubernetes
import urllib3

from folio.operator.k8s.names import PLURALS, has_labels

log = logging.getLogger(__name__)

Obj = dict[str, Any]

FIELD_MANAGER = "folio"
TIMEOUT_S = 30.0
WATCH_TIMEOUT_S = 300


class ApiError(Exception):
    """A non-2xx answer from the API server (status 0: it could not be reached)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def load_configuration() -> kubernetes.client.Configuration:
    """In a pod: its service account; elsewhere: the current kubeconfig context.

    Raises `kubernetes.config.ConfigException` (or OSError) when neither is there.
    """
    cfg = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    except kubernetes.config.ConfigException:
        # $KUBECONFIG is read now, not when the client library was imported.
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None, client_configuration=cfg)
    return cfg


def path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    plural = PLURALS[(api_version, kind)]
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    collection = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{collection}/{name}" if name else collection


def label_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


# ------------------------------------------------------------------------------ sync


class Kube:
    """Namespaced CRUD and server-side apply by (apiVersion, kind)."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.client = client

    @classmethod
    def from_environment(cls) -> Kube:
        return cls(kubernetes.client.ApiClient(load_configuration()))

    @classmethod
    def for_url(cls, url: str) -> Kube:
        """An unauthenticated client for a local API (tests, `kubectl proxy`)."""
        return cls(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url.rstrip("/"))))

    path = staticmethod(path)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            return self.call("GET", path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def serves(self, api_version: str, kind: str) -> bool:
        """Whether the API server serves `kind` (for a custom resource: whether its CRD is installed), from
        the discovery document of its group version."""
        where = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        try:
            found = self.call("GET", where)
        except ApiError as exc:
            if exc.status == 404:  # the group version itself is not served
                return False
            raise
        plural = PLURALS[(api_version, kind)]
        return any(r.get("name") == plural for r in found.get("resources") or [])

    def list(self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]) -> list[Obj]:
        found = self.call("GET", path(api_version, kind, namespace), {"labelSelector": label_selector(labels)})
        # Filter here as well: a conforming server already has, and it costs nothing.
        return [o for o in found.get("items", []) if has_labels(o, dict(labels))]

    def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return self.call("POST", path(obj["apiVersion"], obj["kind"], meta["namespace"]), body=obj)

    def apply(self, obj: Obj, *, force: bool = True) -> Obj:
        """Server-side apply as field manager `folio`: the object becomes exactly what we own of it."""
        meta = obj["metadata"]
        where = path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = {"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"}
        return self.call("PATCH", where, query, body=obj, content_type="application/apply-patch+yaml")

    def merge_patch(self, api_version: str, kind: str, namespace: str, name: str, patch: Obj,
                    subresource: str | None = None) -> Obj:
        where = path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return self.call("PATCH", where, body=patch, content_type="application/merge-patch+json")

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete with background propagation (a Job's pods go with it); False if it was already gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            self.call("DELETE", path(api_version, kind, namespace, name), body=body)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def call(self, method: str, where: str, query: Mapping[str, str] | None = None, *,
             body: Obj | None = None, content_type: str = "application/json") -> Obj:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, _, _ = self.client.param_serialize(
            method, where, header_params=headers, auth_settings=["BearerToken"]
        )
        if query:
            url += "?" + urlencode(query)
        try:  # the body goes out as JSON, which is also the YAML that server-side apply reads
            response = self.client.call_api(method, url, header_params=headers, body=body,
                                            _request_timeout=TIMEOUT_S)
            raw = response.read()
        except kubernetes.client.ApiException as exc:  # TLS and other transport failures
            raise ApiError(exc.status or 0, "TransportError", str(exc.reason)) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, "TransportError", str(exc)) from exc
        payload: Obj = json.loads(raw) if raw else {}
        if not 200 <= response.status < 300:
            raise ApiError(response.status, str(payload.get("reason", "")), str(payload.get("message", raw[:200])))
        return payload


# ----------------------------------------------------------------------------- async

OnList = Callable[[list[Obj]], Awaitable[None]]
OnEvent = Callable[[str, Obj], Awaitable[None]]


@dataclass
class AsyncKube:
    """Where the API server is and how to authenticate, for GETs and watches over aiohttp.

    Use as ``async with kube:`` (one connection pool for every call made inside).
    """

    base_url: str
    ssl: ssl.SSLContext | bool = True
    auth_headers: Callable[[], dict[str, str]] = field(default=dict)
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_environment(cls) -> AsyncKube:
        cfg = load_configuration()
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

    async def __aenter__(self) -> AsyncKube:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, where: str, params: Mapping[str, str] | None = None) -> Obj:
        """One GET; a non-200 answer raises `aiohttp.ClientResponseError`."""
        assert self._session is not None, "use `async with AsyncKube(...)`"
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        url = self.base_url + where  # the API may sit under a path prefix behind a proxy
        async with self._session.get(url, params=params, headers=self.auth_headers(), timeout=timeout) as resp:
            if resp.status != 200:
                raise aiohttp.ClientResponseError(
                    resp.request_info, (), status=resp.status, message=(await resp.text())[:500]
                )
            return await resp.json(content_type=None)

    async def merge_patch(self, where: str, patch: Obj) -> Obj:
        """One JSON merge patch; a non-200 answer raises `aiohttp.ClientResponseError`."""
        assert self._session is not None, "use `async with AsyncKube(...)`"
        headers = {**self.auth_headers(), "Content-Type": "application/merge-patch+json"}
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with self._session.patch(self.base_url + where, json=patch, headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                raise aiohttp.ClientResponseError(
                    resp.request_info, (), status=resp.status, message=(await resp.text())[:500]
                )
            return await resp.json(content_type=None)

    async def follow(self, where: str, params: Mapping[str, str], on_list: OnList, on_event: OnEvent, *,
                     retry_max_s: float = 30.0) -> None:
        """List, then watch from that list's version, forever; every failure lists and watches again.

        A watch that ends (server timeout, network, 410 Gone) is simply started over: the objects
        are few, so relisting is cheaper than being clever with resource versions.
        """
        assert self._session is not None, "use `async with AsyncKube(...)`"
        delay = 0.5
        while True:
            try:
                listing = await self.get(where, params)
                await on_list(listing.get("items") or [])
                watch = {
                    **params,
                    "watch": "true",
                    "resourceVersion": (listing.get("metadata") or {}).get("resourceVersion", ""),
                    "timeoutSeconds": str(WATCH_TIMEOUT_S),
                }
                timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=WATCH_TIMEOUT_S + 30)
                async with self._session.get(
                    self.base_url + where, params=watch, headers=self.auth_headers(), timeout=timeout
                ) as resp:
                    if resp.status != 200:
                        raise aiohttp.ClientResponseError(resp.request_info, (), status=resp.status)
                    delay = 0.5
                    async for event in _json_lines(resp.content):
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":  # typically 410 Gone: our version is too old, list again
                            log.info("watch %s ended: %s", where, obj.get("message", obj))
                            break
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            await on_event(kind, obj)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                log.warning("watching %s failed (%s); retrying in %.1f s", where, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, retry_max_s)


async def _json_lines(stream: aiohttp.StreamReader) -> AsyncIterator[Obj]:
    """Newline-delimited JSON of any line length (a big object can exceed readline's limit)."""
    buffer = b""
    async for chunk in stream.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
