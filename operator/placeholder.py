"""Stand-in for a subcommand whose issue has not landed yet: says so and exits 2."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def main(args: argparse.Namespace) -> int:
    print(f"folio {args.command}: not implemented yet", file=sys.stderr)
    return 2
