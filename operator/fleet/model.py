"""The RolloutPolicy resource: the single source of truth for its CRD (`folio crd --kind RolloutPolicy`).

A RolloutPolicy governs the InferenceServices of its namespace that its ``selector`` matches: their new
revisions start their canaries only as the policy admits them, at most ``maxConcurrent`` at once, wave by
wave (label ``folio.dev/wave``), and none after ``failureBudget`` rollbacks since the policy was last resumed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from folio.operator.spec import (
    API_VERSION,
    DOMAIN,
    DURATION_RE,
    Condition,
    Duration,
    Lenient,
    Model,
    parse_duration,
)

POLICY_KIND = "RolloutPolicy"
POLICY_PLURAL = "rolloutpolicies"
POLICY_SINGULAR = "rolloutpolicy"
POLICY_SHORT_NAMES = ["frp"]
# The label that puts an InferenceService in a wave (its value is a wave's ``label``); without it: last.
WAVE_LABEL = f"{DOMAIN}/wave"
# GitOps resume: a new value (any text; `folio fleet resume` writes the time) resets the failure budget
# once. The value handled last is kept in ``status.resumedBy``, so an annotation left in Git acts once.
RESUME_ANNOTATION = f"{DOMAIN}/resume-at"


class LabelSelectorRequirement(Model):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(Model):
    """A Kubernetes label selector; empty selects every InferenceService of the namespace."""

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for req in self.match_expressions:
            has, value = req.key in labels, labels.get(req.key)
            ok = {"In": has and value in req.values, "NotIn": not has or value not in req.values,
                  "Exists": has, "DoesNotExist": not has}[req.operator]
            if not ok:
                return False
        return True


class Wave(Model):
    label: str = Field(min_length=1, max_length=63, description="Value of the folio.dev/wave label of its services.")
    soak: Duration = Field(default="0s", pattern=DURATION_RE.pattern,
                           description="After every canary of the wave promoted: wait this long before the next wave.")

    @property
    def soak_seconds(self) -> float:
        return parse_duration(self.soak)


MAX_WAVES = 32


class RolloutPolicySpec(Model):
    selector: LabelSelector = Field(default_factory=LabelSelector,
                                    description="The InferenceServices of the namespace this policy governs.")
    max_concurrent: int = Field(default=1, ge=1, le=1000,
                                description="Governed services with a canary in progress at once (a paused one counts).")
    waves: list[Wave] = Field(default_factory=list, max_length=MAX_WAVES,
                              description="In order, by the folio.dev/wave label; services without it go last.")
    failure_budget: int = Field(default=1, ge=1, le=1000,
                                description="Rollbacks since the policy was last resumed after which no new "
                                "canary starts (Halted=True).")

    @field_validator("waves")
    @classmethod
    def _unique_labels(cls, waves: list[Wave]) -> list[Wave]:
        labels = [w.label for w in waves]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"wave label(s) {', '.join(twice)} given twice")
        return waves


PolicyPhase = Literal["Idle", "Progressing", "Soaking", "Halted"]
# A governed service, as the policy sees it: Idle (its spec's revision is stable, nothing to roll out),
# Pending (a new revision waits), Admitted (may start its canary), Running (a canary in progress, paused
# or not), Promoted (this rollout's revision promoted), RolledBack (its revision failed), Conflict (two
# policies select it: a planning error, it waits).
ServicePhase = Literal["Idle", "Pending", "Admitted", "Running", "Promoted", "RolledBack", "Conflict"]


class RolledBack(Lenient):
    name: str
    revision: str
    reason: str = ""
    at: str | None = None
    message: str = ""


class PolicyService(Lenient):
    """One governed service's row (`folio fleet status`): where it stands in this policy's rollout."""

    name: str
    wave: str | None = None  # its folio.dev/wave label; None: the last, unnamed wave
    phase: ServicePhase = "Idle"
    revision: str | None = None  # its spec's revision
    since: str | None = None  # when it entered this phase (the policy's pass that saw it)


class RolloutPolicyStatus(Lenient):
    observed_generation: int | None = None
    phase: PolicyPhase = "Idle"
    wave: str | None = None  # the wave that admits now (None: the last, unnamed one, or no wave)
    running: list[str] = Field(default_factory=list)  # admitted, or a canary in progress
    pending: list[str] = Field(default_factory=list)
    promoted: list[str] = Field(default_factory=list)
    rolled_back: list[RolledBack] = Field(default_factory=list)
    services: list[PolicyService] = Field(default_factory=list)
    resumed_at: str | None = None  # rollbacks before this do not count against failureBudget
    resumed_by: str | None = None  # the folio.dev/resume-at value handled last
    soak_until: str | None = None  # Soaking: the next wave starts then
    conditions: list[Condition] = Field(default_factory=list)

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def service(self, name: str) -> PolicyService | None:
        return next((s for s in self.services if s.name == name), None)


POLICY_API_VERSION = API_VERSION
