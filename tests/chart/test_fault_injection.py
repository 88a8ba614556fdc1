"""`faultInjection.enabled` passes `--allow-fault-injection` to the operator; off by default."""

from __future__ import annotations

import pytest

from folio.operator.cli import build_parser
from folio.operator.controller import cli
from tests.chart import helm as h


def _operator_args(helm: str, values: h.Obj) -> list[str]:
    objects = h.template(helm, values)
    return list(h.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"])


@pytest.mark.parametrize(("values", "allowed"), [
    ({}, False),
    ({"faultInjection": {"enabled": False}}, False),
    ({"faultInjection": {"enabled": True}}, True),
])  # fmt: skip
def test_fault_injection_value_renders_the_flag(helm: str, values: h.Obj, allowed: bool) -> None:
    h.lint(helm, values)
    args = _operator_args(helm, values)
    assert ("--allow-fault-injection" in args) is allowed, args
    parsed = build_parser().parse_args(args)  # the real `folio` parser accepts what the chart renders
    assert parsed.allow_fault_injection is allowed
    assert cli.site(parsed).fault_injection is allowed


def test_fault_injection_value_is_a_boolean(helm: str) -> None:
    with pytest.raises(h.HelmError):
        h.template(helm, {"faultInjection": {"enabled": "yes"}})
    with pytest.raises(h.HelmError):
        h.template(helm, {"faultInjection": {"enable": True}})  # a typo is refused, not ignored
