"""`folio fleet status NAME` and `folio fleet resume NAME`: a RolloutPolicy in the cluster (policies govern
InferenceServices of a cluster; a local `folio up` runs one service and has none).

``resume`` sets the ``folio.dev/resume-at`` annotation to the current time, exactly what a GitOps change of
that annotation does: the operator resets the failure budget once per distinct value (``status.resumedBy``).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Any

from folio.operator.local.target import (  # light: `folio --help` imports every command module
    ClusterError,
    fail,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["status", "resume"],
                        help="status: the table of services, waves and phases; resume: reset the failure budget")
    parser.add_argument("name", help="RolloutPolicy name")
    parser.add_argument("-n", "--namespace", help="cluster namespace (default: the kube context's)")
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table",
                        help="status: a table (default) or the policy's status as JSON")


def main(args: argparse.Namespace) -> int:
    from folio.operator.fleet.model import POLICY_KIND, RESUME_ANNOTATION
    from folio.operator.k8s.names import current_namespace
    from folio.operator.local.target import Cluster
    from folio.operator.spec import API_VERSION, now_iso

    namespace = args.namespace or current_namespace()
    cluster = Cluster(namespace)
    what = f"RolloutPolicy {args.name!r}"
    try:
        found = cluster._call(lambda kube: kube.get(API_VERSION, POLICY_KIND, namespace, args.name), what)
        if found is None:
            raise ClusterError(f"{what} not found in namespace {namespace!r}")
        if args.action == "resume":
            value = now_iso(datetime.now(timezone.utc))
            patch = {"metadata": {"annotations": {RESUME_ANNOTATION: value}}}
            cluster._call(lambda kube: kube.merge_patch(API_VERSION, POLICY_KIND, namespace, args.name, patch), what)
            print(f"rolloutpolicy/{args.name} (namespace {namespace}): resume requested ({RESUME_ANNOTATION}={value}); "
                  "the failure budget counts rollbacks from now on")
            return 0
    except ClusterError as exc:
        return fail(f"fleet {args.action}", str(exc))
    status = found.get("status") or {}
    if args.output == "json":
        json.dump(status, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(table(args.name, status))
    return 0


def table(name: str, status: dict[str, Any]) -> str:
    """The policy's phase and conditions, then one row per governed service."""
    from folio.operator.fleet.model import RolloutPolicyStatus

    st = RolloutPolicyStatus.model_validate(status)
    lines = [f"rolloutpolicy/{name}: {st.phase}" + (f", wave {st.wave}" if st.wave else "")
             + (f", soaking until {st.soak_until}" if st.phase == "Soaking" else "")]
    for c in st.conditions:
        lines.append(f"  {c.type}={c.status} ({c.reason}): {c.message}")
    failures = {r.name: r for r in st.rolled_back}
    rows = [("SERVICE", "WAVE", "PHASE", "REVISION", "SINCE", "REASON")]
    for s in st.services:
        reason = failures[s.name].reason if s.name in failures else ""
        rows.append((s.name, s.wave or "-", s.phase, s.revision or "-", s.since or "-", reason))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines) + "\n"
