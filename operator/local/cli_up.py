"""`folio up FILE.yaml`: run an InferenceService on this machine (engines, router, rollout loop)."""

from __future__ import annotations

import argparse

from folio.operator.k8s.names import ROUTER_PORT
from folio.operator.local.target import add_state_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="InferenceService YAML (hf://, file:// or pkg:// model sources, pinned)")
    parser.add_argument("--port", type=int, default=ROUTER_PORT, help=f"where the router listens (default: {ROUTER_PORT})")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and plan the manifest, print what would run (each revision's weights and engine command "
        "line, the router's config) and exit: nothing is started or written",
    )
    add_state_dir(parser)
    parser.add_argument(
        "--secrets-dir",
        help="Secrets as Kubernetes mounts them, DIR/NAME/KEY: spec.access.apiKeysSecretRef names one, each file "
        "of it a tenant's API keys, one per line; followed while running (default: secrets in the state folder, "
        ".folio/secrets)",
    )


def main(args: argparse.Namespace) -> int:
    from folio.operator.local.up import run_up

    return run_up(args.file, port=args.port, state_dir=args.state_dir, dry_run=args.dry_run,
                  secrets_dir=args.secrets_dir)
