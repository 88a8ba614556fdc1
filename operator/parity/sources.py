"""Where a parity gate's suite and replicas come from: the default suite, a file (`folio up`'s
``suiteFile``) or a ConfigMap (``configMapRef``, in a cluster). Each loader raises `SuiteError` saying
what is wrong, which the gate reports as its Degraded reason."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from folio.operator.parity.suite import SuiteError, SuitePrompt, default_suite, parse_suite
from folio.operator.spec import ParitySpec

MAX_SUITE_BYTES = 64 << 20


async def local_suite(spec: ParitySpec) -> list[SuitePrompt]:
    """`folio up`: ``suiteFile``, else the default suite; a ConfigMap needs a cluster."""
    if spec.config_map_ref is not None:
        raise SuiteError("configMapRef needs a cluster; `folio up` reads a suite from suiteFile")
    if spec.suite_file is None:
        return default_suite(spec.prompts)
    path = Path(spec.suite_file).expanduser()
    try:
        if path.stat().st_size > MAX_SUITE_BYTES:
            raise SuiteError(f"suiteFile {path} is larger than {MAX_SUITE_BYTES >> 20} MiB")
        text = await asyncio.to_thread(path.read_text, encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteError(f"suiteFile {path} cannot be read: {exc}") from None
    return parse_suite(text, f"suiteFile {path}")


def cluster_suite(
    spec: ParitySpec, namespace: str, get: Callable[[str, str, str, str], Awaitable[dict[str, Any] | None]]
) -> Callable[[], Awaitable[list[SuitePrompt]]]:
    """In a cluster: the ConfigMap's key, else the default suite. ``get`` reads an object (None: absent)."""

    async def load() -> list[SuitePrompt]:
        ref = spec.config_map_ref
        if spec.suite_file is not None and ref is None:
            raise SuiteError("suiteFile is for `folio up`; in a cluster put the suite in a ConfigMap (configMapRef)")
        if ref is None:
            return default_suite(spec.prompts)
        cm = await get("v1", "ConfigMap", namespace, ref.name)
        if cm is None:
            raise SuiteError(f"ConfigMap {namespace}/{ref.name} not found")
        text = (cm.get("data") or {}).get(ref.key)
        if text is None:
            raise SuiteError(f"ConfigMap {namespace}/{ref.name} has no key {ref.key!r}")
        return parse_suite(text, f"ConfigMap {ref.name} key {ref.key}")

    return load
