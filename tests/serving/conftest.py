"""Serving-plan fixtures."""

from __future__ import annotations

import pytest

from folio.operator.spec import InferenceServiceSpec
from tests.serving.helpers import make_spec


@pytest.fixture()
def spec() -> InferenceServiceSpec:
    return make_spec()
