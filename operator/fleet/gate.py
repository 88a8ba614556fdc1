"""The gate in an InferenceService's rollout: may its new revision start its canary now?

Pure: the policies of the service's namespace (their selector and the status their last pass wrote, as
the operator's index holds them) and the service's labels and spec revision in, a `Hold` (why it waits)
or None out. Read only when the rollout would start a canary (`folio.operator.rollout.transitions`): a
canary in progress finishes on its own evidence whatever a policy says. No policy selecting the service
(it left the selector, or the policy was deleted) releases it at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from folio.operator.fleet.model import WAVE_LABEL, LabelSelector, RolloutPolicyStatus
from folio.operator.fleet.policy import IN_FLIGHT


@dataclass(frozen=True)
class PolicyRef:
    """One RolloutPolicy as the gate reads it."""

    name: str
    selector: LabelSelector
    status: RolloutPolicyStatus


@dataclass(frozen=True)
class Hold:
    policy: str
    wave: str | None
    message: str


def hold(policies: Sequence[PolicyRef], name: str, labels: Mapping[str, str], target: str) -> Hold | None:
    """Why ``target`` (service ``name``'s spec revision) may not start its canary now; None when it may."""
    selecting = sorted((p for p in policies if p.selector.matches(dict(labels))), key=lambda p: p.name)
    wave = labels.get(WAVE_LABEL)
    where = f"wave {wave}" if wave is not None else "the unlabelled wave"
    if not selecting:
        return None
    if len(selecting) > 1:
        names = ", ".join(p.name for p in selecting)
        return Hold(selecting[0].name, wave, f"revision {target} waits: RolloutPolicies {names} all select this "
                    "service (a planning error); the stable revision keeps serving")
    policy = selecting[0]
    row = policy.status.service(name)
    if row is not None and row.revision == target and row.phase in IN_FLIGHT:
        return None
    why = {"Halted": "the policy is halted (`folio fleet resume` to go on)",
           "Soaking": f"the policy soaks wave {policy.status.wave} until {policy.status.soak_until}"}.get(
        policy.status.phase, f"{len(policy.status.running)} canaries run, policy wave {policy.status.wave or '-'}")
    return Hold(policy.name, wave, f"revision {target} waits for RolloutPolicy {policy.name} ({where}): {why}; "
                "the stable revision keeps serving")
