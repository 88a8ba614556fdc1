"""The `folio` command line.

Each subcommand lives in the module that owns it; this file only routes. A command module
exposes `add_arguments(parser)` and `main(args) -> int` (``args.command`` names the command, so
one module may serve several) and keeps heavy imports (torch, kopf, uvicorn) inside `main`, so
`folio --help` and argument errors stay instant.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Sequence

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("folio.engine.serve_cli", "run one engine replica (OpenAI-compatible server)"),
    "router": ("folio.operator.router.cli", "run the traffic router for one InferenceService"),
    "operator": ("folio.operator.controller.cli", "run the Kubernetes operator (kopf)"),
    "crd": ("folio.operator.crd", "print the CRD YAML generated from the spec model"),
    "up": ("folio.operator.local.cli_up", "run an InferenceService on this machine"),
    "apply": ("folio.operator.local.cli_apply", "change a running local InferenceService"),
    "status": ("folio.operator.local.cli_status", "show InferenceService status (local or cluster)"),
    "promote": ("folio.operator.local.cli_override", "promote the running canary now"),
    "abort": ("folio.operator.local.cli_override", "abort the running canary (back to 100% stable)"),
    "retry": ("folio.operator.local.cli_override", "retry a failed revision"),
    "fleet": ("folio.operator.local.cli_fleet", "a RolloutPolicy: `fleet status NAME` (its services, waves and phases), "
              "`fleet resume NAME` (reset its failure budget)"),
    "digest": ("folio.engine.digest", "print the sha256 content digest of a weight file or folder"),
}


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations: argparse would take `--max-num-seq 4` as `--max-num-seqs`, so a typo would run
    # silently; each unknown flag is an error that names the flag it is close to (`main`).
    parser = argparse.ArgumentParser(
        prog="folio",
        description="Folio: LLM inference on Kubernetes with pinned revisions and canary rollouts.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"folio {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        # help strings are %-formatted by argparse; descriptions are not
        cmd = sub.add_parser(name, help=help_text.replace("%", "%%"), description=help_text, allow_abbrev=False)
        module.add_arguments(cmd)
        cmd.set_defaults(_main=module.main, _parser=cmd)
    return parser


def _unknown(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """argparse's "unrecognized arguments" message, with the flag each unknown one is close to."""
    known = [o for action in parser._actions for o in action.option_strings]  # no public accessor
    hints = []
    for arg in extras:
        flag = arg.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.7) if flag.startswith("-") else []
        if close:
            hints.append(f"{flag}: did you mean {close[0]}?")
    return f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else "")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("folio")
    except PackageNotFoundError:
        return "0.0.0+unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)  # exits 2 with usage on bad input
    if extras:
        command = getattr(args, "_parser", parser)
        command.error(_unknown(command, extras))  # exits 2
    try:
        return int(args._main(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `folio status -o json | head` closed our stdout: not an error. Point stdout at /dev/null so
        # the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
