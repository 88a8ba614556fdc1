"""The chart's own pods (the operator, the `helm test` Pod) pass Pod Security "restricted"."""

from __future__ import annotations

import pytest

from tests.chart import helm as h
from tests.chart.conftest import VALUE_SETS
from tests.support.pss import hardening_gaps, pod_specs, violations


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_rendered_pod_is_restricted(rendered: dict[str, list[h.Obj]], name: str) -> None:
    pods = [(o["kind"], o["metadata"]["name"], p) for o in rendered[name] for p in pod_specs(o)]
    assert pods, "no pod rendered"
    for kind, obj_name, pod in pods:
        assert violations(pod) == [], (kind, obj_name)
        assert hardening_gaps(pod) == [], (kind, obj_name)


def test_the_test_pod_is_covered(rendered: dict[str, list[h.Obj]]) -> None:
    kinds = {o["kind"] for o in rendered["observability"] if pod_specs(o)}
    assert kinds == {"Deployment", "Pod"}
    (pod,) = [p for o in rendered["observability"] if o["kind"] == "Pod" for p in pod_specs(o)]
    assert pod["automountServiceAccountToken"] is False  # it only talks to the router
