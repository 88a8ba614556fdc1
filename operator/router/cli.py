"""`folio router`: the traffic router for one InferenceService.

Locally it follows a JSON config file (`--config`, re-read when it changes); in a cluster
(`--kubernetes`) it watches the InferenceService's status and its revisions' EndpointSlices.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from folio.engine.rules import DEFAULT_MAX_REQUEST_BODY_BYTES
from folio.engine.server.read_timeouts import DEFAULT_BODY_S, DEFAULT_HEADER_S, ReadTimeouts
from folio.operator.k8s.names import ROUTER_PORT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, help="the InferenceService this router fronts")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--config", metavar="FILE", help="JSON traffic/endpoints config, re-read when it changes"
    )
    where.add_argument("--kubernetes", action="store_true", help="follow the InferenceService in the cluster")
    parser.add_argument(
        "--namespace",
        help="with --kubernetes: the InferenceService's namespace (default: the pod's own namespace)",
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1; 0.0.0.0 with --kubernetes)")
    parser.add_argument("--port", type=int, default=ROUTER_PORT, help=f"port to listen on (default {ROUTER_PORT})")
    parser.add_argument(
        "--api-keys-file",
        metavar="FILE",
        help="require 'Authorization: Bearer KEY' with one of the keys in FILE (one per line)",
    )
    parser.add_argument(
        "--secrets-dir",
        metavar="DIR",
        help="with --config: Secrets as Kubernetes mounts them (DIR/NAME/KEY), where the API keys' Secret of "
        "spec.access is read from (with --kubernetes it is read through the API)",
    )
    parser.add_argument(
        "--health-path", default="/health", help="replica health check path (default /health)"
    )
    parser.add_argument("--health-interval", type=float, default=2.0, help="seconds between health checks")
    parser.add_argument(
        "--upstream-timeout",
        type=float,
        default=600.0,
        help="seconds an upstream may take to its first byte, and then between chunks; a canary gets "
        "requestTimeout from the config when that is shorter (default 600)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_S,
        help="seconds a client has to send a request's headers before it is disconnected (default %(default)s)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_S,
        help="seconds a client has to send a request's body after its headers (default %(default)s)",
    )
    parser.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="answer 413 to a request body larger than this; the same default as `folio serve`'s, so the "
        "router refuses nothing an engine would serve (default %(default)s, 32 MiB)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def main(args: argparse.Namespace) -> int:
    from folio.operator.router.app import RouterApp
    from folio.operator.router.auth import read_keys_file
    from folio.operator.router.secrets import FolderSecrets, SecretReader
    from folio.operator.router.server import bind, serve_until_signalled
    from folio.operator.router.sources import ConfigSource, FileSource

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        read_timeouts = ReadTimeouts(header_s=args.header_timeout, body_s=args.body_timeout)
    except ValueError as exc:
        print(f"folio router: {exc}", file=sys.stderr)
        return 2
    if args.max_request_body_bytes < 1:
        limit = args.max_request_body_bytes
        print(f"folio router: --max-request-body-bytes must be >= 1, got {limit}", file=sys.stderr)
        return 2
    keys: list[str] = []
    if args.api_keys_file:
        try:
            keys = read_keys_file(args.api_keys_file)
        except OSError as exc:
            print(f"folio router: cannot read --api-keys-file: {exc}", file=sys.stderr)
            return 2
        if not keys:
            print(f"folio router: {args.api_keys_file} holds no API key", file=sys.stderr)
            return 2

    source: ConfigSource
    secrets: SecretReader | None = None
    if args.kubernetes:
        from folio.operator.k8s.client import AsyncKube
        from folio.operator.k8s.names import namespace_in_pod
        from folio.operator.router.kube import KubernetesSource

        namespace = args.namespace or namespace_in_pod()
        if not namespace:
            print("folio router: --namespace is required outside a pod", file=sys.stderr)
            return 2
        try:
            api = AsyncKube.from_environment()
        except Exception as exc:  # kubernetes.config raises several kinds; all mean "no credentials"
            print(
                f"folio router: no Kubernetes credentials (in-cluster or kubeconfig): {exc}", file=sys.stderr
            )
            return 2
        source = KubernetesSource(args.name, namespace, api)
        secrets = source
        host = args.host or "0.0.0.0"
    else:
        if not os.path.exists(args.config):
            logging.getLogger("folio.router").warning("%s does not exist yet; waiting for it", args.config)
        source = FileSource(args.config)
        secrets = FolderSecrets(args.secrets_dir) if args.secrets_dir else None
        host = args.host or "127.0.0.1"

    app = RouterApp(
        args.name,
        source,
        api_keys=keys,
        secrets=secrets,
        health_path=args.health_path,
        health_interval=args.health_interval,
        read_timeout=args.upstream_timeout,
        max_body_bytes=args.max_request_body_bytes,
    )
    try:
        sock = bind(host, args.port)
    except OSError as exc:
        print(f"folio router: cannot listen on {host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    logging.getLogger("folio.router").info("router for %s listening on %s:%d", args.name, host, args.port)
    asyncio.run(serve_until_signalled(app, sock, read_timeouts=read_timeouts))
    return 0
