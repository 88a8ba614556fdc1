"""The operator's kmock fixtures."""

from __future__ import annotations

import kmock
import pytest

from tests.operator.harness import Cluster, declare_resources


@pytest.fixture()
def cluster(kmock: kmock.KubernetesEmulator) -> Cluster:
    declare_resources(kmock)
    return Cluster(kmock)
