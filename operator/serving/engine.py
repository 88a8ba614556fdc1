"""The engine command line of a revision: the one place `folio serve`'s flags are decided.

`serve_args` gives the whole command line, in a cluster's pods and in `folio up`'s processes alike:
first what ties an engine to its revision and its place (the weights' path, the pin, the served
name, where it listens), which the operator sets, then `spec.engine.args`.

Those keys are the camelCase forms of the flags (`maxModelLen` → `--max-model-len`). What is
allowed, and with which type, is read from `folio serve`'s own argument parser, so a flag added to
the engine is usable from the spec at once and a removed one is refused. An unknown key or a value
of the wrong type is a `PlanningError` that the operator reports in status.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from folio.operator.serving.errors import PlanningError
from folio.operator.spec import EngineArgValue, ModelSource

# bool: --x/--no-x; switch: --x or nothing; json: a flag taking JSON (metavar JSON), given as an object or its text
ArgKind = Literal["int", "float", "str", "bool", "switch", "json"]

# Set by the operator from the spec and the cache layout; never from engine.args.
OPERATOR_FLAGS = frozenset(
    {"model", "digest", "servedModelName", "port", "metricsPort", "host", "revision", "tokenizer"}
)
# Set by the operator (or by LeaderWorkerSet's environment) for a replica that spans several pods
# (`folio.operator.serving.parallel`); never from engine.args either.
GROUP_FLAGS = frozenset({"nnodes", "nodeRank", "masterAddr", "masterPort", "headless"})
HEADLESS = "--headless"  # a group's worker: its ranks only, no HTTP

_TYPE_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
               "switch": "true or false", "json": "a JSON object (or its text)"}


def serve_args(
    model: ModelSource,
    flags: Sequence[str],
    *,
    weights: str,
    served_name: str,
    host: str,
    port: int,
    metrics_port: int | None = None,
) -> list[str]:
    """`folio serve`'s arguments for a revision pinned to ``model`` whose weights are at ``weights``;
    ``flags`` are its `engine_flags`; ``metrics_port``: serve /metrics on that port too."""
    # One served name for every revision: clients must not notice which one answers.
    pinned = ["--model", weights, "--served-model-name", served_name, "--host", host, "--port", str(port)]
    if metrics_port is not None:
        pinned += ["--metrics-port", str(metrics_port)]
    if model.revision:
        pinned += ["--revision", model.revision]
    if model.digest:
        pinned += ["--digest", model.digest]
    if "--enable-lora" in flags and "--allow-runtime-lora-updating" not in flags:
        # the operator and `folio up` load adapters at run time (`folio.operator.reconcile.adapters`); the
        # NetworkPolicy keeps the endpoints to the operator and routers, which never forward them
        pinned.append("--allow-runtime-lora-updating")
    return [*pinned, *flags]


def group_flags(nnodes: int, master_port: int) -> list[str]:
    """What ties a replica's ``nnodes`` pods (or `folio up` processes) together; each one's rank and the
    leader's address come from LeaderWorkerSet's environment (`LWS_WORKER_INDEX`, `LWS_LEADER_ADDRESS`)."""
    return ["--nnodes", str(nnodes), "--master-port", str(master_port)] if nnodes > 1 else []


def worker_args(model: ModelSource, flags: Sequence[str], *, weights: str, served_name: str, nnodes: int,
                master_port: int) -> list[str]:
    """`folio serve`'s arguments for a group's worker (node rank > 0): the leader's, less where it listens (a
    worker serves no HTTP), plus `--headless`."""
    pinned = ["--model", weights, "--served-model-name", served_name]
    if model.revision:
        pinned += ["--revision", model.revision]
    if model.digest:
        pinned += ["--digest", model.digest]
    if "--enable-lora" in flags and "--allow-runtime-lora-updating" not in flags:
        pinned.append("--allow-runtime-lora-updating")  # as the leader's: the ranks must agree on their flags
    return [*pinned, *flags, *group_flags(nnodes, master_port), HEADLESS]


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
        if key in OPERATOR_FLAGS or key in GROUP_FLAGS:
            continue
        kind: ArgKind
        if isinstance(action, argparse.BooleanOptionalAction):
            kind = "bool"
        elif action.nargs == 0:  # store_true
            kind = "switch"
        elif action.metavar == "JSON":
            kind = "json"
        else:
            kind = "int" if action.type is int else "float" if action.type is float else "str"
        table[key] = Flag(kind, tuple(action.choices) if action.choices else None)
    return table


def engine_flags(args: Mapping[str, EngineArgValue], table: Mapping[str, Flag] | None = None) -> list[str]:
    """The `folio serve` flags for `args`, in a stable order; raises `PlanningError` on bad input."""
    table = engine_flags_table() if table is None else table
    problems = arg_problems(args, table)
    if problems:
        raise PlanningError(
            "InvalidEngineArgs",
            f"spec.engine.args: {'; '.join(m for _, m in problems)} (known args: {known_args(table)})",
        )
    flags: list[str] = []
    for key in sorted(args):
        value, flag = args[key], table[key]
        if flag.kind == "bool":
            flags.append(f"--{kebab(key)}" if value else f"--no-{kebab(key)}")
        elif flag.kind == "switch":
            flags.extend([f"--{kebab(key)}"] if value else [])
        elif isinstance(value, dict):
            flags.extend([f"--{kebab(key)}", json.dumps(value, sort_keys=True, separators=(",", ":"))])
        else:
            flags.extend([f"--{kebab(key)}", str(value)])
    _check_values(flags)
    return flags


def arg_problems(args: Mapping[str, EngineArgValue], table: Mapping[str, Flag] | None = None) -> list[tuple[str, str]]:
    """(key, what is wrong with it) for each engine arg `engine_flags` refuses by name, type or choice."""
    table = engine_flags_table() if table is None else table
    problems: list[tuple[str, str]] = []
    for key in sorted(args):
        value, flag = args[key], table.get(key)
        if key in OPERATOR_FLAGS:
            problems.append((key, f"{key!r} is set by the operator from spec.model and cannot be overridden"))
        elif key in GROUP_FLAGS:
            problems.append((key, f"{key!r} is set by the operator for a replica that spans several pods (from "
                                  "tensorParallelSize × pipelineParallelSize and the GPUs of spec.engine.resources) "
                                  "and cannot be set in spec.engine.args"))
        elif flag is None:
            problems.append((key, f"unknown engine arg {key!r}"))
        elif not _fits(flag.kind, value):
            problems.append((key, f"engine arg {key!r} must be {_TYPE_NAMES[flag.kind]}, got {value!r}"))
        elif flag.choices is not None and value not in flag.choices:
            problems.append((key, f"engine arg {key!r} must be one of {_listing(flag.choices)}, got {value!r}"))
    return problems


def known_args(table: Mapping[str, Flag] | None = None) -> str:
    return _listing(sorted(engine_flags_table() if table is None else table))


@functools.cache
def _serve_parser() -> argparse.ArgumentParser:
    """`folio serve`'s parser, built once: every pass checks its flags (building it is most of the check)."""
    from folio.engine import serve_cli

    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    serve_cli.add_arguments(parser)
    return parser


def _check_values(flags: list[str]) -> None:
    """Run `folio serve`'s own checks on the flags now, so that a value it would refuse (maxNumSeqs 0,
    blockSize 3, kvCacheMemoryGib -1 ...) is a planning error naming the arg, not a crash-looping pod."""
    from folio.engine import serve_cli

    try:
        serve_cli.check(_serve_parser().parse_args(["--model", "(planned)", *flags]))
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
    if kind == "json":
        return isinstance(value, (dict, str))
    return isinstance(value, str)


def _listing(items: Sequence[Any]) -> str:
    return ", ".join(str(i) for i in items)
