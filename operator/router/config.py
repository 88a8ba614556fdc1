"""The router's view of the world: which revisions get traffic and where their replicas are.

What a router should do is decided by `folio.operator.serving.router` from an InferenceService's
status; every source (a JSON file, an in-process object, the Kubernetes API) delivers a `RouterConfig`;
the router swaps it in whole, so a request always sees one consistent snapshot. The wire form is
the JSON documented in the design (camelCase keys); unknown keys are ignored so that a newer
writer never takes an older router down.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from folio.operator.spec import (
    LoadBalancingSpec,
    OutlierDetectionSpec,
    PositiveDuration,
    describe_errors,
    parse_duration,
)

# Not a revision: the label under which overflow attempts are counted in the metrics.
OVERFLOW = "overflow"


class ConfigError(ValueError):
    """A router config that cannot be used; the message says which field and why."""


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


def _base_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"endpoint {url!r} must start with http:// or https://")
    return url.rstrip("/")


class TrafficTarget(_Wire):
    revision: str = Field(min_length=1)
    weight: int = Field(ge=0, le=100)


class Overflow(_Wire):
    url: str
    api_key: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        # Requests keep their /v1/... path, so a base given as ".../v1" loses that suffix here.
        url = _base_url(url)
        return url[: -len("/v1")] if url.endswith("/v1") else url


class Shadow(_Wire):
    percent: float = Field(default=0.0, ge=0.0, le=100.0)


class Holding(_Wire):
    """Requests for a revision with no ready replica wait (`folio.operator.router.hold`) instead of failing."""

    max_held_requests: int = Field(default=256, ge=0)
    hold_timeout: float = Field(default=300.0, gt=0.0, description="seconds")
    # Held requests go out at most this many at a time per ready replica: the rate it takes them.
    release_per_replica: int = Field(default=4, ge=1)


# Optional parts: one that is invalid is dropped (and reported) rather than refusing the whole config, so a
# bad overflow URL never leaves a router with nothing to serve.
OPTIONAL_PARTS = ("overflow", "shadow", "outlierDetection", "requestTimeout", "loadBalancing", "holding")
DEFAULT_REQUEST_TIMEOUT = "60s"  # the spec's analysis.requestTimeout default


class RouterConfig(_Wire):
    traffic: list[TrafficTarget] = Field(default_factory=list)
    endpoints: dict[str, list[str]] = Field(default_factory=dict)
    stable: str | None = None
    # Where shadow copies go; defaults to the first revision in traffic other than stable.
    canary: str | None = None
    overflow: Overflow | None = None
    shadow: Shadow | None = None
    holding: Holding | None = None
    outlier_detection: OutlierDetectionSpec = Field(default_factory=OutlierDetectionSpec)
    # A canary attempt with no first byte within this long, or stalling longer mid-stream, is a timeout.
    request_timeout: PositiveDuration = DEFAULT_REQUEST_TIMEOUT
    load_balancing: LoadBalancingSpec = Field(default_factory=LoadBalancingSpec)
    api_keys: list[str] | None = None
    # what parse() dropped, one readable line per part: the router logs these and reports them on /health
    problems: tuple[str, ...] = ()

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, endpoints: dict[str, list[str]]) -> dict[str, list[str]]:
        return {rev: list(dict.fromkeys(_base_url(u) for u in urls)) for rev, urls in endpoints.items()}

    @model_validator(mode="after")
    def _unique(self) -> RouterConfig:
        names = [t.revision for t in self.traffic]
        if len(names) != len(set(names)):
            raise ValueError(f"traffic lists a revision more than once: {names}")
        return self

    @property
    def stable_revision(self) -> str | None:
        """The retry target: `stable` when given, else the revision with the highest weight."""
        if self.stable:
            return self.stable
        if not self.traffic:
            return None
        return max(self.traffic, key=lambda t: t.weight).revision  # first wins a tie

    @property
    def canary_revision(self) -> str | None:
        if self.canary:
            return self.canary
        stable = self.stable_revision
        return next((t.revision for t in self.traffic if t.revision != stable), None)

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
        """Validate a config given as JSON text or a dict; raises `ConfigError` with a readable message."""
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
