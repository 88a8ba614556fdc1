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
    parser.add_argument("--adapter", metavar="ADAPTER", help="act on this adapter's rollout (spec.adapters[].name) "
                        "instead of the base revisions'")


def main(args: argparse.Namespace) -> int:
    from folio.operator.local.client import ControlError
    from folio.operator.local.target import ClusterError, fail, resolve_target

    override, adapter = args.command, args.adapter
    try:
        target = resolve_target(args)
        if target.client is not None:
            snapshot = target.client.status()
            if snapshot["name"] != args.name:
                return fail(
                    override,
                    f"the local `folio up` runs {snapshot['name']!r}, not {args.name!r} (--kubernetes for a cluster)",
                )
            idle = _idle(override, snapshot.get("status"), snapshot.get("spec"), adapter)
            if idle is None:
                target.client.override(override, adapter)
            where = "local"
        else:
            assert target.cluster is not None
            found = target.cluster.get(args.name)
            idle = _idle(override, found.get("status"), found.get("spec"), adapter)
            if idle is None:
                target.cluster.request_override(args.name, override, adapter)
            where = f"namespace {target.cluster.namespace}"
    except (ControlError, ClusterError) as exc:
        return fail(override, str(exc))
    if idle is not None:
        return fail(override, f"inferenceservice/{args.name} ({where}): {idle}; nothing was requested")
    whose = f", adapter {adapter}" if adapter else ""
    print(f"inferenceservice/{args.name} ({where}{whose}): {override} requested; {WHAT[override]}")
    return 0


def _idle(override: str, status: object, spec: object, adapter: str | None = None) -> str | None:
    """What the rollout would say on ignoring ``override`` for this status and spec (wire forms), or None;
    ``adapter``: for that adapter's rollout."""
    from pydantic import ValidationError

    from folio.operator.rollout.types import nothing_to_act_on
    from folio.operator.spec import (
        InferenceServiceSpec,
        InferenceServiceStatus,
        RolloutStatus,
        adapter_revision_name,
        revision_name,
    )

    try:
        parsed: RolloutStatus | None = InferenceServiceStatus.model_validate(status) if status else None
    except ValidationError:
        return None  # a status this version cannot read: let the operator decide
    try:
        model = InferenceServiceSpec.model_validate(spec)
    except ValidationError:
        model = None
    if adapter is None:
        return nothing_to_act_on(override, parsed, revision_name(model) if model else None)
    pinned = next((a for a in model.adapters if a.name == adapter), None) if model else None
    if model is not None and pinned is None:
        return f"the spec has no adapter {adapter!r}"
    mine = parsed.adapter(adapter) if isinstance(parsed, InferenceServiceStatus) else None
    return nothing_to_act_on(override, mine, adapter_revision_name(pinned) if pinned else None)
