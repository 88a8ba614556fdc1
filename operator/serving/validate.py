"""One verdict on an InferenceService, for the operator and `folio up` alike.

`validate(name, spec, site)` lists every `Problem` of a spec — the schema's (pydantic, the CRD's
twin), the name's (`check_name`), the planner's (engine args → `folio serve` flags, KEDA, tensor
parallelism, the model source, durations, what the router cannot use) and the site's — one per
field, each naming its field path. It never raises for bad input. `parse` also hands back the spec model.

The same spec gets the same verdict in a cluster and on this machine, except for the few rules a
`Site` (where the spec runs) holds as data (`SITE_REASONS`: ``UnsupportedHere``, and
``FaultInjectionDisabled`` for the test aids):

| rule                                   | cluster (`CLUSTER`)       | this machine (`THIS_MACHINE`) |
| -------------------------------------- | ------------------------- | ----------------------------- |
| model source schemes                   | hf://, pvc://, file://    | hf://, file://, pkg://        |
| engine replicas per revision at most   | 512 (`MAX_REPLICAS`)      | 16 (`LOCAL_MAX_REPLICAS`)     |
| parity suite source                    | configMapRef              | suiteFile                     |
| fault-injection args (`FAULT_ARGS`)    | refused (see below)       | kept                          |

(The fault-injection args, `faultErrorRate`, `faultLatencyMs`, `faultLogitNoise`, `faultCrashAfterTokens` and
`faultAdapterFiles`, make a revision (or an adapter revision) fail, slow down or answer differently on purpose: test aids for rollback and the parity gate. A cluster's
operator refuses a spec that sets any of them, whatever its value, with the reason
``FaultInjectionDisabled``, unless it was started with `--allow-fault-injection`, which runs it with
``dataclasses.replace(CLUSTER, fault_injection=True)``. One problem per field: a fault arg whose value
is wrong anyway is reported as that, on both sites.)

(file:// stays accepted in a cluster, as the operator has always done: the pre-pull Job copies the
path as its own container sees it.)
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from folio.engine import package_files
from folio.operator import prepull
from folio.operator.serving import draft, engine, keda, lws, parallel
from folio.operator.serving.errors import PlanningError
from folio.operator.serving.router import Holding, Overflow, RoutedSpec, router_config
from folio.operator.spec import (
    DIGEST_RE,
    DURATION_RE,
    HTTP_URL_RE,
    MAX_REPLICAS,
    QUANTITY_RE,
    SOURCE_RE,
    InferenceService,
    InferenceServiceSpec,
    InferenceServiceStatus,
    PinnedSource,
    check_name,
    parse_duration,
    revision_name,
)

# One machine runs every replica as a process of its own: more than this is a typo, not a plan.
LOCAL_MAX_REPLICAS = 16
# Durations beyond this are typos; far beyond it, dates overflow (the rollout adds them to now).
MAX_DURATION_S = 366 * 24 * 3600.0
MAX_DURATION_TEXT = "8784h"

# The reasons a Problem carries (condition reasons in a cluster).
INVALID_SPEC = "InvalidSpec"
INVALID_NAME = "InvalidName"
INVALID_ENGINE_ARGS = "InvalidEngineArgs"
INVALID_MODEL_SOURCE = "InvalidModelSource"
UNSUPPORTED_HERE = "UnsupportedHere"
FAULT_INJECTION_DISABLED = "FaultInjectionDisabled"
# The reasons of the sites' own rules: the only ones by which two sites' verdicts on one spec differ.
SITE_REASONS = frozenset({UNSUPPORTED_HERE, FAULT_INJECTION_DISABLED})
# The `spec.engine.args` keys of the engine's fault injection (`folio serve --fault-*`): test aids.
FAULT_ARGS = ("faultErrorRate", "faultLatencyMs", "faultLogitNoise", "faultCrashAfterTokens", "faultAdapterFiles")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest: the field, a condition reason (CamelCase) and one line saying what."""

    path: str  # the field path: "spec.engine.args.maxModelLen", "metadata.name", "spec.rollout.steps[1].weight"
    reason: str  # InvalidSpec, InvalidName, InvalidEngineArgs, InvalidModelSource, KedaNeedsPrometheus, UnsupportedHere,
    # FaultInjectionDisabled
    message: str  # one line, naming the field

    def __str__(self) -> str:
        if self.message == self.path or self.message.startswith((f"{self.path} ", f"{self.path}:")):
            return self.message
        return f"{self.path}: {self.message}"


@dataclass(frozen=True)
class Site:
    """Where a spec will run, as far as the verdict depends on it: the only site-specific rules."""

    name: str  # how refusals name it: "a cluster", "`folio up`"
    other: str  # the other site, where what this one refuses runs
    sources: tuple[str, ...]  # model source schemes it pulls weights from
    max_replicas: int  # engine replicas per revision at most (spec.replicas, spec.autoscaling.maxReplicas)
    replica: str  # what one engine replica is there, for the messages
    parity_suites: tuple[str, ...]  # the spec.rollout.parity fields it reads a suite from
    fault_injection: bool  # whether it runs the engine's fault-injection args (`FAULT_ARGS`)


CLUSTER = Site("a cluster", "`folio up`", ("hf", "pvc", "file"), MAX_REPLICAS, "engine pods", ("configMapRef",),
               fault_injection=False)
THIS_MACHINE = Site("`folio up`", "a cluster", ("hf", "file", "pkg"), LOCAL_MAX_REPLICAS, "engine processes", ("suiteFile",),
                    fault_injection=True)
SITES = (CLUSTER, THIS_MACHINE)


# ------------------------------------------------------------------------ entry points


def validate(name: str, spec: Mapping[str, Any] | InferenceServiceSpec | Any, site: Site) -> list[Problem]:
    """Every problem of the InferenceService ``name`` with ``spec`` (wire form or model) on ``site``."""
    return parse(name, spec, site)[1]


def parse(
    name: str, raw_spec: Mapping[str, Any] | InferenceServiceSpec | Any, site: Site
) -> tuple[InferenceServiceSpec | None, list[Problem]]:
    """The spec model and every problem. The model comes back whenever the schema accepts the spec, even
    with other problems (the operator keeps what already runs running then); None when it does not."""
    problems = _name(name)
    model: InferenceServiceSpec | None
    if isinstance(raw_spec, InferenceServiceSpec):
        model = raw_spec
        non_finite = _non_finite(model.model_dump(mode="python", by_alias=True), "spec")
    else:
        non_finite = _non_finite(raw_spec, "spec")
        try:
            model = InferenceServiceSpec.model_validate(raw_spec)
        except ValidationError as exc:
            model = None
            problems += schema_problems(exc, "spec")
    problems += non_finite
    if model is not None:
        problems += _served_name(name, model)
        problems += _group_name(name, model)
        planned = planning_problems(model, router=not non_finite)
        # one problem per field: a fault arg whose value is wrong anyway is reported as that, on every site
        taken = {p.path for p in planned}
        problems += planned + [p for p in _site(model, site)
                               if p.reason != FAULT_INJECTION_DISABLED or p.path not in taken]
    return model, _unique(problems)


def parse_manifest(doc: object, site: Site) -> tuple[InferenceService | None, list[Problem]]:
    """A whole manifest (apiVersion, kind, metadata, spec) as `folio up` and `folio apply` read it: the
    model, only when there is no problem, and every problem."""
    if not isinstance(doc, Mapping):
        return None, [Problem("(manifest)", INVALID_SPEC, f"must be a mapping, got {type(doc).__name__}")]
    problems: list[Problem] = []
    head = {k: doc[k] for k in ("apiVersion", "kind") if k in doc}
    try:
        InferenceService.model_validate({**head, "spec": _MINIMAL})
    except ValidationError as exc:
        problems += schema_problems(exc)
    metadata = doc.get("metadata", {})
    if not isinstance(metadata, Mapping):
        problems.append(Problem("metadata", INVALID_SPEC, f"must be a mapping, got {type(metadata).__name__}"))
        metadata = {}
    name = metadata.get("name")
    if "spec" not in doc:
        problems += [*_name(name), Problem("spec", INVALID_SPEC, "spec is required")]
        return None, problems
    spec, more = parse(name, doc["spec"], site)  # type: ignore[arg-type]  # _name reports a non-string
    problems += more
    if problems or spec is None:
        return None, problems
    return InferenceService(metadata=dict(metadata), spec=spec), []


def summary(problems: Sequence[Problem]) -> tuple[str, str]:
    """One condition (reason, message) for a list of problems: the first one's reason, every line."""
    return problems[0].reason, "; ".join(str(p) for p in problems)


def schema_problems(exc: ValidationError | Iterable[Mapping[str, Any]], prefix: str = "") -> list[Problem]:
    """Pydantic's errors as problems, one per field: the errors of a union's members (an engine arg of
    no type it takes) are one problem."""
    errors = exc.errors() if isinstance(exc, ValidationError) else list(exc)
    head = (prefix,) if prefix else ()
    members: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}  # a union's members' errors, by the field
    for err in errors:
        loc = tuple(err["loc"])
        if loc and loc[-1] in _UNION_TAGS:
            members.setdefault(loc[:-1], []).append(err)
    problems = []
    for err in errors:
        loc = tuple(err["loc"])
        errs = members.get(loc[:-1], []) if loc and loc[-1] in _UNION_TAGS else []
        if len(errs) > 1:
            kinds = ", ".join(_UNION_TAGS[e["loc"][-1]] for e in errs)
            message = f"Input should be one of: {kinds} (got {_type_name(err.get('input'))})"
            problems.append(Problem(field_path(head + loc[:-1]), INVALID_SPEC, message))
        else:
            message = _message(err)
            if err.get("type") == "extra_forbidden":
                message += _did_you_mean(head + loc)
            problems.append(Problem(field_path(head + loc), INVALID_SPEC, message))
    return _unique(problems)


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """`` (did you mean 'replicas'?)`` for an unknown spec field that is close to one the CRD schema has
    at that place; empty elsewhere."""
    from folio.operator.crd import spec_schema

    if not loc or loc[0] != "spec" or not isinstance(loc[-1], str):
        return ""
    node: Mapping[str, Any] | None = spec_schema()
    for part in loc[1:-1]:
        if node is None:
            return ""
        if isinstance(part, int):
            node = node.get("items")
        else:
            node = node.get("properties", {}).get(part) or node.get("additionalProperties") or None
    known = list((node or {}).get("properties", {}))
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def field_path(loc: Iterable[Any]) -> str:
    """``("spec", "rollout", "steps", 1, "weight")`` → ``spec.rollout.steps[1].weight``."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif not _PLAIN_KEY.match(str(part)):  # a user's key: quoted, so that the path stays one line
            out += f"[{str(part)!r}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(root)"


# ------------------------------------------------------------------------------ the rules

_MINIMAL = {"model": {"source": "hf://x/y", "revision": "0" * 40}}  # checks a manifest's head alone
_PATTERNS = {
    HTTP_URL_RE.pattern: "an http:// or https:// URL with a host",
    SOURCE_RE.pattern: "hf://ORG/NAME, pvc://CLAIM/PATH, file:///PATH or pkg://DISTRIBUTION/PATH",
    DIGEST_RE.pattern: "sha256: and 64 lowercase hex digits (`folio digest PATH`)",
    DURATION_RE.pattern: "a duration such as '30s', '2m', '1h30m' or '500ms'",
    QUANTITY_RE.pattern: "a quantity such as '20Gi'",
}
_UNION_TAGS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
               "dict[str,any]": "an object (for a flag that takes JSON)"}
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]*$")
_PATH_PREFIX = re.compile(r"^(spec(?:\.[A-Za-z0-9_]+)*)(?::\s*|\s+)(.*)$", re.S)


def _name(name: object) -> list[Problem]:
    if name is not None and not isinstance(name, str):
        return [Problem("metadata.name", INVALID_NAME, f"metadata.name must be a string, got {_type_name(name)}")]
    try:
        check_name(name)
    except ValueError as exc:
        return [Problem("metadata.name", INVALID_NAME, _clean(str(exc)))]
    return []


def planning_problems(spec: InferenceServiceSpec, *, router: bool = True) -> list[Problem]:
    """What a spec the schema accepts must also pass to be planned (`folio.operator.serving.plan`), the same on
    every site; ``router``: also what the router config takes from it."""
    problems = _engine_args(spec)
    for check in (lambda: keda.check(spec), lambda: parallel.check(spec.engine)):
        try:
            check()
        except PlanningError as exc:
            problems.append(_from_planning(exc))
    problems += _model_source(spec)
    problems += _adapters(spec)
    problems += _durations(spec)
    if router:
        problems += _router(spec)
    return problems


def _engine_args(spec: InferenceServiceSpec) -> list[Problem]:
    args = spec.engine.args
    bad = engine.arg_problems(args)
    if bad:
        known = engine.known_args()
        return [
            Problem(field_path(("spec", "engine", "args", key)), INVALID_ENGINE_ARGS,
                    message + (f" (known args: {known})" if key not in engine.engine_flags_table() else ""))
            for key, message in bad
        ]  # fmt: skip
    mismatched = [Problem(path, INVALID_ENGINE_ARGS if path.startswith("spec.engine.args") else INVALID_SPEC, message)
                  for path, message in draft.problems(spec)]  # fmt: skip
    if mismatched:
        return mismatched
    try:  # (the draft's path in the pods depends on the revision: any path does here)
        engine.engine_flags(draft.with_draft(args, draft.PLANNED if spec.draft_model else None))
    except PlanningError as exc:
        return [_from_planning(exc)]
    return []


def _model_source(spec: InferenceServiceSpec) -> list[Problem]:
    problems = _source("spec.model.source", spec.model)
    if spec.draft_model is not None:
        problems += _source("spec.draftModel.source", spec.draft_model)
    return problems


def _source(path: str, pin: PinnedSource) -> list[Problem]:
    """A source the pre-pull can name and reach (its scheme's own rules)."""
    try:
        prepull.model_dir_name(pin)
        if pin.scheme == "pvc":
            prepull.pvc_claim_and_path(pin.source)
        if pin.scheme == "file":
            prepull.local_source(pin, None)
        if pin.scheme == "pkg":
            package_files.split(pin.source)  # the form only: whether it is installed is the pre-pull's to say
    except (prepull.WeightsError, package_files.PackageFileError) as exc:
        return [Problem(path, INVALID_MODEL_SOURCE, _clean(str(exc)))]
    except ValueError as exc:  # urllib's: "Invalid IPv6 URL"
        return [Problem(path, INVALID_MODEL_SOURCE, f"{_short(pin.source)} is not a usable URL: {exc}")]
    return []


def _served_name(name: object, spec: InferenceServiceSpec) -> list[Problem]:
    """An adapter named like the base model's default served name, the InferenceService's (the schema's CEL
    refuses one named like spec.model.servedName): a request for it could not tell them apart."""
    if spec.model.served_name is not None:
        return []
    return [Problem(f"spec.adapters[{i}].name", INVALID_SPEC,
                    f"adapter {a.name!r} is named like the base model's served name (the InferenceService's name, "
                    "as spec.model.servedName is unset): rename it, or set spec.model.servedName")
            for i, a in enumerate(spec.adapters) if a.name == name]  # fmt: skip


def _group_name(name: object, spec: InferenceServiceSpec) -> list[Problem]:
    """A replica of several pods is a LeaderWorkerSet named like the engines, whose StatefulSets' names must
    leave room in a pod label (`folio.operator.serving.lws`): a shorter limit than other children's. Both
    sites, so that what `folio up` runs also runs in a cluster."""
    if not isinstance(name, str) or parallel.group_size(spec.engine, spec.engine.args) == 1:
        return []
    longest = lws.MAX_NAME_LENGTH - len(revision_name(spec)) - 1
    if len(name) <= longest:
        return []
    return [Problem("metadata.name", INVALID_NAME,
                    f"metadata.name {name!r} is {len(name)} characters; a replica that spans several pods (a "
                    f"LeaderWorkerSet named '{name}-<revision>') allows at most {longest}")]


def _adapters(spec: InferenceServiceSpec) -> list[Problem]:
    """Adapters need LoRA on (the operator turns it on itself unless the spec turns it off), and sources
    the pre-pull can name."""
    problems = []
    if spec.adapters and spec.engine.args.get("enableLora") is False:
        problems.append(Problem("spec.engine.args.enableLora", INVALID_ENGINE_ARGS,
                                "spec.engine.args.enableLora is false, and spec.adapters needs LoRA: "
                                "remove the arg (the operator sets it) or the adapters"))
    for i, adapter in enumerate(spec.adapters):
        problems += _source(f"spec.adapters[{i}].source", adapter.pin())
    return problems


def _durations(spec: InferenceServiceSpec) -> list[Problem]:
    """Durations the rollout adds to the time, the router and KEDA count in seconds: bounded."""
    found: list[tuple[str, str]] = [
        ("spec.rollout.analysis.interval", spec.rollout.analysis.interval),
        ("spec.rollout.analysis.requestTimeout", spec.rollout.analysis.request_timeout),
        ("spec.rollout.drainPeriod", spec.rollout.drain_period),
        ("spec.router.outlierDetection.baseEjectionTime", spec.router.outlier_detection.base_ejection_time),
        ("spec.router.migration.interChunkTimeout", spec.router.migration.inter_chunk_timeout),
        *((f"spec.rollout.steps[{i}].pause", s.pause) for i, s in enumerate(spec.rollout.steps)),
    ]
    if spec.rollout.parity is not None:
        found.append(("spec.rollout.parity.timeout", spec.rollout.parity.timeout))
    if spec.autoscaling is not None:
        found += [("spec.autoscaling.scaleDownDelay", spec.autoscaling.scale_down_delay),
                  ("spec.autoscaling.holdTimeout", spec.autoscaling.hold_timeout)]  # fmt: skip
    problems = []
    for path, text in found:
        try:
            seconds = parse_duration(text)
        except ValueError as exc:  # the schema checked the pattern; defensive only
            problems.append(Problem(path, INVALID_SPEC, _clean(str(exc))))
            continue
        if not seconds <= MAX_DURATION_S:
            problems.append(Problem(path, INVALID_SPEC, f"{_short(text)} is longer than {MAX_DURATION_TEXT} (a year)"))
    return problems


def _router(spec: InferenceServiceSpec) -> list[Problem]:
    """What the router cannot take from the spec's settings (`folio.operator.serving.router`)."""
    problems = []
    if spec.autoscaling is not None:
        try:
            Holding.of(spec.autoscaling)
        except ValidationError as exc:
            names = {"max_held_requests": "maxHeldRequests", "hold_timeout": "holdTimeout",
                     "release_per_replica": "target"}  # fmt: skip
            problems += [Problem(f"spec.autoscaling.{names.get(str(e['loc'][0]), e['loc'][0])}" if e["loc"]
                                 else "spec.autoscaling", INVALID_SPEC, _clean(str(e["msg"])))
                         for e in exc.errors()]  # fmt: skip
        except (ValueError, ArithmeticError) as exc:
            problems.append(Problem("spec.autoscaling", INVALID_SPEC, f"the router cannot use it: {_clean(str(exc))}"))
    if spec.overflow is not None:
        try:
            Overflow(url=spec.overflow.url)
        except ValueError as exc:
            problems.append(Problem("spec.overflow.url", INVALID_SPEC, f"the router cannot use it: {_clean(str(exc))}"))
    if not problems:  # anything else the router's config would refuse
        try:
            router_config(RoutedSpec.of(spec), InferenceServiceStatus(), {})
        except (ValueError, ArithmeticError) as exc:
            problems.append(Problem("spec", INVALID_SPEC, f"the router cannot use it: {_clean(str(exc))}"))
    return problems


def _site(spec: InferenceServiceSpec, site: Site) -> list[Problem]:
    """The site's own rules (the table in the module's docstring); reasons `SITE_REASONS`."""
    problems = []
    scheme = spec.model.scheme
    if scheme not in site.sources:
        problems.append(Problem(
            "spec.model.source", UNSUPPORTED_HERE,
            f"{scheme}:// sources need {site.other}; {site.name} serves "
            f"{', '.join(f'{s}://' for s in site.sources)} sources",
        ))  # fmt: skip
    counts = [("spec.replicas", spec.replicas)]
    if spec.autoscaling is not None:
        counts.append(("spec.autoscaling.maxReplicas", spec.autoscaling.max_replicas))
    for path, count in counts:
        if count > site.max_replicas:
            problems.append(Problem(
                path, UNSUPPORTED_HERE,
                f"{path} {count} is more than {site.name} runs (at most {site.max_replicas} "
                f"{site.replica} per revision)",
            ))  # fmt: skip
    parity = spec.rollout.parity
    if parity is not None:
        for key, value in (("configMapRef", parity.config_map_ref), ("suiteFile", parity.suite_file)):
            if value is not None and key not in site.parity_suites:
                problems.append(Problem(
                    f"spec.rollout.parity.{key}", UNSUPPORTED_HERE,
                    f"spec.rollout.parity.{key} needs {site.other}; {site.name} reads a suite from "
                    f"{' or '.join(site.parity_suites)} (or uses the default suite)",
                ))  # fmt: skip
    if not site.fault_injection:
        paths = [(key, field_path(("spec", "engine", "args", key))) for key in FAULT_ARGS if key in spec.engine.args]
        problems += [
            Problem(path, FAULT_INJECTION_DISABLED,
                    f"{path} is a fault-injection test aid (--{engine.kebab(key)}), and the operator was not "
                    f"started with --allow-fault-injection (the chart's faultInjection.enabled): remove it, "
                    f"or run the spec with {site.other}")
            for key, path in paths
        ]  # fmt: skip
    return problems


def _non_finite(value: Any, path: str) -> list[Problem]:
    """Infinite and NaN numbers (YAML's .inf and .nan): no field takes them, and JSON cannot carry them."""
    if isinstance(value, float) and not math.isfinite(value):
        return [Problem(path, INVALID_SPEC, f"must be a finite number, got {value}")]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _non_finite(v, field_path((path, k)))]
    if isinstance(value, list | tuple):
        return [p for i, v in enumerate(value) for p in _non_finite(v, field_path((path, i)))]
    return []


# --------------------------------------------------------------------------------- helpers


def _message(err: Mapping[str, Any]) -> str:
    """Pydantic's message, said in the spec's terms where it would quote a regular expression."""
    pattern = (err.get("ctx") or {}).get("pattern") if err.get("type") == "string_pattern_mismatch" else None
    if pattern in _PATTERNS:
        return f"must be {_PATTERNS[pattern]}, got {_short(str(err.get('input')))}"
    return _clean(str(err["msg"]))


def _from_planning(exc: PlanningError) -> Problem:
    """A PlanningError's message starts with the field it is about: split it off as the path."""
    message = _clean(exc.message)
    m = _PATH_PREFIX.match(message)
    if m is None:
        return Problem("spec", exc.reason, message)
    path, rest = m.group(1), m.group(2)
    return Problem(path, exc.reason, message if not message.startswith(f"{path}:") else rest)


def _clean(message: str) -> str:
    """One line, without pydantic's "Value error, " and "or instance of X" noise."""
    message = message.removeprefix("Value error, ")
    message = re.sub(r" or instance of \w+", "", message)
    return " ".join(message.split())


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _type_name(value: object) -> str:
    return {dict: "a mapping", list: "a list", type(None): "null"}.get(type(value), type(value).__name__)


def _unique(problems: list[Problem]) -> list[Problem]:
    return list(dict.fromkeys(problems))
