"""`folio apply FILE.yaml`: change a running local InferenceService (a new revision starts a canary)."""

from __future__ import annotations

import argparse

from folio.operator.local.target import add_state_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="InferenceService YAML")
    add_state_dir(parser)


def main(args: argparse.Namespace) -> int:
    from folio.operator.local.client import ControlError, LocalClient
    from folio.operator.local.manifest import ManifestError, read_manifest
    from folio.operator.local.target import fail
    from folio.operator.serving.validate import THIS_MACHINE, parse_manifest

    try:
        doc = read_manifest(args.file)
    except ManifestError as exc:
        return fail("apply", str(exc))
    manifest, problems = parse_manifest(doc, THIS_MACHINE)  # what the running `folio up` checks too
    if problems or manifest is None:
        for problem in problems:
            fail("apply", str(problem))
        return 1
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
        for line in str(exc).splitlines() or [""]:  # one line per problem
            fail("apply", line)
        return 1
    if result["changed"]:
        print(
            f"inferenceservice/{manifest.name} configured (revision {result['revision']}, generation {result['generation']})"
        )
    else:
        print(f"inferenceservice/{manifest.name} unchanged (revision {result['revision']})")
    return 0
