"""`folio abort NAME`: abort the running canary; traffic returns to 100% stable."""

from __future__ import annotations

import argparse

from folio.operator.local.overrides import add_arguments


def main(args: argparse.Namespace) -> int:
    from folio.operator.local.overrides import run

    return run(args, "abort")


__all__ = ["add_arguments", "main"]
