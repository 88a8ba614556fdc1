"""The chart's alert rules: valid for Prometheus (`promtool check rules`), firing when and only when they
should (`promtool test rules` over tests/chart/alert_tests.yaml), reading only series Folio exports, and each
linked to its runbook section."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.chart import helm as h
from tests.chart.conftest import MATCHER, METRIC_NAME, SUM_BY
from tests.support.tools import find_tool

FIXTURES = Path(__file__).with_name("alert_tests.yaml")
RUNBOOKS = h.REPO / "docs" / "runbooks.md"


@pytest.fixture(scope="module")
def promtool() -> str:
    return find_tool("promtool")


@pytest.fixture(scope="module")
def rule() -> h.Obj:
    helm = h.find_helm()
    assert helm, "helm not found: `make tools` installs it"
    return h.one(h.template(helm, {"alerts": {"enabled": True}}), "PrometheusRule")


def _rules(rule: h.Obj) -> list[dict]:
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def _promtool(promtool: str, *args: str, cwd: Path) -> str:
    proc = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_rules_are_valid_and_each_alert_fires_as_its_fixture_says(promtool: str, rule: h.Obj, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    shutil.copy(FIXTURES, tmp_path / "tests.yaml")
    checked = _promtool(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert f"{len(_rules(rule))} rules found" in checked
    _promtool(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)


def test_every_alert_has_a_firing_fixture(rule: h.Obj) -> None:
    tests = yaml.safe_load(FIXTURES.read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]}
    names = [r["alert"] for r in _rules(rule)]
    assert len(names) >= 10 and len(set(names)) == len(names)
    assert set(names) == fired


def test_every_alert_links_to_its_runbook_section(rule: h.Obj) -> None:
    # GitHub's anchors: the heading in lower case
    anchors = {m.lower() for m in re.findall(r"^## (\S+)$", RUNBOOKS.read_text(), re.M)}
    for r in _rules(rule):
        url = r["annotations"]["runbook_url"]
        assert url.startswith("https://") and url.endswith("#" + r["alert"].lower()), url
        assert r["alert"].lower() in anchors, f"docs/runbooks.md has no section for {r['alert']}"
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"] and r["annotations"]["description"]


def test_alerts_read_only_series_and_labels_folio_exports(rule: h.Obj, series: dict[str, set[str]]) -> None:
    for r in _rules(rule):
        expr = r["expr"]
        for name, matchers in METRIC_NAME.findall(expr):
            assert name in series, f"{r['alert']}: {name} is not exported by Folio"
            for label in MATCHER.findall(matchers):
                assert label in series[name], f"{r['alert']}: {name} has no label {label!r}"
            for group in SUM_BY.findall(expr):
                for label in (x.strip() for x in group.split(",")):
                    assert label in series[name] | {"le"}, f"{r['alert']}: {name} has no label {label!r}"


def test_thresholds_and_labels_come_from_values(helm: str) -> None:
    values = {"alerts": {"enabled": True, "labels": {"release": "prometheus"}, "additionalLabels": {"team": "ml"},
                         "thresholds": {"kvCacheUsage": 0.8}, "for": {"kvCache": "15m"},
                         "runbookBaseUrl": "https://wiki.example/folio"}}  # fmt: skip
    objects = h.template(helm, values)
    rule = h.one(objects, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    kv = next(r for r in _rules(rule) if r["alert"] == "FolioEngineKVCacheNearlyFull")
    assert kv["expr"].strip().endswith("> 0.8") and kv["for"] == "15m"
    assert kv["annotations"]["runbook_url"] == "https://wiki.example/folio#folioenginekvcachenearlyfull"
    assert all(r["labels"]["team"] == "ml" for r in _rules(rule))
    with pytest.raises(h.HelmError, match="kvCacheUsage"):
        h.template(helm, {"alerts": {"enabled": True, "thresholds": {"kvCacheUsage": 95}}})
    assert not h.find(h.template(helm, {}), "PrometheusRule")
