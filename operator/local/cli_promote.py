"""`folio promote NAME`: promote the running canary now."""

from __future__ import annotations

import argparse

from folio.operator.local.overrides import add_arguments


def main(args: argparse.Namespace) -> int:
    from folio.operator.local.overrides import run

    return run(args, "promote")


__all__ = ["add_arguments", "main"]
