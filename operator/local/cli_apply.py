"""`folio apply FILE.yaml`: change a running local InferenceService (a new revision starts a canary)."""

from __future__ import annotations

import argparse

from folio.operator.local.target import add_state_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="InferenceService YAML")
    add_state_dir(parser)


def main(args: argparse.Namespace) -> int:
    from folio.operator.cli import fail
    from folio.operator.local.client import ControlError, LocalClient
    from folio.operator.local.manifest import ManifestError, load_manifest

    try:
        manifest = load_manifest(args.file)
    except ManifestError as exc:
        return fail("apply", str(exc))
    client = LocalClient.find(args.state_dir)
    if client is None:
        return fail(
            "apply",
            f"no running `folio up` uses the state folder {args.state_dir!r}; start one with `folio up {args.file}` "
            "(for a cluster, use kubectl apply)",
        )
    try:
        result = client.apply(manifest.model_dump(mode="json", by_alias=True, exclude_none=True))
    except ControlError as exc:
        return fail("apply", str(exc))
    if result["changed"]:
        print(
            f"inferenceservice/{manifest.name} configured (revision {result['revision']}, generation {result['generation']})"
        )
    else:
        print(f"inferenceservice/{manifest.name} unchanged (revision {result['revision']})")
    return 0
