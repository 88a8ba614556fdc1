"""Required peering, checked at start: a replica whose peering object is missing says so.

With `--peering NAME` each replica starts paused and resumes only once the peering object shows no live
peer above it. Where that object (or kopf's peering CRD) is missing, kopf never resumes and logs nothing
above DEBUG: the operator would look alive and do nothing. `check` is a kopf startup activity that reads
the object once and logs an error naming what to create.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from folio.operator.k8s.client import ApiError, Kube

GROUP_VERSION = "kopf.dev/v1"


def where(name: str, namespace: str | None) -> str:
    """The peering object's path: a ClusterKopfPeering cluster-wide, else a KopfPeering in ``namespace``."""
    if namespace is None:
        return f"/apis/{GROUP_VERSION}/clusterkopfpeerings/{name}"
    return f"/apis/{GROUP_VERSION}/namespaces/{namespace}/kopfpeerings/{name}"


def missing(kube: Kube, name: str, namespaces: Sequence[str | None]) -> list[str]:
    """The paths of the peering objects that are not there (a 404: the object or its CRD is missing)."""
    out = []
    for namespace in namespaces:
        try:
            kube.call("GET", where(name, namespace))
        except ApiError as exc:
            if exc.status != 404:
                raise
            out.append(where(name, namespace))
    return out


def check(kube: Kube, name: str, namespaces: Sequence[str | None]) -> Callable[..., Awaitable[None]]:
    """A kopf startup activity: an error in the log for every peering object this replica waits on in vain.
    (``namespaces``: ``[None]`` cluster-wide.)"""

    async def check_peering(logger: logging.Logger, **_: Any) -> None:
        try:
            gone = await asyncio.to_thread(missing, kube, name, namespaces)
        except Exception as exc:  # not a reason to stop (a startup activity that fails is retried)
            logger.warning("could not read the peering object %r: %s", name, exc)
            return
        for path in gone:
            logger.error("peering object %s not found (or kopf's peering CRDs are not installed): this replica "
                         "stays paused until it exists. The chart creates both (charts/folio/crds/, "
                         "templates/peering.yaml); `--peering ''` runs one replica standalone", path)

    return check_peering
