"""The router disconnects slow-loris clients (header and body read timeouts) and keeps serving."""

from __future__ import annotations

from folio.engine.server.read_timeouts import ReadTimeouts
from folio.operator.router.app import RouterApp
from folio.operator.router.server import running_router
from folio.operator.router.sources import InProcessSource
from folio.operator.serving.router import RouterConfig
from tests.router.upstreams import FakeUpstream, serving
from tests.server.test_read_timeouts import check_slow_clients_are_cut


async def test_router_closes_slow_clients() -> None:
    up = FakeUpstream("r1")
    async with serving(up):
        source = InProcessSource(RouterConfig.parse({"traffic": [{"revision": "r1", "weight": 100}],
                                                     "endpoints": {"r1": [up.url]}}))
        app = RouterApp("chat", source, health_interval=3600.0)
        async with running_router(app, read_timeouts=ReadTimeouts(header_s=1.5, body_s=2.0)) as url:
            await check_slow_clients_are_cut(url, 1.5, 2.0, path="/v1/completions",
                                             json={"model": "m", "prompt": "hi"})
    assert len([s for s in up.seen if s.body]) >= 5  # the normal requests went through to the engine


def test_cli_refuses_a_non_positive_timeout(capsys) -> None:  # type: ignore[no-untyped-def]
    import argparse

    from folio.operator.router import cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--name", "chat", "--config", "/nonexistent.json", "--header-timeout", "0"])
    assert cli.main(args) == 2
    assert "must be > 0" in capsys.readouterr().err
