"""A small generic Kubernetes REST layer over the official client's connection handling.

The operator handles a fixed set of kinds as plain dicts (the planner's output), so it talks to
the API by path rather than through one typed client per kind. Authentication, TLS and token
refresh come from `kubernetes.config` (in-cluster service account or kubeconfig). Calls are
synchronous; async callers run them with `asyncio.to_thread`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import kubernetes
import urllib3

from folio.operator.spec import API_VERSION, PLURAL

Obj = dict[str, Any]

# (apiVersion, kind) -> plural, for every kind the operator reads or writes.
PLURALS: dict[tuple[str, str], str] = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("batch/v1", "Job"): "jobs",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    (API_VERSION, "InferenceService"): PLURAL,
}

FIELD_MANAGER = "folio"
TIMEOUT_S = 30.0


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class Kube:
    """Namespaced CRUD and server-side apply by (apiVersion, kind)."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self.client = client

    @classmethod
    def from_environment(cls) -> Kube:
        """In a pod: its service account; elsewhere: the current kubeconfig context."""
        try:
            kubernetes.config.load_incluster_config()
        except kubernetes.config.ConfigException:
            # KUBECONFIG is read now, not when the client library was imported.
            kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        return cls(kubernetes.client.ApiClient())

    @classmethod
    def for_url(cls, url: str) -> Kube:
        """An unauthenticated client for a local API (tests, `kubectl proxy`)."""
        config = kubernetes.client.Configuration(host=url.rstrip("/"))
        return cls(kubernetes.client.ApiClient(config))

    # ----------------------------------------------------------------- paths

    @staticmethod
    def path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
        plural = PLURALS[(api_version, kind)]
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        path = f"{prefix}/namespaces/{namespace}/{plural}"
        return f"{path}/{name}" if name else path

    # ------------------------------------------------------------------ verbs

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            return self._call("GET", self.path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]) -> list[Obj]:
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        found = self._call("GET", self.path(api_version, kind, namespace), {"labelSelector": selector})
        items = found.get("items", []) if found else []
        # Filter here as well: a conforming server already has, and it costs nothing.
        return [o for o in items if all(o.get("metadata", {}).get("labels", {}).get(k) == v for k, v in labels.items())]

    def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return self._call("POST", self.path(obj["apiVersion"], obj["kind"], meta["namespace"]), body=obj)

    def apply(self, obj: Obj, *, force: bool = True) -> Obj:
        """Server-side apply as field manager `folio`: the object becomes exactly what we own of it."""
        meta = obj["metadata"]
        path = self.path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = {"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"}
        return self._call("PATCH", path, query, body=obj, content_type="application/apply-patch+yaml")

    def merge_patch(self, api_version: str, kind: str, namespace: str, name: str, patch: Obj,
                    subresource: str | None = None) -> Obj:
        path = self.path(api_version, kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return self._call("PATCH", path, body=patch, content_type="application/merge-patch+json")

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete with background propagation (a Job's pods go with it); False if it was already gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            self._call("DELETE", self.path(api_version, kind, namespace, name), body=body)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # --------------------------------------------------------------- plumbing

    def _call(self, method: str, path: str, query: Mapping[str, str] | None = None, *,
              body: Obj | None = None, content_type: str = "application/json") -> Obj:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, _, _ = self.client.param_serialize(
            method, path, header_params=headers, auth_settings=["BearerToken"]
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
