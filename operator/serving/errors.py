"""What the operator reports, rather than crashes on, when a spec cannot be planned."""

from __future__ import annotations


class PlanningError(ValueError):
    """A spec the schema accepts but the operator cannot turn into objects (reported in status)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
