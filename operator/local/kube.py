"""The cluster side of `folio status|promote|abort|retry`: the InferenceService through the API server.

Manual overrides are annotations (`folio.dev/promote|abort|retry`); the operator acts on them and
clears them, exactly as the rollout state machine's ``overrides`` input expects.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from folio.operator.spec import DOMAIN, GROUP, PLURAL, VERSION


class ClusterError(RuntimeError):
    """No usable cluster, or the API server refused; the message says why."""


def _api() -> Any:
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        config.load_incluster_config()
    except ConfigException:
        try:
            config.load_kube_config(config_file=_kubeconfig())
        except (ConfigException, OSError) as exc:
            raise ClusterError(
                f"no running `folio up` here and no Kubernetes cluster configured ({exc})"
            ) from None
    return client.CustomObjectsApi()


def _kubeconfig() -> str | None:
    # read at call time: the client reads $KUBECONFIG once, when it is imported
    return os.environ.get("KUBECONFIG") or None


def current_namespace() -> str:
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    in_pod = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if in_pod.exists():
        return in_pod.read_text().strip() or "default"
    try:
        _, active = config.list_kube_config_contexts(config_file=_kubeconfig())
    except (ConfigException, OSError):
        return "default"
    return str((active or {}).get("context", {}).get("namespace") or "default")


def _call(fn: Any, **kwargs: Any) -> Any:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return fn(group=GROUP, version=VERSION, plural=PLURAL, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            what = (
                f"InferenceService {kwargs['name']!r}"
                if "name" in kwargs
                else "the InferenceService resource"
            )
            raise ClusterError(f"{what} not found in namespace {kwargs['namespace']!r}") from None
        raise ClusterError(f"the API server answered {exc.status} {exc.reason}") from None
    except HTTPError as exc:
        raise ClusterError(f"cannot reach the API server: {exc}") from None


def get(name: str, namespace: str) -> dict[str, Any]:
    api = _api()
    return _call(api.get_namespaced_custom_object, namespace=namespace, name=name)


def list_all(namespace: str) -> list[dict[str, Any]]:
    api = _api()
    body = _call(api.list_namespaced_custom_object, namespace=namespace)
    return list(body.get("items", []))


def request_override(name: str, namespace: str, override: str) -> None:
    """Set ``folio.dev/<override>`` (the value records when it was asked)."""
    api = _api()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch = {"metadata": {"annotations": {f"{DOMAIN}/{override}": stamp}}}
    _call(
        api.patch_namespaced_custom_object,
        namespace=namespace,
        name=name,
        body=patch,
        _content_type="application/merge-patch+json",
    )
