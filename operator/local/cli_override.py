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
            local = target.client.status()["name"]
            if local != args.name:
                return fail(
                    override,
                    f"the local `folio up` runs {local!r}, not {args.name!r} (--kubernetes for a cluster)",
                )
            target.client.override(override)
            where = "local"
        else:
            assert target.cluster is not None
            target.cluster.request_override(args.name, override)
            where = f"namespace {target.cluster.namespace}"
    except (ControlError, ClusterError) as exc:
        return fail(override, str(exc))
    print(f"inferenceservice/{args.name} ({where}): {override} requested; {WHAT[override]}")
    return 0
