"""Where a router reads the API keys' Secret (``spec.access.apiKeysSecretRef``) from, and follows it.

In a cluster, the API: a list-then-watch of that one Secret (its Role may get, list and watch that name
only), so a rotated key works as soon as the Secret changes. In `folio up`, a folder in the layout
Kubernetes mounts Secrets in, ``DIR/NAME/KEY`` (`folio up --secrets-dir`), read again every second.
Each delivers the Secret's keys as tenant -> keys (`tenants.parse_secret`), or None while it is missing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from folio.operator.router.tenants import parse_secret

log = logging.getLogger(__name__)

Deliver = Callable[[dict[str, list[str]] | None], None]


class SecretReader(Protocol):
    async def follow(self, name: str, deliver: Deliver) -> None:
        """Deliver Secret ``name``'s keys now and at every change, until cancelled."""
        ...


class FolderSecrets:
    """Secrets as files: ``root/NAME/KEY`` holds key KEY of Secret NAME (dot-files, as a mounted Secret's
    ``..data``, are not keys)."""

    def __init__(self, root: str | Path, interval: float = 1.0) -> None:
        self.root = Path(root)
        self.interval = interval

    def read(self, name: str) -> dict[str, list[str]] | None:
        folder = self.root / name
        if not folder.is_dir():
            return None
        data = {}
        for file in sorted(folder.iterdir()):
            if file.name.startswith(".") or not file.is_file():
                continue
            try:
                data[file.name] = file.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                log.error("cannot read API keys from %s: %s", file, exc)
        return parse_secret(data)

    def stamp(self, name: str) -> tuple[tuple[str, int, int, int], ...] | None:
        """What changes when a key file is written, added or removed (a stat each: cheaper than reading)."""
        try:
            with os.scandir(self.root / name) as entries:
                return tuple(sorted((e.name, (st := e.stat()).st_mtime_ns, st.st_size, st.st_ino) for e in entries))
        except OSError:
            return None

    async def follow(self, name: str, deliver: Deliver) -> None:
        last: object = object()
        seen: object = object()
        while True:
            # On the loop, not in a thread: a stat takes a microsecond or two, while a thread would take and
            # give back the GIL around each one, against the requests' handling, every second.
            stamp = self.stamp(name)
            if stamp != seen:  # (a missing folder too: its stamp is None)
                seen = stamp
                keys = await asyncio.to_thread(self.read, name)
                if keys != last:
                    deliver(keys)
                    last = keys
            await asyncio.sleep(self.interval)


def decode_secret(obj: dict[str, Any]) -> dict[str, list[str]]:
    """A Secret object's keys (``data`` is base64; ``stringData`` never comes back from the API)."""
    data = {}
    for key, value in (obj.get("data") or {}).items():
        try:
            data[key] = base64.b64decode(value or "", validate=True).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError):
            log.error("key %r of Secret %r is not base64-encoded UTF-8 text: skipped", key,
                      (obj.get("metadata") or {}).get("name"))  # fmt: skip
    return parse_secret(data)
