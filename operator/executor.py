"""Make the cluster match a plan: server-side apply what it has, delete what it no longer has.

Applying is idempotent and keyed by name, so running it twice, or after a restart in the middle,
never duplicates anything. Transient conflicts (another writer, a create racing a create) are
retried at once a few times; anything else is raised for the handler to back off and retry.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from folio.operator.kube import ApiError, Kube, Obj
from folio.operator.planner import base_labels

log = logging.getLogger(__name__)

# Every kind the planner produces; pruning looks at exactly these.
MANAGED_KINDS: tuple[tuple[str, str], ...] = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("v1", "PersistentVolumeClaim"),
    ("batch/v1", "Job"),
    ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
)
# Kinds whose spec cannot change after creation: a changed one is replaced instead.
IMMUTABLE_KINDS = frozenset({"Job"})
ATTEMPTS = 3

Key = tuple[str, str, str]  # apiVersion, kind, name


def key(obj: Obj) -> Key:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


@dataclass
class ApplyResult:
    created: list[Key] = field(default_factory=list)
    applied: list[Key] = field(default_factory=list)  # existed, and differed from the plan
    deleted: list[Key] = field(default_factory=list)


def apply_plan(kube: Kube, namespace: str, isvc: str, objects: Iterable[Obj]) -> ApplyResult:
    """Apply what differs from the cluster, then delete this InferenceService's objects the plan dropped.

    An object whose live state already holds every field we set is left alone: in the steady
    state a pass only reads. (Server-side defaults only add fields; a value the server rewrites,
    such as a normalized quantity, merely costs an idempotent apply.)
    """
    result = ApplyResult()
    wanted = list(objects)
    live = existing(kube, namespace, isvc)
    for obj in wanted:
        current = live.get(key(obj))
        if current is not None and contains(current, obj):
            continue
        apply_one(kube, obj)
        # Apply creates on a real API server, so "created" means: not there before this pass.
        (result.applied if current is not None else result.created).append(key(obj))
    keep = {key(o) for o in wanted}
    for (api_version, kind, name), found in live.items():
        if (api_version, kind, name) in keep or found["metadata"].get("deletionTimestamp"):
            continue
        if kube.delete(api_version, kind, namespace, name):
            result.deleted.append((api_version, kind, name))
    return result


def existing(kube: Kube, namespace: str, isvc: str) -> dict[Key, Obj]:
    """Every object of the managed kinds carrying this InferenceService's labels."""
    labels = base_labels(isvc)
    return {
        (api_version, kind, found["metadata"]["name"]): found
        for api_version, kind in MANAGED_KINDS
        for found in kube.list(api_version, kind, namespace, labels)
    }


def contains(live: object, desired: object) -> bool:
    """Whether `live` has every field of `desired` with the same value (lists: same length, item-wise)."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(live) == len(desired)
                and all(contains(a, b) for a, b in zip(live, desired, strict=True)))
    return live == desired


def apply_one(kube: Kube, obj: Obj) -> bool:
    """Server-side apply one object; True when it had to be created."""
    last: ApiError | None = None
    for _ in range(ATTEMPTS):
        try:
            kube.apply(obj)
            return False
        except ApiError as exc:
            last = exc
            if exc.status == 404:
                # A real API server creates on apply; a server without apply-create (and the test
                # emulator) answers 404, so create it explicitly.
                try:
                    kube.create(obj)
                    return True
                except ApiError as create_exc:
                    last = create_exc
                    if create_exc.status != 409:  # 409: someone created it meanwhile, so apply again
                        raise
            elif exc.status == 422 and obj["kind"] in IMMUTABLE_KINDS:
                meta = obj["metadata"]
                log.info("replacing %s %s: its spec is immutable", obj["kind"], meta["name"])
                kube.delete(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
            elif exc.status != 409:
                raise
    assert last is not None
    raise last


def delete_all(kube: Kube, namespace: str, isvc: str) -> list[Key]:
    """Delete every object of the InferenceService (its deletion; owner references would, eventually)."""
    deleted = []
    for (api_version, kind, name), found in existing(kube, namespace, isvc).items():
        if not found["metadata"].get("deletionTimestamp") and kube.delete(api_version, kind, namespace, name):
            deleted.append((api_version, kind, name))
    return deleted
