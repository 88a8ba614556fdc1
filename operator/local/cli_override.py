"""`folio promote|abort|retry NAME`: a manual override, locally through the control endpoint or as a
cluster annotation (``args.command`` says which)."""

from __future__ import annotations

import argparse

from folio.operator.local.target import add_target_arguments

WHAT = {
    "promote": "the canary will be promoted to stable",
    "abort": "the canary will be rolled back (traffic returns to stable)",
    "retry": "the failed revision will be tried again",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from folio.operator.local.client import ControlError
    from folio.operator.local.target import ClusterError, fail, resolve_target

    override = args.command
    try:
        target = resolve_target(args)
        if target.client is not None:
            snapshot = target.client.status()
            if snapshot["name"] != args.name:
                return fail(
                    override,
                    f"the local `folio up` runs {snapshot['name']!r}, not {args.name!r} (--kubernetes for a cluster)",
                )
            idle = _idle(override, snapshot.get("status"), snapshot.get("spec"))
            if idle is None:
                target.client.override(override)
            where = "local"
        else:
            assert target.cluster is not None
            found = target.cluster.get(args.name)
            idle = _idle(override, found.get("status"), found.get("spec"))
            if idle is None:
                target.cluster.request_override(args.name, override)
            where = f"namespace {target.cluster.namespace}"
    except (ControlError, ClusterError) as exc:
        return fail(override, str(exc))
    if idle is not None:
        return fail(override, f"inferenceservice/{args.name} ({where}): {idle}; nothing was requested")
    print(f"inferenceservice/{args.name} ({where}): {override} requested; {WHAT[override]}")
    return 0


def _idle(override: str, status: object, spec: object) -> str | None:
    """What the rollout would say on ignoring ``override`` for this status and spec (wire forms), or None."""
    from pydantic import ValidationError

    from folio.operator.rollout.types import nothing_to_act_on
    from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, revision_name

    try:
        parsed = InferenceServiceStatus.model_validate(status) if status else None
    except ValidationError:
        return None  # a status this version cannot read: let the operator decide
    try:
        target = revision_name(InferenceServiceSpec.model_validate(spec))
    except ValidationError:
        target = None
    return nothing_to_act_on(override, parsed, target)
