"""An InferenceService's children and pods, as kopf's indexes hold them, and what a pass expects of them.

`index_child` keeps every object labelled `managed-by=folio` in memory by (namespace,
InferenceService), from kopf's own watches: a pass reads them instead of listing eight kinds. The
watches lag the writes by a moment, so `Expectations` remembers what this operator applied or
deleted until the index shows it (as Kubernetes' own ReplicaSet controller does): an object just
created is not created again, one just deleted is no longer looked at.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from folio.operator.k8s.names import ISVC_LABEL, MANAGED_KINDS, has_labels

Obj = dict[str, Any]
Key = tuple[str, str, str]  # apiVersion, kind, name
INDEXED_KINDS: tuple[tuple[str, str], ...] = (*MANAGED_KINDS, ("v1", "Pod"))
# An expectation the index never meets (the object changed or vanished meanwhile) is given up after this.
EXPECTATION_TTL_S = 60.0


def key(obj: Obj) -> Key:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


def index_id(kind: str) -> str:
    """The name of a kind's index, which kopf also passes to every handler as a keyword argument."""
    return f"folio_{kind.lower()}s"


def index_child(body: kopf.Body, namespace: str | None, labels: Mapping[str, str], **_: Any) -> dict | None:
    """kopf indexing function: a child object under (namespace, InferenceService)."""
    isvc = labels.get(ISVC_LABEL)
    if not isvc or namespace is None:
        return None
    return {(namespace, isvc): dict(body)}


@dataclass
class Children:
    objects: dict[Key, Obj] = field(default_factory=dict)  # of the managed kinds
    pods: list[Obj] = field(default_factory=list)

    @classmethod
    def from_indexes(cls, indexes: Mapping[str, Any], namespace: str, isvc: str) -> Children:
        """This InferenceService's part of the indexes kopf passed to a handler."""
        found = cls()
        for api_version, kind in INDEXED_KINDS:
            index = indexes.get(index_id(kind))
            for obj in (index.get((namespace, isvc), ()) if index is not None else ()):
                if kind == "Pod":
                    found.pods.append(obj)
                else:
                    found.objects[(api_version, kind, obj["metadata"]["name"])] = obj
        return found

    def get(self, api_version: str, kind: str, name: str) -> Obj | None:
        return self.objects.get((api_version, kind, name))

    def pods_with(self, labels: dict[str, str]) -> list[Obj]:
        return [p for p in self.pods if has_labels(p, labels)]


@dataclass
class Expectations:
    """Writes of this operator that its index has not caught up with yet (kept in the object's memo)."""

    applied: dict[Key, tuple[Obj, float]] = field(default_factory=dict)  # desired, expires
    deleted: dict[Key, float] = field(default_factory=dict)  # expires

    def view(self, children: Children, now: float | None = None) -> Children:
        """``children`` as they are after this operator's last writes; settles what the index now shows."""
        now = time.monotonic() if now is None else now
        for k, (desired, expires) in list(self.applied.items()):
            live = children.objects.get(k)
            if now > expires or (live is not None and contains(live, desired)):
                del self.applied[k]
        for k, expires in list(self.deleted.items()):
            if now > expires or k not in children.objects:
                del self.deleted[k]
        objects = {k: v for k, v in children.objects.items() if k not in self.deleted}
        return Children(objects, children.pods)

    def awaits(self, obj: Obj) -> bool:
        """This very object was applied and its watch event is still on the way."""
        pending = self.applied.get(key(obj))
        return pending is not None and pending[0] == obj

    def did_apply(self, obj: Obj, now: float | None = None) -> None:
        self.deleted.pop(key(obj), None)
        self.applied[key(obj)] = (obj, (time.monotonic() if now is None else now) + EXPECTATION_TTL_S)

    def did_delete(self, k: Key, now: float | None = None) -> None:
        self.applied.pop(k, None)
        self.deleted[k] = (time.monotonic() if now is None else now) + EXPECTATION_TTL_S


def contains(live: object, desired: object) -> bool:
    """Whether `live` has every field of `desired` with the same value (lists: same length, item-wise)."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(live) == len(desired)
                and all(contains(a, b) for a, b in zip(live, desired, strict=True)))
    return live == desired
