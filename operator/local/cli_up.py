"""Placeholder until its issue lands."""

from folio.operator.placeholder import add_arguments, main

__all__ = ["add_arguments", "main"]
