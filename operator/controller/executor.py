"""Make the cluster match a plan: server-side apply what it has, delete what it no longer has.

What the cluster holds comes from the operator's indexes (`children`), so a pass in the steady state
makes no API call at all: an object whose live state already holds every field we set is left
alone. Applying is idempotent and keyed by name, so running it twice, or after a restart in the
middle, never duplicates anything. Transient conflicts (another writer, a create racing a create)
are retried at once a few times; anything else is raised for the handler to back off and retry.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from folio.operator.controller.children import Children, Expectations, Key, Obj, contains, key
from folio.operator.k8s.client import ApiError, Kube

log = logging.getLogger(__name__)

# Kinds whose spec cannot change after creation: a changed one is replaced instead.
# (A RoleBinding's roleRef: one made by an older operator pointed at a Role of its own.)
IMMUTABLE_KINDS = frozenset({"Job", "RoleBinding"})
ATTEMPTS = 3


@dataclass
class ApplyResult:
    created: list[Key] = field(default_factory=list)
    applied: list[Key] = field(default_factory=list)  # existed, and differed from the plan
    deleted: list[Key] = field(default_factory=list)


def apply_plan(kube: Kube, objects: Iterable[Obj], live: Children, expect: Expectations) -> ApplyResult:
    """Apply what differs from ``live``, then delete the children the plan dropped.

    (Server-side defaults only add fields; a value the server rewrites, such as a normalized
    quantity, merely costs an idempotent apply.)
    """
    result = ApplyResult()
    wanted = list(objects)
    for obj in wanted:
        current = live.objects.get(key(obj))
        if (current is not None and contains(current, obj)) or expect.awaits(obj):
            continue
        apply_one(kube, obj)
        expect.did_apply(obj)
        # Apply creates on a real API server, so "created" means: not there before this pass.
        (result.applied if current is not None else result.created).append(key(obj))
    keep = {key(o) for o in wanted}
    result.deleted = _delete(kube, {k: o for k, o in live.objects.items() if k not in keep}, expect)
    return result


def delete_all(kube: Kube, live: Children, expect: Expectations) -> list[Key]:
    """Delete every child of the InferenceService (its deletion; owner references would, eventually)."""
    return _delete(kube, live.objects, expect)


def _delete(kube: Kube, objects: dict[Key, Obj], expect: Expectations) -> list[Key]:
    deleted = []
    for (api_version, kind, name), found in objects.items():
        meta = found["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        if kube.delete(api_version, kind, meta["namespace"], name):
            deleted.append((api_version, kind, name))
        expect.did_delete((api_version, kind, name))
    return deleted


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
