"""Router test fixtures: a router in the test's event loop, fed by an in-process config source."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest

from folio.operator import metric_names as m
from folio.operator.router.app import RouterApp
from folio.operator.router.server import running_router
from folio.operator.router.sources import ConfigSource, InProcessSource
from folio.operator.serving.router import RouterConfig


class RouterUnderTest:
    def __init__(self, app: RouterApp, url: str, client: httpx.AsyncClient, source: ConfigSource) -> None:
        self.app, self.url, self.client, self.source = app, url, client, source

    def set(self, **config: Any) -> None:
        assert isinstance(self.source, InProcessSource)
        self.source.set(RouterConfig.parse(config))

    def metric(self, name: str, **labels: str) -> float:
        """One series' value; the base model's (no adapter) unless ``adapter`` and ``adapter_revision`` say."""
        if name.startswith((m.REQUESTS, m.DURATION, m.TTFT)):
            labels = {m.ADAPTER: "", m.ADAPTER_REVISION: "", **labels}
        value = self.app.metrics.registry.get_sample_value(name, {"isvc": "chat", **labels})
        return value or 0.0

    async def complete(self, stream: bool = False, prompt: str = "hi", **headers: str) -> httpx.Response:
        return await self.client.post(
            "/v1/completions", json={"model": "m", "prompt": prompt, "stream": stream}, headers=headers
        )


RouterFactory = Callable[..., AbstractAsyncContextManager[RouterUnderTest]]


@pytest.fixture
def router() -> RouterFactory:
    """`async with router(traffic=..., endpoints=...) as r:` runs a router for that config."""

    @asynccontextmanager
    async def start(
        source: ConfigSource | None = None, app_options: dict[str, Any] | None = None, **config: Any
    ) -> AsyncIterator[RouterUnderTest]:
        source = source or InProcessSource(RouterConfig.parse(config))
        app = RouterApp("chat", source, **{"health_interval": 3600.0, **(app_options or {})})
        async with running_router(app) as url, httpx.AsyncClient(base_url=url, timeout=10.0) as client:
            yield RouterUnderTest(app, url, client, source)

    return start
