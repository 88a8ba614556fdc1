"""`spec.engine.args` → `folio serve` flags.

Keys are the camelCase forms of the flags (`maxModelLen` → `--max-model-len`). What is allowed,
and with which type, is read from `folio serve`'s own argument parser, so a flag added to the
engine is usable from the spec at once and a removed one is refused. The flags that tie a pod to
its revision (model path, digest, served name, port, host...) belong to the operator. An unknown
key or a value of the wrong type is a `PlanningError` that the operator reports in status.
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from folio.operator.spec import EngineArgValue

ArgKind = Literal["int", "float", "str", "bool", "switch"]  # bool: --x/--no-x; switch: --x or nothing

# Set by the operator from the spec and the cache layout; never from engine.args.
OPERATOR_FLAGS = frozenset({"model", "digest", "servedModelName", "port", "host", "revision", "tokenizer"})

_TYPE_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
               "switch": "true or false"}


class PlanningError(ValueError):
    """A spec the schema accepts but the operator cannot turn into objects."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Flag:
    kind: ArgKind
    choices: tuple[Any, ...] | None = None


def kebab(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", key).lower()


def camel(flag: str) -> str:
    head, *rest = flag.split("-")
    return head + "".join(part.capitalize() for part in rest)


@functools.cache
def engine_flags_table() -> Mapping[str, Flag]:
    """The `folio serve` flags a spec may set, by camelCase key, read from its parser."""
    from folio.engine import serve_cli  # argparse only: the engine's heavy imports stay in its main

    parser = argparse.ArgumentParser(add_help=False)
    serve_cli.add_arguments(parser)
    return flags_of(parser)


def flags_of(parser: argparse.ArgumentParser) -> dict[str, Flag]:
    table: dict[str, Flag] = {}
    for action in parser._actions:  # argparse has no public accessor for its options
        names = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        if not names or action.default == argparse.SUPPRESS:  # --help, --version and hidden flags
            continue
        key = camel(names[0][2:])
        if key in OPERATOR_FLAGS:
            continue
        kind: ArgKind
        if isinstance(action, argparse.BooleanOptionalAction):
            kind = "bool"
        elif action.nargs == 0:  # store_true
            kind = "switch"
        else:
            kind = "int" if action.type is int else "float" if action.type is float else "str"
        table[key] = Flag(kind, tuple(action.choices) if action.choices else None)
    return table


def engine_flags(args: Mapping[str, EngineArgValue], table: Mapping[str, Flag] | None = None) -> list[str]:
    """The `folio serve` flags for `args`, in a stable order; raises `PlanningError` on bad input."""
    table = engine_flags_table() if table is None else table
    problems: list[str] = []
    flags: list[str] = []
    for key in sorted(args):
        value, flag = args[key], table.get(key)
        if key in OPERATOR_FLAGS:
            problems.append(f"{key!r} is set by the operator from spec.model and cannot be overridden")
        elif flag is None:
            problems.append(f"unknown engine arg {key!r}")
        elif not _fits(flag.kind, value):
            problems.append(f"engine arg {key!r} must be {_TYPE_NAMES[flag.kind]}, got {value!r}")
        elif flag.choices is not None and value not in flag.choices:
            problems.append(f"engine arg {key!r} must be one of {_listing(flag.choices)}, got {value!r}")
        elif flag.kind == "bool":
            flags.append(f"--{kebab(key)}" if value else f"--no-{kebab(key)}")
        elif flag.kind == "switch":
            flags.extend([f"--{kebab(key)}"] if value else [])
        else:
            flags.extend([f"--{kebab(key)}", str(value)])
    if problems:
        raise PlanningError(
            "InvalidEngineArgs", f"spec.engine.args: {'; '.join(problems)} (known args: {_listing(sorted(table))})"
        )
    _check_values(flags)
    return flags


def _check_values(flags: list[str]) -> None:
    """Run `folio serve`'s own checks on the flags now, so that a value it would refuse (maxNumSeqs 0,
    blockSize 3, kvCacheMemoryGib -1 ...) is a planning error naming the arg, not a crash-looping pod."""
    from folio.engine import serve_cli

    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    serve_cli.add_arguments(parser)
    try:
        serve_cli.check(parser.parse_args(["--model", "(planned)", *flags]))
    except serve_cli.FlagError as exc:
        raise PlanningError("InvalidEngineArgs", f"spec.engine.args.{camel(exc.dest.replace('_', '-'))}: {exc}") from None
    except (argparse.ArgumentError, SystemExit) as exc:  # types were checked above; defensive only
        raise PlanningError("InvalidEngineArgs", f"spec.engine.args: {exc}") from None


def _fits(kind: ArgKind, value: EngineArgValue) -> bool:
    if kind in ("bool", "switch"):
        return isinstance(value, bool)
    if isinstance(value, bool):  # bool is an int in Python, never in a flag
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "float":
        return isinstance(value, (int, float))
    return isinstance(value, str)


def _listing(items: Sequence[Any]) -> str:
    return ", ".join(str(i) for i in items)
