from __future__ import annotations

import json

import pytest

from folio.operator.serving.router import ConfigError, RouterConfig

EXAMPLE = """{"traffic": [{"revision": "r1", "weight": 90}, {"revision": "r2", "weight": 10}],
  "endpoints": {"r1": ["http://127.0.0.1:9001/"], "r2": ["http://127.0.0.1:9002"]},
  "overflow": {"url": "https://api.example.com/v1", "apiKey": "sk"},
  "shadow": {"percent": 5}, "apiKeys": ["k"], "futureField": 1}"""


def test_documented_example_parses() -> None:
    cfg = RouterConfig.parse(EXAMPLE)
    assert [(t.revision, t.weight) for t in cfg.traffic] == [("r1", 90), ("r2", 10)]
    assert cfg.endpoints == {"r1": ["http://127.0.0.1:9001"], "r2": ["http://127.0.0.1:9002"]}
    assert cfg.stable is None and cfg.canary is None  # roles come from status only, never from the weights
    assert cfg.overflow is not None and cfg.overflow.url == "https://api.example.com"
    assert cfg.overflow.api_key == "sk"
    assert cfg.shadow_fraction == 0.05
    assert cfg.api_keys == ["k"]


def test_wire_form_round_trips() -> None:
    cfg = RouterConfig.parse(EXAMPLE)
    wire = json.dumps(cfg.to_wire(), separators=(",", ":"))
    assert RouterConfig.parse(wire) == cfg
    assert '"apiKey":"sk"' in wire and '"apiKeys":["k"]' in wire


def test_the_fingerprint_follows_the_content_not_the_spelling() -> None:
    cfg = RouterConfig.parse(EXAMPLE)
    respelled = json.dumps(dict(reversed(list(json.loads(EXAMPLE).items()))), indent=2)
    assert RouterConfig.parse(respelled).fingerprint() == cfg.fingerprint()  # key order, spacing, ignored keys
    assert RouterConfig.parse(json.dumps(cfg.to_wire())).fingerprint() == cfg.fingerprint()
    moved = EXAMPLE.replace('"weight": 90', '"weight": 80').replace('"weight": 10', '"weight": 20')
    assert RouterConfig.parse(moved).fingerprint() != cfg.fingerprint()


def test_roles_are_what_the_config_names() -> None:
    traffic = [{"revision": "a", "weight": 30}, {"revision": "b", "weight": 70}]
    cfg = RouterConfig.parse({"traffic": traffic, "stable": "a", "canary": "b"})
    assert cfg.stable == "a" and cfg.canary == "b"
    # no guess from the weights: b carries the most, yet without "stable" nothing is the retry target
    assert RouterConfig.parse({"traffic": traffic}).stable is None
    assert RouterConfig.parse({"traffic": traffic, "stable": "a"}).canary is None
    assert RouterConfig().stable is None and RouterConfig().canary is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"traffic": [{"revision": "a", "weight": 101}]}', "traffic.0.weight"),
        ('{"traffic": [{"revision": "a", "weight": 1}, {"revision": "a", "weight": 2}]}', "each revision once"),
        ('{"endpoints": {"a": ["127.0.0.1:9000"]}}', "must start with http://"),
        ('{"traffic": "a"}', "traffic"),
    ],
)
def test_bad_configs_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="router config") as info:
        RouterConfig.parse(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("part", "fragment"),
    [({"overflow": {"url": "ftp://x"}}, "overflow ignored: overflow.url"),
     ({"overflow": {"url": "api.example.com"}}, "overflow ignored"),
     ({"shadow": {"percent": -1}}, "shadow ignored: shadow.percent"),
     ({"requestTimeout": "0s"}, "requestTimeout ignored: requestTimeout: Value error, the duration must be positive"),
     ({"requestTimeout": "soon"}, "requestTimeout ignored")],
)
def test_a_bad_optional_part_is_dropped_and_reported_not_fatal(part: dict, fragment: str) -> None:
    base = {"traffic": [{"revision": "r1", "weight": 100}], "endpoints": {"r1": ["http://127.0.0.1:9001"]}}
    cfg = RouterConfig.parse({**base, **part})
    assert [t.revision for t in cfg.traffic] == ["r1"] and cfg.endpoints == base["endpoints"]
    assert cfg.overflow is None and cfg.shadow is None and cfg.request_timeout_seconds == 60.0
    assert len(cfg.problems) == 1 and fragment in cfg.problems[0]
    assert "problems" not in cfg.to_wire()


def test_a_bad_required_part_still_refuses_the_config() -> None:
    with pytest.raises(ConfigError, match=r"traffic\.0\.weight"):
        RouterConfig.parse({"traffic": [{"revision": "a", "weight": 101}], "overflow": {"url": "ftp://x"}})
