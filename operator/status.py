"""Status condition helpers, following the Kubernetes conventions (`metav1.Condition`).

`lastTransitionTime` moves only when a condition's status flips; reason, message and
observedGeneration are refreshed on every write. That keeps `kubectl wait --for=condition=Ready`
and "since when" questions honest while messages stay current.
"""

from __future__ import annotations

from datetime import datetime, timezone

from folio.operator.spec import Condition, ConditionStatus, now_iso

# The order in which conditions are listed in status, so a rewrite never reshuffles them.
CONDITION_ORDER = ("Ready", "Progressing", "Degraded", "WeightsReady")


def as_utc(now: datetime) -> datetime:
    """Aware UTC datetime; a naive one is taken to be UTC already."""
    return now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now.astimezone(timezone.utc)


def parse_time(text: str) -> datetime:
    """Inverse of `now_iso`: an RFC 3339 ``…Z`` timestamp (fractional seconds allowed) as aware UTC."""
    return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """Return ``conditions`` with ``type_`` set; the transition time changes only on a status flip."""
    old = next((c for c in conditions if c.type == type_), None)
    changed = old is None or old.status != status or old.last_transition_time is None
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=now_iso(as_utc(now)) if changed else old.last_transition_time,
    )
    rest = [c for c in conditions if c.type != type_]
    return sorted([*rest, new], key=_order)


def _order(c: Condition) -> tuple[int, str]:
    rank = CONDITION_ORDER.index(c.type) if c.type in CONDITION_ORDER else len(CONDITION_ORDER)
    return rank, c.type
