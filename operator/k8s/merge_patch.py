"""RFC 7386 JSON merge patches computed from two documents (how status is written).

Status is written with a merge patch, in which a missing key means "leave as is": a field the
new status no longer has must be sent as null to be removed. Lists are replaced as a whole.
"""

from __future__ import annotations

from typing import Any


def merge_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The smallest merge patch that turns `old` into `new` (empty when they are equal)."""
    patch: dict[str, Any] = {}
    for k in old.keys() - new.keys():
        patch[k] = None
    for k, value in new.items():
        before = old.get(k)
        if isinstance(value, dict) and isinstance(before, dict):
            sub = merge_diff(before, value)
            if sub:
                patch[k] = sub
        elif k not in old or before != value:
            patch[k] = value
    return patch
