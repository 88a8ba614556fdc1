"""`folio retry NAME`: try a failed revision again."""

from __future__ import annotations

import argparse

from folio.operator.local.overrides import add_arguments


def main(args: argparse.Namespace) -> int:
    from folio.operator.local.overrides import run

    return run(args, "retry")


__all__ = ["add_arguments", "main"]
