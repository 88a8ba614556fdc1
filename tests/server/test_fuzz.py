"""Property-based fuzzing of the OpenAPI schema (schemathesis): valid and invalid requests alike must
never produce a 5xx."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode

from folio.engine.server.app import build_app
from folio.engine.server.serving import ServingConfig
from tests.server.conftest import Running, serving_fake
from tests.server.fake_engine import FakeEngine


def _engine() -> FakeEngine:
    return FakeEngine(step_delay=0, max_model_len=64, num_blocks=4096)


# The schema comes from the app itself (no server needed at collection); requests go to a live one.
schema = schemathesis.openapi.from_dict(
    build_app(_engine(), ServingConfig(served_model_name="fake", model_path="/m", max_model_len=64)).openapi()
)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


@pytest.fixture(scope="module")
def server() -> Iterator[Running]:
    with serving_fake(engine=_engine()) as running:
        yield running


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_makes_a_server_error(case: schemathesis.Case, server: Running) -> None:
    response = case.call(base_url=server.url, timeout=30)
    assert response.status_code < 500, response.text
