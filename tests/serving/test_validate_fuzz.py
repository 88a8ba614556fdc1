"""Fuzzed manifests through every gate: each is accepted or refused with one line per problem naming its
field, never a traceback, with the same verdict in a cluster and on this machine (but for the sites' own
rules, `folio.operator.serving.validate.Site`).

Manifests are drawn from the generated CRD's schema (crds/, with strategies of our own: the CEL rules
are not in them, so a few parts are repaired to give valid specs often enough), then mutated: wrong
types, extreme and non-finite numbers, odd Unicode, markup-like strings ("[/]", "[bold]", "[/?#]"), URLs
of every scheme in the model source, the overflow URL and Prometheus', unknown and missing fields. Each
goes through (a) `validate` for both sites, (b) the operator's planner and object rendering when the
cluster's verdict is valid, (c) `folio up --dry-run` in process, on a rich console writing to a string,
and (d) `folio apply`'s check, the control endpoint's /v1/apply.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from rich.console import Console

from folio.operator.local.control import build_app
from folio.operator.local.up import run_up
from folio.operator.rollout import Observed, RevisionFacts, advance
from folio.operator.serving.engine import OPERATOR_FLAGS, engine_flags_table
from folio.operator.serving.objects import Owner, PlanSettings, objects
from folio.operator.serving.plan import Placement, plan
from folio.operator.serving.validate import (
    CLUSTER,
    FAULT_ARGS,
    FAULT_INJECTION_DISABLED,
    SITE_REASONS,
    THIS_MACHINE,
    UNSUPPORTED_HERE,
    Problem,
    parse,
    parse_manifest,
)
from folio.operator.spec import InferenceService, InferenceServiceSpec, InferenceServiceStatus, revision_name

CRD = Path(__file__).parents[2] / "crds" / "serving.folio.dev_inferenceservices.yaml"
SPEC_SCHEMA = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "ab" * 32
NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)
# The fields the sites' own rules are about (the table in validate's docstring): nothing else may differ.
SITE_FIELDS = {"spec.model.source", "spec.replicas", "spec.autoscaling.maxReplicas", "spec.rollout.parity.configMapRef",
               "spec.rollout.parity.suiteFile", *(f"spec.engine.args.{key}" for key in FAULT_ARGS)}  # fmt: skip

# Text that is valid UTF-8 (YAML and JSON carry it), with the odd parts of Unicode.
TEXT = st.characters(codec="utf-8")
ODD = ["", " ", "\t", "\n", "\r\n", "\x00", "\x1b[31m", "\u202e", "\u2028", "\ufeff", "é", "ﬀ", "İ", "🙂", "a" * 300,
       "[/]", "[bold]", "[/?#]", "[red]x[/red]", "[link=http://x]y[/link]", "\\[", "[", "]", ":smile:", "%s", "{0}"]
SCHEMES = ["http", "https", "HTTP", "ftp", "file", "hf", "pvc", "s3", "gs", "javascript", "data", "ws", "", "[bold]"]
URLS = st.one_of(
    st.builds(lambda s, rest: f"{s}://{rest}", st.sampled_from(SCHEMES),
              st.sampled_from(["x", "host:8080/v1", "[/?#]", "a b", "user@host/p", "", "/", "/abs/path", "[::1]:99",
                               "host:99999", "h/" + "p" * 3000, "claim/", "org/name"])),
    st.sampled_from(["http://", "https://", "//host", "host", "http:/x", "file:///", "file://host/m", "pvc://c"]),
)  # fmt: skip
DURATIONS = st.sampled_from(["0s", "0ms", "1ms", "30s", "1.5h", "8784h", "8785h", "9" * 400 + "h", "1e3s", "-1s",
                             "1h30m", "2m", "s", "100000000000000000000h"])  # fmt: skip
NUMBERS = st.one_of(
    st.sampled_from([0, -1, 1, 2, 16, 17, 511, 512, 513, 2**31, 2**63, 10**30, -(10**30), 0.5, 1e-300, 1e308,
                     math.inf, -math.inf, math.nan, -0.0, True, False]),
    st.integers(), st.floats(),
)  # fmt: skip
NASTY = st.one_of(
    NUMBERS, URLS, DURATIONS, st.sampled_from(ODD), st.text(TEXT, max_size=12),
    st.sampled_from([None, [], {}, [1, "a"], {"a": 1}, {"name": "[bold]"}]),
)  # fmt: skip
MODELS = [
    {"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct", "revision": COMMIT},
    {"source": "hf://org/name", "revision": COMMIT, "digest": DIGEST, "servedName": "[bold]chat[/]"},
    {"source": "file:///models/m.gguf", "digest": DIGEST},
    {"source": "file:///models/[/?#]/weights", "digest": DIGEST},
    {"source": "file://elsewhere/m", "digest": DIGEST},
    {"source": "file://[::1/m", "digest": DIGEST},
    {"source": "file:///", "digest": DIGEST},
    {"source": "pvc://claim/models/m", "digest": DIGEST},
    {"source": "pvc://claim/", "digest": DIGEST},
    {"source": "hf://org/name", "revision": "main"},
]
GOOD_NAMES = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z")
NAMES = st.one_of(st.just("chat"), GOOD_NAMES, st.sampled_from(["", "Chat", "a" * 45, "[bold]", "[/?#]", "../x"]),
                  st.text(TEXT, max_size=8), st.integers())  # fmt: skip


# --------------------------------------------------------------------- manifests from the CRD


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values the CRD's OpenAPI schema accepts (its structural part: types, properties, bounds, patterns)."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([from_schema(s) for s in schema["anyOf"]])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties")
        if props:
            required = set(schema.get("required", ()))
            return st.fixed_dictionaries(
                {k: from_schema(v) for k, v in props.items() if k in required},
                optional={k: from_schema(v) for k, v in props.items() if k not in required},
            )
        values = from_schema(schema["additionalProperties"]) if "additionalProperties" in schema else SCALARS
        return st.dictionaries(st.text(TEXT, min_size=1, max_size=12), values, max_size=3)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), max_size=min(schema.get("maxItems", 4), 4))
    if kind == "string":
        low, high = schema.get("minLength", 0), min(schema.get("maxLength", 24), 24)
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True, alphabet=TEXT).filter(lambda s: low <= len(s))
        return st.text(TEXT, min_size=low, max_size=max(low, high))
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), exclude_min=schema.get("exclusiveMinimum") is True,
                         allow_nan=False, allow_infinity=False)  # fmt: skip
    if kind == "boolean":
        return st.booleans()
    return SCALARS


SCALARS = st.one_of(st.integers(-5, 5), st.booleans(), st.text(TEXT, max_size=8), st.floats(allow_nan=False))


def engine_args() -> st.SearchStrategy[dict[str, Any]]:
    """spec.engine.args (the CRD keeps any): `folio serve`'s flags with values of their type and others."""
    table = engine_flags_table()
    typed = {"int": st.integers(-2, 70000), "float": st.floats(-1, 2, allow_nan=False), "bool": st.booleans(),
             "switch": st.booleans(), "str": st.text(TEXT, max_size=6),
             # a flag taking JSON (--speculative-config): an object, good or not, or its text
             "json": st.one_of(st.just({"method": "ngram", "num_speculative_tokens": 3}), st.text(TEXT, max_size=6),
                               st.dictionaries(st.sampled_from(["method", "num_speculative_tokens", "model", "x"]),
                                               SCALARS, max_size=3))}  # fmt: skip

    def value(key: str) -> st.SearchStrategy[Any]:
        flag = table.get(key)
        if flag is None:
            return SCALARS
        good = st.sampled_from(flag.choices) if flag.choices else typed[flag.kind]
        return st.one_of(good, good, SCALARS)

    keys = st.sampled_from([*sorted(table), "bogus", "[bold]", *sorted(OPERATOR_FLAGS)])
    return keys.flatmap(lambda k: st.tuples(st.just(k), value(k))).map(lambda kv: [kv]).flatmap(
        lambda first: st.lists(keys.flatmap(lambda k: st.tuples(st.just(k), value(k))), max_size=3).map(
            lambda more: dict(first + more)))  # fmt: skip


FROM_CRD = from_schema(SPEC_SCHEMA)
ENGINE_ARGS = engine_args()


@st.composite
def crd_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec from the CRD's schema; mostly with its CEL rules' parts repaired, so that many are valid."""
    spec = draw(FROM_CRD)
    if draw(st.integers(0, 9)) < 8:
        spec["model"] = dict(draw(st.sampled_from(MODELS)))
        steps = spec.get("rollout", {}).get("steps")
        if steps:
            weights = sorted({s["weight"] for s in steps})
            spec["rollout"]["steps"] = [{**s, "weight": w} for s, w in zip(steps, weights, strict=False)]
        auto = spec.get("autoscaling")
        if auto and auto.get("minReplicas", 1) > auto.get("maxReplicas", 8):
            auto["minReplicas"], auto["maxReplicas"] = auto.get("maxReplicas", 8), auto.get("minReplicas", 1)
        if auto and auto.get("metric") == "KVCache" and auto.get("target", 0) > 1:
            auto["target"] = 0.5
        if draw(st.booleans()):  # what one machine runs, too
            spec["replicas"] = spec.get("replicas", 1) % 17
            if auto:
                auto["maxReplicas"] = max(1, auto.get("maxReplicas", 8) % 17)
                auto["minReplicas"] = min(auto.get("minReplicas", 1), auto["maxReplicas"])
    if draw(st.booleans()):
        spec.setdefault("engine", {})["args"] = draw(ENGINE_ARGS)
    elif "engine" in spec:
        spec["engine"].pop("args", None)
    return spec


def paths(value: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a document (the root's children and down)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*here, k)
            yield from paths(v, (*here, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*here, i)
            yield from paths(v, (*here, i))


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """``base`` with one to three places set to something nasty, removed, or given an unknown key."""
    doc = draw(base)
    for _ in range(draw(st.integers(1, 3))):
        places = list(paths(doc))
        if not places:
            break
        where = draw(st.sampled_from(places))
        parent = doc
        for part in where[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
        if action == "set":
            parent[where[-1]] = draw(NASTY)
        elif action == "delete" and isinstance(parent, dict):
            del parent[where[-1]]
        elif isinstance(parent[where[-1]], dict):
            parent[where[-1]][draw(st.sampled_from(["unknownField", "[bold]", "", "replicas", "url"]))] = draw(NASTY)
    return doc


@st.composite
def with_urls(draw: st.DrawFn) -> dict[str, Any]:
    """A spec whose source, overflow URL and Prometheus URL are URLs of every scheme."""
    spec = draw(crd_specs())
    model = dict(draw(st.sampled_from(MODELS)))
    if draw(st.booleans()):
        model["source"] = draw(URLS)
    spec["model"] = model
    if draw(st.booleans()):
        spec["overflow"] = {"url": draw(URLS)}
    if draw(st.booleans()):
        spec.setdefault("rollout", {}).setdefault("analysis", {})["prometheus"] = {"url": draw(URLS)}
    return spec


def manifests(specs: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda name, spec: {"apiVersion": "serving.folio.dev/v1alpha1", "kind": "InferenceService",
                            "metadata": {"name": name}, "spec": spec},
        st.integers(0, 9).flatmap(lambda i: NAMES if i < 2 else st.just("chat")), specs,
    )  # fmt: skip


# ------------------------------------------------------------------------------- the gates


class FakeRuntime:
    """`folio up`'s runtime as the control endpoint sees it; its apply validates like `LocalRuntime.apply`."""

    def __init__(self) -> None:
        self.name = "chat"
        self.applied: list[InferenceService] = []

    def apply(self, m: InferenceService) -> dict[str, Any]:
        if m.name != self.name:
            raise ValueError(f"metadata.name: this `folio up` runs InferenceService {self.name!r}")
        self.applied.append(m)
        return {"revision": revision_name(m.spec), "generation": 2, "changed": True}


def one_line(problem: Problem) -> None:
    text = str(problem)
    assert problem.path and problem.reason and problem.message, problem
    assert re.fullmatch(r"[A-Z][A-Za-z]+", problem.reason), problem
    assert text.splitlines() == [text] and text == text.strip(), repr(text)
    assert text.startswith(problem.path), text  # it names the field


def cluster_objects(name: str, spec: InferenceServiceSpec) -> None:
    """The operator's planner and objects for the spec's revision: admitted, pulled, ready; then as a canary."""
    owner, settings = Owner(name, "ml", "uid-1"), PlanSettings(inference_pool=True)
    rev = revision_name(spec)
    endpoints = {rev: ["http://10.0.0.1:8000"]}

    def render(status: InferenceServiceStatus) -> None:
        serving = plan(name, spec, status, Placement.cluster(), endpoints)
        objs = objects(serving, owner, settings)
        json.dumps(objs, allow_nan=False)  # what the executor sends: JSON, no NaN or infinity
        json.dumps(serving.router.to_wire(), allow_nan=False)

    status = InferenceServiceStatus()
    for facts in (RevisionFacts("pending"), RevisionFacts("ready"), RevisionFacts("ready", ready_replicas=2)):
        status = advance(spec, 1, status, Observed(now=NOW, revisions={rev: facts})).status
        render(status)
    # the same spec as a new revision over a running stable one (different args make a canary)
    base = InferenceServiceSpec.model_validate({"model": {"source": "file:///base", "digest": DIGEST}})
    stable = revision_name(base)
    status = InferenceServiceStatus()
    for facts in (RevisionFacts("ready"), RevisionFacts("ready", ready_replicas=1)):
        status = advance(base, 1, status, Observed(now=NOW, revisions={stable: facts})).status
    if stable != rev:
        ready = {stable: RevisionFacts("ready", ready_replicas=1), rev: RevisionFacts("ready", ready_replicas=2)}
        for _ in range(3):
            status = advance(spec, 2, status, Observed(now=NOW, revisions=ready)).status
            render(status)


def dry_run(doc: dict[str, Any], tmp: Path) -> tuple[int, list[str], list[Problem]]:
    """`folio up FILE --dry-run` in process: its exit code, its lines, and the problems it should print."""
    text = yaml.safe_dump(doc, allow_unicode=True)
    (tmp / "m.yaml").write_text(text, encoding="utf-8")
    out = StringIO()
    console = Console(file=out, width=240, color_system=None, force_terminal=False, force_jupyter=False)
    code = run_up(tmp / "m.yaml", port=0, state_dir=tmp / "state", console=console, dry_run=True)
    return code, out.getvalue().splitlines(), parse_manifest(yaml.safe_load(text), THIS_MACHINE)[1]


def check(doc: dict[str, Any], tmp: Path, api: tuple[TestClient, FakeRuntime]) -> None:
    name, spec = doc["metadata"]["name"], doc["spec"]
    # (a) one verdict per site, never an exception, one line per problem naming its field
    (in_cluster, cluster), (here, local) = parse(name, spec, CLUSTER), parse(name, spec, THIS_MACHINE)
    for problem in cluster + local:
        one_line(problem)
    assert (in_cluster is None) == (here is None)
    assert [p for p in cluster if p.reason not in SITE_REASONS] == [p for p in local if p.reason not in SITE_REASONS]
    assert {p.path for p in cluster + local if p.reason in SITE_REASONS} <= SITE_FIELDS
    # (b) the operator plans and renders what the cluster's verdict accepts
    if not cluster:
        assert in_cluster is not None
        cluster_objects(name, in_cluster)
    # (c) folio up --dry-run: the plan, or one line per problem; nothing written either way
    code, lines, expected = dry_run(doc, tmp)
    if expected:
        assert (code, lines) == (1, [f"folio up: {p}" for p in expected])
    else:
        assert code == 0, lines
        text = "\n".join(lines)  # (on a machine with a GPU, a note about kvCacheMemoryGib comes first)
        assert "folio up --dry-run: InferenceService " in text and "folio serve --model " in text
    assert not (tmp / "state").exists()
    # (d) folio apply: the control endpoint refuses with the same lines, or applies
    client, runtime = api
    wire = json.dumps({"manifest": doc})  # (Python's JSON: NaN and Infinity too, which the endpoint reads)
    body = json.loads(wire)
    expected = parse_manifest(body["manifest"], THIS_MACHINE)[1]
    resp = client.post("/v1/apply", content=wire, headers={"content-type": "application/json"})
    if expected:
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["message"].splitlines() == [str(p) for p in expected]
        assert [Problem(**p) for p in error["problems"]] == expected
    elif name == runtime.name:
        assert resp.status_code == 200, resp.text
        assert runtime.applied.pop().spec == parse_manifest(body["manifest"], THIS_MACHINE)[0].spec  # type: ignore[union-attr]
    else:
        assert resp.status_code == 400 and resp.json()["error"]["message"].startswith("metadata.name: ")


@pytest.fixture(scope="module")
def api() -> tuple[TestClient, FakeRuntime]:
    runtime = FakeRuntime()
    client = TestClient(build_app(runtime, "tok"))  # type: ignore[arg-type]
    client.headers["authorization"] = "Bearer tok"
    return client, runtime


FUZZ = settings(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
CASES = {"crd": manifests(crd_specs()), "mutated": manifests(mutated(crd_specs())), "urls": manifests(with_urls())}


# Different draws often build the same manifest (about a third of the 2,650 drawn here are repeats, the
# quick and the long tests' included). `check` gives the same verdict each time it is given the same
# manifest, so each distinct one is checked once a session, by whichever test drew it first; one that
# failed is not recorded, so hypothesis' shrinking and replay of it check it again.
CHECKED: set[str] = set()


def fuzz(kind: str, examples: int, api: tuple[TestClient, FakeRuntime]) -> None:
    @settings(FUZZ, max_examples=examples)
    @given(doc=CASES[kind])
    def run(doc: dict[str, Any]) -> None:
        key = repr(doc)  # exact: key order, int/bool/float, -0.0, every character
        if key in CHECKED:
            return
        with tempfile.TemporaryDirectory(prefix="folio-fuzz-") as tmp:
            check(doc, Path(tmp), api)
        CHECKED.add(key)

    run()


@pytest.mark.parametrize(("kind", "examples"), [("crd", 200), ("mutated", 300), ("urls", 150)])
def test_fuzzed_manifests(kind: str, examples: int, api: tuple[TestClient, FakeRuntime]) -> None:
    fuzz(kind, examples, api)


@pytest.mark.timeout(900)  # (not `slow`: no process or clock of its own, so make test runs it beside others)
@pytest.mark.parametrize(("kind", "examples"), [("crd", 500), ("mutated", 1000), ("urls", 500)])  # 2,000 in all
def test_many_fuzzed_manifests(kind: str, examples: int, api: tuple[TestClient, FakeRuntime]) -> None:
    fuzz(kind, examples, api)


def _scheme(doc: dict[str, Any]) -> str:
    """The model source's scheme of a manifest the schema accepts."""
    return str(doc["spec"]["model"]["source"]).split("://")[0]


def _verdicts(doc: dict[str, Any]) -> tuple[list[Problem], list[Problem]]:
    name = doc["metadata"]["name"]
    return parse(name, doc["spec"], CLUSTER)[1], parse(name, doc["spec"], THIS_MACHINE)[1]


# What the strategies must be able to give, so that the fuzz above is worth something: manifests each site
# accepts, from each source it takes, and each kind of refusal.
WANTED: dict[str, Callable[[dict[str, Any]], bool]] = {
    **{f"valid {scheme}:// in a cluster": (lambda d, scheme=scheme: not _verdicts(d)[0] and _scheme(d) == scheme)
       for scheme in ("hf", "file")},
    **{f"valid {scheme}:// here": (lambda d, scheme=scheme: not _verdicts(d)[1] and _scheme(d) == scheme)
       for scheme in ("hf", "file")},
    **{f"refused: {reason}": (lambda d, reason=reason: any(p.reason == reason for v in _verdicts(d) for p in v))
       for reason in ("InvalidSpec", "InvalidName", "InvalidEngineArgs", "InvalidModelSource", UNSUPPORTED_HERE,
                      FAULT_INJECTION_DISABLED)},
}


@pytest.mark.parametrize("wanted", list(WANTED))
def test_the_fuzz_gives_valid_and_refused_manifests_of_every_kind(wanted: str) -> None:
    """A search, not a sample: it stops at the first manifest that fits and fails only if none can be found
    (hypothesis.find raises NoSuchExample), so it does not hang on which cases one run happens to draw."""
    search = settings(FUZZ, max_examples=5000, phases=(Phase.generate,))  # the first fit will do: no shrinking
    find(st.one_of(*CASES.values()), WANTED[wanted], settings=search)
