"""Shared by the local command modules: manifest loading and finding the service to talk to.

Kept light (no FastAPI, kubernetes or torch at import time) because `folio --help` imports every
command module.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_STATE_DIR = ".folio"


class ManifestError(ValueError):
    """A manifest that cannot be used; the message is meant for the user as it is."""


def load_manifest(path: str | Path) -> Any:
    """Parse and validate an InferenceService YAML file (the `InferenceService` model)."""
    import yaml
    from pydantic import ValidationError

    from folio.operator.spec import KIND, InferenceService
    from folio.operator.yaml_load import load_all

    path = Path(path)
    try:
        docs = [d for d in load_all(path.read_text()) if d is not None]
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path} is not valid YAML: {exc}") from None
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(found) != 1:
        raise ManifestError(f"{path} must hold exactly one {KIND} document, found {len(found)}")
    try:
        manifest = InferenceService.model_validate(found[0])
    except ValidationError as exc:
        raise ManifestError(f"{path}: {format_validation_error(exc)}") from None
    if not manifest.name:
        raise ManifestError(f"{path}: metadata.name is required")
    return manifest


def add_state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help=f"state folder of the local `folio up` (default: {DEFAULT_STATE_DIR} in the working directory)",
    )


def add_target_arguments(parser: argparse.ArgumentParser, *, name_required: bool = True) -> None:
    parser.add_argument("name", nargs=None if name_required else "?", help="InferenceService name")
    add_state_dir(parser)
    parser.add_argument(
        "--kubernetes", action="store_true", help="talk to the cluster even when a local `folio up` runs here"
    )
    parser.add_argument("-n", "--namespace", help="cluster namespace (default: the kube context's)")


@dataclass
class Target:
    """Where a command goes: a local `folio up` (client set) or the cluster (namespace set)."""

    client: Any = None  # LocalClient
    namespace: str | None = None


def resolve_target(args: argparse.Namespace) -> Target:
    """The local `folio up` in --state-dir unless --kubernetes; the cluster when none runs here."""
    from folio.operator.local.client import LocalClient

    if not args.kubernetes:
        client = LocalClient.find(args.state_dir)
        if client is not None:
            return Target(client=client)
    from folio.operator.local.kube import current_namespace

    return Target(namespace=args.namespace or current_namespace())


def fail(command: str, message: str) -> int:
    print(f"folio {command}: {message}", file=sys.stderr)
    return 1


def format_validation_error(exc: Any) -> str:
    """A pydantic ValidationError as short `field.path: message` lines, without the URL noise."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"{loc}: {err['msg']}")
    return "; ".join(lines)
