"""The router config of an InferenceService: the planner's contract with every router.

A router follows typed status, ``traffic`` (the weights the rollout decided), the stable revision (where
failed attempts are retried) and the canary (where shadow copies go), plus the ready endpoints of each
revision it may send to and the routing parts of the spec (`RoutedSpec`). Roles come from status only:
a router never guesses which revision is stable from the weights.

The planner builds a `RouterConfig` from typed objects (`router_config`); it is handed over typed in
process. Only the boundaries parse: the file `folio up`'s router follows (`RouterConfig.parse`, the JSON
documented in the design: camelCase keys, unknown keys ignored so a newer writer never takes an older
router down) and the in-cluster router's watch of its InferenceService (`RoutedSpec.from_wire`, which
reads the routing parts alone: an engine arg the operator refuses does not touch routing).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from folio.engine.config import DEFAULT_MAX_NUM_SEQS
from folio.operator.parity import holds_shadow
from folio.operator.spec import (
    AccessSpec,
    AutoscalingSpec,
    InferenceServiceSpec,
    InferenceServiceStatus,
    LoadBalancingSpec,
    MigrationSpec,
    OutlierDetectionSpec,
    OverflowSpec,
    PositiveDuration,
    RouterSpec,
    ShadowSpec,
    TenantSpec,
    TrafficTarget,
    describe_errors,
    parse_duration,
)

# Not a revision: the label under which overflow attempts are counted in the metrics.
OVERFLOW = "overflow"
DEFAULT_REQUEST_TIMEOUT = "60s"  # the spec's analysis.requestTimeout default


class ConfigError(ValueError):
    """A router config that cannot be used; the message says which field and why."""


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


def _base_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"endpoint {url!r} must start with http:// or https://")
    return url.rstrip("/")


class Overflow(_Wire):
    url: str
    api_key: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        # Requests keep their /v1/... path, so a base given as ".../v1" loses that suffix here.
        url = _base_url(url)
        return url[: -len("/v1")] if url.endswith("/v1") else url


class Holding(_Wire):
    """Requests for a revision with no ready replica wait (`folio.operator.router.hold`) instead of failing."""

    max_held_requests: int = Field(default=256, ge=0)
    hold_timeout: float = Field(default=300.0, gt=0.0, description="seconds")
    # Held requests go out at most this many at a time per ready replica: the rate it takes them.
    release_per_replica: int = Field(default=4, ge=1)

    @classmethod
    def of(cls, auto: AutoscalingSpec) -> Holding:
        """Held requests are released as many at a time per ready replica as the autoscaler aims to give it
        (InFlight's target)."""
        per_replica = max(1, int(auto.target)) if auto.metric == "InFlight" else 4
        return cls(max_held_requests=auto.max_held_requests, hold_timeout=auto.hold_timeout_seconds,
                   release_per_replica=per_replica)


class AdapterRoute(_Wire):
    """One adapter's split: the weights of its revisions (status.adapters[].traffic), and its stable revision,
    where a failed attempt on another revision is retried."""

    traffic: list[TrafficTarget] = Field(default_factory=list)
    stable: str | None = None


class Access(_Wire):
    """Who may call (`folio.operator.router.tenants`): the keys' Secret, anonymous callers, tenants' policies,
    and how many routers share each limit. Never an optional part: a router that cannot follow the access it
    is given keeps the last it could (or, first, serves nobody) rather than serving everyone."""

    api_keys_secret: str | None = None
    anonymous: bool = False
    tenants: list[TenantSpec] = Field(default_factory=list)
    routers: int = Field(default=1, ge=1)
    # what each replica's engine runs at once (--max-num-seqs): past that, requests wait in the router
    slots: int = Field(default=DEFAULT_MAX_NUM_SEQS, ge=1)

    @classmethod
    def of(cls, spec: AccessSpec | None, routers: int = 1, slots: int = DEFAULT_MAX_NUM_SEQS) -> Access | None:
        if spec is None:
            return None
        secret = spec.api_keys_secret_ref.name if spec.api_keys_secret_ref is not None else None
        return cls(api_keys_secret=secret, anonymous=spec.anonymous, tenants=spec.tenants, routers=routers,
                   slots=slots)


# Optional parts: one that is invalid is dropped (and reported) rather than refusing the whole config, so a
# bad overflow URL never leaves a router with nothing to serve.
OPTIONAL_PARTS = (
    "overflow", "shadow", "outlierDetection", "requestTimeout", "loadBalancing", "holding", "migration",
)


class RouterConfig(_Wire):
    traffic: list[TrafficTarget] = Field(default_factory=list)
    endpoints: dict[str, list[str]] = Field(default_factory=dict)
    stable: str | None = None  # where a failed attempt is retried; none: no retry
    canary: str | None = None  # where shadow copies go; none: no shadow
    overflow: Overflow | None = None
    shadow: ShadowSpec | None = None
    holding: Holding | None = None
    outlier_detection: OutlierDetectionSpec = Field(default_factory=OutlierDetectionSpec)
    # A canary attempt with no first byte within this long, or stalling longer mid-stream, is a timeout.
    request_timeout: PositiveDuration = DEFAULT_REQUEST_TIMEOUT
    load_balancing: LoadBalancingSpec = Field(default_factory=LoadBalancingSpec)
    # Continuing an answer on another replica when its own fails after the first byte.
    migration: MigrationSpec = Field(default_factory=MigrationSpec)
    api_keys: list[str] | None = None
    access: Access | None = None  # spec.access: tenants, their keys' Secret and quotas
    # adapter name (the `model` clients send) -> its revisions' weights (`folio.operator.serving.adapters`)
    adapters: dict[str, AdapterRoute] = Field(default_factory=dict)
    # what parse() dropped, one readable line per part: the router logs these and reports them on /health
    problems: tuple[str, ...] = ()

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, endpoints: dict[str, list[str]]) -> dict[str, list[str]]:
        return {rev: list(dict.fromkeys(_base_url(u) for u in urls)) for rev, urls in endpoints.items()}

    @model_validator(mode="after")
    def _unique(self) -> RouterConfig:
        names = [t.revision for t in self.traffic]
        if len(names) != len(set(names)) or not all(names):
            raise ValueError(f"traffic must name each revision once: {names}")
        return self

    @property
    def request_timeout_seconds(self) -> float:
        return parse_duration(self.request_timeout)

    @property
    def shadow_fraction(self) -> float:
        return self.shadow.percent / 100.0 if self.shadow else 0.0

    def to_wire(self) -> dict[str, Any]:
        """The wire form as a JSON-ready dict: what `folio up` writes to the file its router follows."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"problems"})

    def fingerprint(self) -> str:
        """A digest of the wire form. The router reports the one in force on `/ready`, so that whoever writes
        its config (`folio up`) can tell when the router follows it."""
        wire = json.dumps(self.to_wire(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(wire.encode()).hexdigest()[:16]

    @classmethod
    def parse(cls, data: str | bytes | dict[str, Any]) -> RouterConfig:
        """The file boundary: a config given as JSON text or a dict; raises `ConfigError` with a readable
        message. An invalid optional part is dropped and named in ``problems``."""
        try:
            raw = json.loads(data) if isinstance(data, str | bytes) else data
        except json.JSONDecodeError as exc:
            raise ConfigError(f"router config is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"router config must be a JSON object, got {type(raw).__name__}")
        raw = {k: v for k, v in raw.items() if k != "problems"}
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            errors = exc.errors()
        bad = {str(err["loc"][0]) for err in errors if err["loc"]}
        if not errors or not bad <= set(OPTIONAL_PARTS) or any(not err["loc"] for err in errors):
            raise ConfigError(f"invalid router config: {describe_errors(errors)}")
        try:
            config = cls.model_validate({k: v for k, v in raw.items() if k not in bad})
        except ValidationError as exc:
            raise ConfigError(f"invalid router config: {describe_errors(exc)}") from exc
        dropped = tuple(
            f"{part} ignored: {describe_errors([e for e in errors if e['loc'][0] == part])}" for part in sorted(bad)
        )
        return config.model_copy(update={"problems": dropped})


class RoutedSpec(_Wire):
    """The parts of an InferenceService's spec that its routers follow."""

    router: RouterSpec = Field(default_factory=RouterSpec)
    shadow: ShadowSpec | None = None
    overflow: OverflowSpec | None = None
    autoscaling: AutoscalingSpec | None = None
    request_timeout: PositiveDuration = DEFAULT_REQUEST_TIMEOUT  # spec.rollout.analysis.requestTimeout
    parity_gate: bool = False  # spec.rollout.parity is set: a canary gets no shadow copy before it passes
    access: AccessSpec | None = None
    # spec.access is set but does not parse: the routers serve nobody (never everybody) until it is mended
    access_refused: bool = False
    slots: int = DEFAULT_MAX_NUM_SEQS  # spec.engine.args.maxNumSeqs

    @classmethod
    def of(cls, spec: InferenceServiceSpec) -> RoutedSpec:
        return cls(router=spec.router, shadow=spec.shadow, overflow=spec.overflow, autoscaling=spec.autoscaling,
                   request_timeout=spec.rollout.analysis.request_timeout, parity_gate=spec.rollout.parity is not None,
                   access=spec.access, slots=_slots(spec.engine.args.get("maxNumSeqs")))

    @classmethod
    def from_wire(cls, spec: Mapping[str, Any]) -> tuple[RoutedSpec, list[str]]:
        """The watch boundary: each routing part of a spec as written, parsed on its own; one that does not
        parse is left at its default and named in the returned problems (the operator reports it in status)."""
        rollout = spec.get("rollout") if isinstance(spec.get("rollout"), dict) else {}
        analysis = rollout.get("analysis") if isinstance(rollout.get("analysis"), dict) else {}
        parts = {  # wire key: (value, where it sits in the spec)
            **{key: (spec.get(key), "spec") for key in ("router", "shadow", "overflow", "autoscaling", "access")},
            "requestTimeout": (analysis.get("requestTimeout"), "spec.rollout.analysis"),
        }
        engine = spec.get("engine") if isinstance(spec.get("engine"), dict) else {}
        args = engine.get("args") if isinstance(engine.get("args"), dict) else {}
        kept: dict[str, Any] = {"parityGate": rollout.get("parity") is not None, "slots": _slots(args.get("maxNumSeqs"))}
        problems = []
        for key, (value, where) in parts.items():
            if value is None:
                continue
            try:
                cls.model_validate({key: value})
                kept[key] = value
            except ValidationError as exc:
                problems.append(describe_errors(exc, where))
                kept["accessRefused"] = kept.get("accessRefused", False) or key == "access"
        return cls.model_validate(kept), problems


def _slots(max_num_seqs: object) -> int:
    """The engines' --max-num-seqs as the spec gives it; the engine's default where it gives none (or one the
    operator refuses in status)."""
    if isinstance(max_num_seqs, int) and not isinstance(max_num_seqs, bool) and max_num_seqs >= 1:
        return max_num_seqs
    return DEFAULT_MAX_NUM_SEQS


def routable(status: InferenceServiceStatus) -> list[str]:
    """The revisions a router may send a request to: those in ``traffic``, the stable and the canary."""
    names = {t.revision for t in status.traffic} | {status.stable_revision, status.canary_revision}
    return sorted(n for n in names if n)


def router_config(
    spec: RoutedSpec | None,
    status: InferenceServiceStatus,
    endpoints: Mapping[str, Sequence[str]],
    *,
    overflow_api_key: str | None = None,
    routers: int = 1,
) -> RouterConfig:
    """What a router should do now; ``endpoints`` maps a revision to its ready replicas' base URLs.
    ``spec`` None (it could not be read) leaves shadow, overflow and holding out and the rest at defaults.
    ``routers``: how many routers serve the service, each enforcing its share of the tenants' limits."""
    routing: dict[str, Any] = {}
    if spec is not None:
        shadow = spec.shadow if spec.shadow is not None and not (spec.parity_gate and holds_shadow(status)) else None
        routing = {
            "shadow": shadow,  # (a canary waiting for its parity gate gets no user request)
            "outlier_detection": spec.router.outlier_detection,
            "request_timeout": spec.request_timeout,
            "load_balancing": spec.router.load_balancing,
            "migration": spec.router.migration,
            "holding": Holding.of(spec.autoscaling) if spec.autoscaling is not None else None,
            "overflow": Overflow(url=spec.overflow.url, api_key=overflow_api_key) if spec.overflow else None,
            "access": Access() if spec.access_refused else Access.of(spec.access, max(1, routers), spec.slots),
        }
    return RouterConfig(
        traffic=list(status.traffic),
        adapters={a.name: AdapterRoute(traffic=list(a.traffic), stable=a.stable_revision)
                  for a in status.adapters if a.traffic},
        endpoints={rev: list(endpoints.get(rev, ())) for rev in routable(status)},
        stable=status.stable_revision,
        canary=status.canary_revision,
        **routing,
    )
