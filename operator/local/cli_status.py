"""`folio status [NAME] [-o json]`: the status table (or the `status` object) of a local or cluster service."""

from __future__ import annotations

import argparse
import json
from typing import Any

from folio.operator.local.target import add_target_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, name_required=False)
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format")
    parser.add_argument("--parity", action="store_true", help="the parity gate's report (with -o json: the report)")
    parser.add_argument("--tenants", action="store_true",
                        help="each tenant's usage over the last minute and hour, from the service's routers "
                        "(spec.access; with -o json: the counts)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from folio.operator.local.client import ControlError
    from folio.operator.local.render import status_table
    from folio.operator.local.target import ClusterError, fail, resolve_target
    from folio.operator.spec import InferenceServiceStatus

    console = Console()
    if args.tenants:
        return _tenants(args, console)
    try:
        target = resolve_target(args)
        if target.client is not None:
            snap = target.client.status()
            if args.name and snap["name"] != args.name:
                return fail(
                    "status",
                    f"the local `folio up` runs {snap['name']!r}, not {args.name!r} (--kubernetes for a cluster)",
                )
            items = [(snap["name"], snap["status"], snap["processes"])]
        else:
            assert target.cluster is not None
            objs = [target.cluster.get(args.name)] if args.name else target.cluster.list()
            items = [(o["metadata"]["name"], o.get("status") or {}, None) for o in objs]
    except (ControlError, ClusterError) as exc:
        return fail("status", str(exc))

    if args.parity:
        from folio.operator.local.render_parity import latest_report, parity_table

        for name, status, _ in items:
            st = InferenceServiceStatus.model_validate(status)
            if args.output == "json":
                report = latest_report(st)
                print(json.dumps(report.to_wire() if report else None, indent=2, sort_keys=True))
            else:
                console.print(parity_table(name, st))
        return 0
    if args.output == "json":
        doc = items[0][1] if args.name or target.client is not None else {n: s for n, s, _ in items}
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    if not items:
        namespace = target.cluster.namespace if target.cluster else "-"
        console.print(f"no InferenceServices in namespace {namespace}", markup=False, emoji=False, highlight=False)
    for name, status, processes in items:
        console.print(status_table(name, InferenceServiceStatus.model_validate(status), processes))
    return 0


def _tenants(args: argparse.Namespace, console: Any) -> int:
    import httpx

    from folio.operator.local.client import ControlError
    from folio.operator.local.render_tenants import local_usage, tenants_table
    from folio.operator.local.target import ClusterError, fail, resolve_target
    from folio.operator.router.usage import merge

    try:
        target = resolve_target(args)
        if target.client is not None:
            snap = target.client.status()
            if args.name and snap["name"] != args.name:
                return fail("status", f"the local `folio up` runs {snap['name']!r}, not {args.name!r} "
                            "(--kubernetes for a cluster)")  # fmt: skip
            name, per_router = snap["name"], local_usage(snap)
        else:
            assert target.cluster is not None
            if not args.name:
                return fail("status", "--tenants needs the InferenceService's name in a cluster")
            name, per_router = args.name, target.cluster.router_usage(args.name)
    except (ControlError, ClusterError, httpx.HTTPError) as exc:
        return fail("status", f"cannot read the tenants' usage: {exc}")
    usage = merge(per_router)
    if args.output == "json":
        print(json.dumps(usage, indent=2, sort_keys=True))
    else:
        console.print(tenants_table(name, usage, len(per_router)))
    return 0
