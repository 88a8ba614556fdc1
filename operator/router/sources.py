"""Where the router's config comes from. A source runs for the router's lifetime and calls
`apply(config)` whenever the config changes; the Kubernetes source lives in `kube.py`.

`folio up` runs its router as a process of its own that follows a file (`FileSource`), which it
rewrites whenever the config its serving plan gives changes.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from folio.operator.serving.router import ConfigError, RouterConfig

log = logging.getLogger(__name__)

Apply = Callable[[RouterConfig], None]


class ConfigSource(Protocol):
    async def run(self, apply: Apply) -> None:
        """Deliver the current config, then every change, until cancelled."""
        ...


class FileSource:
    """A JSON file, re-read when its mtime, size or inode changes (a stat per poll: cheap).

    A file that does not parse is reported and skipped; the last good config stays in force, and
    the file is read again on the next poll in case it was caught half-written.
    """

    def __init__(self, path: str | Path, interval: float = 0.2) -> None:
        self.path = Path(path)
        self.interval = interval

    async def run(self, apply: Apply) -> None:
        seen: tuple[int, int, int] | None = None
        reported = ""
        while True:
            try:
                st = os.stat(self.path)
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
                if stamp != seen:
                    apply(RouterConfig.parse(self.path.read_bytes()))
                    seen, reported = stamp, ""
            except (OSError, ConfigError) as exc:
                message = f"router config {self.path}: {exc}"
                if message != reported:  # once per distinct problem, not every poll
                    log.error("%s (keeping the last good config)", message)
                    reported = message
            await asyncio.sleep(self.interval)


class InProcessSource:
    """A config handed over by code on the router's event loop (tests, benchmarks, any embedder).

    `set()` applies at once once the router runs, so the very next request follows it.
    """

    def __init__(self, config: RouterConfig | None = None) -> None:
        self._config = config
        self._apply: Apply | None = None

    def set(self, config: RouterConfig) -> None:
        self._config = config
        if self._apply is not None:
            self._apply(config)

    async def run(self, apply: Apply) -> None:
        self._apply = apply
        try:
            if self._config is not None:
                apply(self._config)
            await asyncio.Event().wait()  # nothing to poll: set() does the work
        finally:
            self._apply = None
