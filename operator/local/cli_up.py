"""`folio up FILE.yaml`: run an InferenceService on this machine (engines, router, rollout loop)."""

from __future__ import annotations

import argparse

from folio.operator.local.target import add_state_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="InferenceService YAML (file:// model sources with their digest)")
    parser.add_argument("--port", type=int, default=8080, help="where the router listens (default: 8080)")
    add_state_dir(parser)


def main(args: argparse.Namespace) -> int:
    from folio.operator.local.up import run_up

    return run_up(args.file, port=args.port, state_dir=args.state_dir)
