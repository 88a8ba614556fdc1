"""The InferenceService model: the single source of truth for the CRD, the operator and `folio up`.

Python attributes are snake_case; the wire form (YAML, the Kubernetes API) is camelCase through
aliases. Always dump with ``by_alias=True`` (``to_wire`` does). Validation here mirrors the CRD's
CEL rules so that `folio up` refuses exactly what the API server refuses.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal, Protocol, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

GROUP = "serving.folio.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ["fisvc"]
DOMAIN = "folio.dev"  # finalizers, annotations, kopf storage
# Set by a router holding requests with nothing ready; the operator's autoscaler scales up and removes it.
SCALE_UP_ANNOTATION = f"{DOMAIN}/scale-up"

DEFAULT_IMAGE = "ghcr.io/folio-dev/folio:0.1.0"

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
SOURCE_RE = re.compile(r"^(hf|pvc|file|pkg)://.+$")
DIGEST_SCHEMES = ("pvc", "file", "pkg")  # sources that name bytes, not a commit: the digest pins them
DURATION_RE = re.compile(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$")
QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
# An absolute http(s) URL with a host: what the router can forward to or query.
HTTP_URL_RE = re.compile(r"^https?://[^\s/?#@]+(:[0-9]+)?([/?#][^\s]*)?$")
# A Kubernetes object name (RFC 1123 label). Folio names children `{name}-prepull-{revision}` (Job names
# are pod labels: at most 63 characters) with 10-character revisions, so its own names stay within 44.
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LENGTH = 44
# Bounds on counts (the API server and `folio up` alike): beyond them a typo, not a plan.
MAX_REPLICAS = 512
MAX_ROUTER_REPLICAS = 32
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def check_name(name: object) -> str:
    """An InferenceService name Folio can derive every child's name from; raises ValueError saying why not."""
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name is required")
    if len(name) > MAX_NAME_LENGTH or not NAME_RE.match(name):
        raise ValueError(
            f"metadata.name {name[:80]!r} must be at most {MAX_NAME_LENGTH} lower-case letters, digits and '-', "
            "starting and ending with a letter or digit (its children's names add a suffix)"
        )
    return name


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration such as ``30s``, ``2m``, ``1h30m`` or ``500ms``."""
    if not DURATION_RE.match(text):
        raise ValueError(f"invalid duration {text!r}: use e.g. '30s', '2m', '1h30m' or '500ms'")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))


class Model(BaseModel):
    """Base: camelCase on the wire, snake_case in Python, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


Duration = str  # validated with DURATION_RE where used


def _positive(value: str) -> str:
    if parse_duration(value) <= 0:
        raise ValueError("the duration must be positive")
    return value


PositiveDuration = Annotated[str, Field(pattern=DURATION_RE.pattern), AfterValidator(_positive)]


# ----------------------------------------------------------------------------- spec


class SecretKeyRef(Model):
    name: str = Field(min_length=1, description="Secret in the InferenceService's namespace.")
    key: str = Field(default="token", min_length=1, description="Key inside the Secret.")


class PinnedSource(Model):
    """Files pinned to an immutable revision: a model's weights, or an adapter's."""

    _what: ClassVar[str] = "model"  # how the pinning rules name the fields: model.revision, adapter.revision

    source: str = Field(
        description="Where the weights come from: hf://ORG/NAME, pvc://CLAIM/PATH, file:///PATH, or "
        "pkg://DISTRIBUTION/PATH (a file an installed Python package ships; the local runtime only).",
        pattern=SOURCE_RE.pattern,
    )
    revision: str | None = Field(
        default=None,
        description="For hf:// sources: the full 40-hex commit SHA to serve (never a branch or tag).",
    )
    digest: str | None = Field(
        default=None,
        description="sha256:<64 hex> content digest of the weights (`folio digest PATH`); "
        "required for pvc://, file:// and pkg://, recorded and enforced for hf:// when given.",
        pattern=DIGEST_RE.pattern,
    )
    credentials_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Hub token used by the pre-pull only; never logged or passed to pods."
    )

    @property
    def scheme(self) -> str:
        return self.source.split("://", 1)[0]

    @model_validator(mode="after")
    def _pinned(self) -> Self:
        if self.scheme == "hf" and not (self.revision and COMMIT_RE.match(self.revision)):
            raise ValueError(
                f"hf:// sources must pin {self._what}.revision to a full 40-character lowercase hex commit SHA "
                f"(got {self.revision!r}); branches and tags are not immutable"
            )
        if self.scheme in DIGEST_SCHEMES and not self.digest:
            raise ValueError(
                f"{self.scheme}:// sources need {self._what}.digest (sha256:…); compute it with `folio digest PATH`"
            )
        return self


class ModelSource(PinnedSource):
    served_name: str | None = Field(
        default=None, description="Model name clients send; defaults to the InferenceService's name."
    )


class ResourceRequirements(Model):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)  # keys are Kubernetes' own
    limits: dict[str, int | str] = Field(default_factory=dict)
    requests: dict[str, int | str] = Field(default_factory=dict)


EngineArgValue = int | float | bool | str | dict[str, Any]  # an object: for flags that take JSON


class EngineSpec(Model):
    image: str = Field(default=DEFAULT_IMAGE, description="Container image running `folio serve`.")
    resources: ResourceRequirements = Field(
        default_factory=lambda: ResourceRequirements(limits={"nvidia.com/gpu": 1}),
        description="The engine container's resources. Default: nvidia.com/gpu 1, or N with "
        "args.tensorParallelSize N.",
    )
    args: dict[str, EngineArgValue] = Field(
        default_factory=dict,
        description="`folio serve` flags in camelCase (maxModelLen -> --max-model-len); "
        "an unknown key is reported in status.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None
    priority_class_name: str | None = None
    env: list[dict[str, Any]] = Field(default_factory=list)


class OutlierDetectionSpec(Model):
    """Envoy-style ejection of failing replicas (the router's `folio.operator.router.outliers`)."""

    consecutive_errors: int = Field(
        default=5, ge=1, description="Consecutive 5xx answers, connection failures or timeouts that eject a replica."
    )
    base_ejection_time: PositiveDuration = Field(
        default="30s", description="Ejection time, times the number of ejections so far, capped at 300s."
    )
    max_ejection_percent: int = Field(
        default=50, ge=0, le=100, description="At most this share of a revision's replicas is ejected at once."
    )

    @property
    def base_ejection_seconds(self) -> float:
        return parse_duration(self.base_ejection_time)


class LoadBalancingSpec(Model):
    """How the router places a request on one of its revision's replicas (`folio.operator.router.ring`)."""

    strategy: Literal["PrefixHash", "LeastLoaded"] = Field(
        default="PrefixHash",
        description="PrefixHash: a consistent-hash ring over the request's prefix (or user / x-session-id) "
        "with bounded loads, so repeated prefixes meet their KV cache; LeastLoaded: the least busy replica.",
    )
    prefix_char_length: int = Field(
        default=100, ge=1, le=100_000,
        description="Characters of the rendered chat prefix or the prompt that make the affinity key.",
    )  # fmt: skip
    mean_load_factor: float = Field(
        default=1.25, ge=1.0, le=100.0,
        description="A replica above this times the mean load passes a request on along the ring.",
    )  # fmt: skip


class MigrationSpec(Model):
    """Continuing an answer whose replica fails after its first byte on another replica
    (the router's `folio.operator.router.migration`): the client sees one unbroken answer."""

    max_attempts: int = Field(
        default=3, ge=0, le=10,
        description="Continuations of one request at most; 0 turns migration off (a broken event stream then "
        "ends with an error event).",
    )  # fmt: skip
    inter_chunk_timeout: PositiveDuration = Field(
        default="30s",
        description="With migration on, an answer silent this long after its first byte (or its attempt timeout, "
        "when shorter) has stalled, and is continued elsewhere.",
    )

    @property
    def inter_chunk_timeout_seconds(self) -> float:
        return parse_duration(self.inter_chunk_timeout)


class GatewayRef(Model):
    """The Gateway (gateway.networking.k8s.io) an InferenceService's HTTPRoute attaches to: the platform's."""

    name: str = Field(min_length=1, max_length=253, description="The Gateway's name.")
    namespace: str | None = Field(
        default=None, min_length=1, max_length=63, description="Its namespace; unset: the InferenceService's."
    )
    section_name: str | None = Field(
        default=None, min_length=1, max_length=253, description="One listener of the Gateway; unset: all of them."
    )


class RouterSpec(Model):
    replicas: int = Field(default=2, ge=0, le=MAX_ROUTER_REPLICAS)
    image: str | None = Field(default=None, description="Defaults to the operator's own image.")
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements)
    outlier_detection: OutlierDetectionSpec = Field(default_factory=OutlierDetectionSpec)
    load_balancing: LoadBalancingSpec = Field(default_factory=LoadBalancingSpec)
    migration: MigrationSpec = Field(default_factory=MigrationSpec)
    inference_pool: bool | None = Field(
        default=None,
        description="Also publish a Gateway API inference-extension InferencePool "
        "(inference.networking.k8s.io/v1) per revision over its engine pods; unset: the operator's default.",
    )
    gateway: GatewayRef | None = Field(
        default=None,
        description="With InferencePools: the Gateway an HTTPRoute named after the InferenceService attaches to, "
        "splitting its traffic over the revisions' pools by status.traffic. Unset: the pools alone, no route.",
    )


class CacheSpec(Model):
    size: str = Field(default="20Gi", pattern=QUANTITY_RE.pattern)
    storage_class_name: str | None = None


class RolloutStep(Model):
    weight: int = Field(ge=1, le=99, description="Percent of traffic on the canary during this step.")
    pause: Duration = Field(default="1m", pattern=DURATION_RE.pattern)

    @property
    def pause_seconds(self) -> float:
        return parse_duration(self.pause)


class PrometheusSpec(Model):
    url: str = Field(max_length=2048, pattern=HTTP_URL_RE.pattern, description="Prometheus base URL (http or https).")


class AnalysisSpec(Model):
    interval: Duration = Field(default="30s", pattern=DURATION_RE.pattern)
    min_requests: int = Field(default=50, ge=1)
    failure_limit: int = Field(default=2, ge=1)
    max_error_rate: float = Field(default=0.01, ge=0.0, le=1.0)
    max_latency_p99_increase_ms: float = Field(default=50.0, ge=0.0)
    max_time_to_first_token_p95_ms: float = Field(default=2000.0, gt=0.0)
    request_timeout: PositiveDuration = Field(
        default="60s",
        description="A canary attempt with no first byte within this long, or a stream that stalls longer, "
        "is a timeout: the router retries it on stable when nothing was sent yet.",
    )
    max_timeout_rate: float = Field(
        default=0.05, ge=0.0, le=1.0, description="Share of the canary's attempts that may time out."
    )
    min_shadow_match_rate: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="Least share of compared shadow answers matching the primary's (needs shadow.percent > 0).",
    )
    prometheus: PrometheusSpec | None = None
    max_inconclusive_duration: PositiveDuration = Field(
        default="30m",
        description="How long a step may go without a conclusive sample (its analysis window grows meanwhile "
        "until it holds minRequests) before onInconclusive acts.",
    )
    on_inconclusive: Literal["Pause", "Rollback", "Promote"] = Field(
        default="Pause",
        description="After maxInconclusiveDuration: Pause (hold the step until promote, abort or retry), "
        "Rollback (as a failed analysis) or Promote (end the step as if it passed).",
    )

    @property
    def interval_seconds(self) -> float:
        return parse_duration(self.interval)

    @property
    def max_inconclusive_seconds(self) -> float:
        return parse_duration(self.max_inconclusive_duration)

    @property
    def request_timeout_seconds(self) -> float:
        return parse_duration(self.request_timeout)


class ConfigMapKeyRef(Model):
    name: str = Field(min_length=1, max_length=253, description="ConfigMap in the InferenceService's namespace.")
    key: str = Field(default="suite.jsonl", min_length=1, max_length=253, description="Key holding the JSONL suite.")


MAX_PARITY_PROMPTS = 5000


class ParitySpec(Model):
    """The parity gate: before step 1 the canary answers a prompt suite as stable does, or is rolled back."""

    prompts: int = Field(default=500, ge=1, le=MAX_PARITY_PROMPTS, description="The suite's first N prompts.")
    max_tokens: int = Field(default=16, ge=1, le=256, description="Greedy tokens generated per prompt.")
    min_cosine: float = Field(
        default=0.9985, ge=-1.0, le=1.0, description="Least mean cosine similarity of mean prompt logits."
    )
    min_token_match: float = Field(
        default=0.9, ge=0.0, le=1.0, description="Least share of prompts whose greedy continuation matches."
    )
    config_map_ref: ConfigMapKeyRef | None = Field(
        default=None, description="A team's own suite: JSONL of {\"prompt\": …} or {\"messages\": […]}."
    )
    suite_file: str | None = Field(
        default=None, min_length=1, max_length=4096, description="`folio up` only: the suite as a JSONL file path."
    )
    timeout: Duration = Field(default="10m", pattern=DURATION_RE.pattern, description="The whole gate at most.")

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout)


MAX_ROLLOUT_STEPS = 10  # bounded so the API server can cost the CRD's CEL rules


def _default_steps() -> list[RolloutStep]:
    return [RolloutStep(weight=5, pause="2m"), RolloutStep(weight=25, pause="5m"), RolloutStep(weight=50, pause="5m")]


class RolloutSpec(Model):
    steps: list[RolloutStep] = Field(default_factory=_default_steps, max_length=MAX_ROLLOUT_STEPS)
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    parity: ParitySpec | None = None
    drain_period: Duration = Field(
        default="30s",
        pattern=DURATION_RE.pattern,
        description="How long a replaced stable revision keeps running at weight 0 before it is removed.",
    )

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[RolloutStep]) -> list[RolloutStep]:
        weights = [s.weight for s in steps]
        if any(b <= a for a, b in itertools.pairwise(weights)):
            raise ValueError(f"rollout step weights must strictly increase within 1-99, got {weights}")
        return steps


class OverflowSpec(Model):
    url: str = Field(
        max_length=2048,
        pattern=HTTP_URL_RE.pattern,
        description="OpenAI-compatible endpoint (http or https, with a host) used when every replica is busy.",
    )
    api_key_secret_ref: SecretKeyRef | None = None


class ShadowSpec(Model):
    percent: float = Field(default=0.0, ge=0.0, le=100.0)


AutoscalingMetric = Literal["InFlight", "Waiting", "KVCache"]


class AutoscalingSpec(Model):
    """Replicas that follow load (`folio.operator.autoscaling`); minReplicas 0 allows scale to zero."""

    min_replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS, description="0 allows scale to zero.")
    max_replicas: int = Field(default=8, ge=1, le=MAX_REPLICAS)
    metric: AutoscalingMetric = Field(
        default="InFlight",
        description="InFlight: requests in flight through the routers per replica; Waiting: "
        "vllm:num_requests_waiting per replica; KVCache: mean vllm:kv_cache_usage_perc (0-1).",
    )
    target: float = Field(default=4.0, gt=0.0, description="The metric's value per replica to aim for.")
    scale_down_delay: Duration = Field(
        default="5m", pattern=DURATION_RE.pattern,
        description="Lower demand must last this long before replicas are removed (and before scale to zero).",
    )  # fmt: skip
    hold_timeout: Duration = Field(
        default="5m", pattern=DURATION_RE.pattern,
        description="How long the router holds a request while its revision has no ready replica.",
    )  # fmt: skip
    max_held_requests: int = Field(
        default=256, ge=0, le=100_000, description="Requests the router holds at most; beyond, 503 or overflow."
    )
    keda: bool = Field(default=False, description="Render a KEDA ScaledObject instead of Folio's own autoscaler.")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"autoscaling.minReplicas {self.min_replicas} exceeds maxReplicas {self.max_replicas}")
        if self.metric == "KVCache" and self.target > 1.0:
            raise ValueError(f"autoscaling.target for KVCache is a fraction of the cache (0-1], got {self.target}")
        return self

    @property
    def scale_down_delay_seconds(self) -> float:
        return parse_duration(self.scale_down_delay)

    @property
    def hold_timeout_seconds(self) -> float:
        return parse_duration(self.hold_timeout)


PeerLabels = dict[str, str] | None  # a NetworkPolicy peer's matchLabels; unset: no such peer


def _peer_labels(description: str) -> Any:
    """A field of `NetworkPolicySpec` naming the labels of the pods (or namespaces) it admits."""
    return Field(default=None, description=description)


class NetworkPolicySpec(Model):
    enabled: bool = Field(
        default=True,
        description="Render a NetworkPolicy that admits the engine pods' API port only from this service's "
        "routers and the operator, and their metrics port only from the operator and `metricsNamespaceLabels` "
        "(the engines have no authentication of their own).",
    )
    metrics_namespace_labels: PeerLabels = _peer_labels(
        "Also admit pods in namespaces with these labels to the engines' metrics port (Prometheus "
        "scraping their /metrics, e.g. {kubernetes.io/metadata.name: monitoring}); never to their API port.",
    )
    gateway_namespace_labels: PeerLabels = _peer_labels(
        "While InferencePools are published, also admit pods in namespaces with these labels (the "
        "Gateway's proxies) to the engines' API port; with gatewayPodLabels, only those pods there. Unset with "
        "gatewayPodLabels unset: no gateway is admitted.",
    )
    gateway_pod_labels: PeerLabels = _peer_labels(
        "While InferencePools are published, also admit pods with these labels (in the namespaces of "
        "gatewayNamespaceLabels, else in this one: e.g. the pools' endpoint pickers) to the engines' API port.",
    )


class _HasName(Protocol):
    name: str


Named = TypeVar("Named", bound=_HasName)


def unique_names(items: list[Named], what: str) -> list[Named]:
    """``items`` as given, or a ValueError naming each name given more than once."""
    names = [item.name for item in items]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{what} names must be unique: {', '.join(twice)} given more than once")
    return items


# Tenants per InferenceService at most (bounded so the API server can cost the CRD's rules).
MAX_TENANTS = 256
# A tenant's name is a key of the API keys' Secret (Kubernetes' key characters) and a metric label.
TENANT_NAME_RE = re.compile(r"^[A-Za-z0-9]([-._A-Za-z0-9]{0,61}[A-Za-z0-9])?$")
TenantPriority = Literal["Critical", "Standard", "Sheddable"]


class SecretRef(Model):
    name: str = Field(min_length=1, max_length=253, description="Secret in the InferenceService's namespace.")


class TenantSpec(Model):
    """One tenant's priority and quotas; each limit is the service's, shared out among its routers."""

    name: str = Field(max_length=63, pattern=TENANT_NAME_RE.pattern, description="A key of the API keys' Secret.")
    priority: TenantPriority = Field(
        default="Standard",
        description="Critical is never shed while a Sheddable request is admitted; Sheddable is shed first.",
    )
    requests_per_minute: int | None = Field(default=None, ge=1, le=100_000_000)
    tokens_per_minute: int | None = Field(
        default=None, ge=1, le=100_000_000_000, description="Prompt and completion tokens together."
    )
    max_in_flight: int | None = Field(default=None, ge=1, le=1_000_000, description="Requests under way at once.")


class AccessSpec(Model):
    """Who may call the service: API keys per tenant (from a Secret), their quotas and priorities."""

    api_keys_secret_ref: SecretRef | None = Field(
        default=None,
        description="Each key of the Secret is a tenant's name; its value, one API key per line. The routers "
        "read this Secret only, and follow its changes (a rotated key works within 10 s).",
    )
    anonymous: bool = Field(
        default=False, description="Serve requests without a key too, as the tenant 'anonymous'."
    )
    tenants: list[TenantSpec] = Field(
        default_factory=list, max_length=MAX_TENANTS,
        description="Tenants' priorities and quotas; a tenant of the Secret not named here is Standard, unlimited.",
    )  # fmt: skip

    @field_validator("tenants")
    @classmethod
    def _unique_tenants(cls, tenants: list[TenantSpec]) -> list[TenantSpec]:
        return unique_names(tenants, "tenant")

    @model_validator(mode="after")
    def _someone(self) -> AccessSpec:
        if self.api_keys_secret_ref is None and not self.anonymous:
            raise ValueError("access needs apiKeysSecretRef, or anonymous: true (else nobody is served)")
        return self


# Adapters per InferenceService at most (bounded so the API server can cost the CRD's CEL rules).
MAX_ADAPTERS = 64
# An adapter's name is the `model` clients send: no spaces, no '@' (Folio's engines know each adapter
# revision as `NAME@REVISION`, `adapter_engine_name`).
ADAPTER_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._:/-]{0,126}[A-Za-z0-9])?$")


class AdapterSpec(PinnedSource):
    """A LoRA adapter served beside the base model: pinned, pre-pulled, and rolled out on its own."""

    _what: ClassVar[str] = "adapter"

    name: str = Field(
        max_length=128, pattern=ADAPTER_NAME_RE.pattern,
        description="The `model` clients send to use the adapter; unique, and not the base model's served name.",
    )  # fmt: skip
    rollout: RolloutSpec | None = Field(
        default=None, description="How a new revision of this adapter rolls out; unset: spec.rollout."
    )

    def pin(self) -> ModelSource:
        """The adapter's files as the pre-pull fetches them."""
        return ModelSource(source=self.source, revision=self.revision, digest=self.digest,
                           credentials_secret_ref=self.credentials_secret_ref)


class DraftModelSpec(PinnedSource):
    """Speculative decoding's draft model: a smaller model with the served model's tokenizer."""

    _what: ClassVar[str] = "draftModel"


class InferenceServiceSpec(Model):
    model: ModelSource
    replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    autoscaling: AutoscalingSpec | None = Field(
        default=None, description="Replicas that follow load; spec.replicas is ignored when set."
    )
    engine: EngineSpec = Field(default_factory=EngineSpec)
    router: RouterSpec = Field(default_factory=RouterSpec)
    cache: CacheSpec = Field(default_factory=CacheSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    overflow: OverflowSpec | None = None
    shadow: ShadowSpec | None = None
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec)
    access: AccessSpec | None = Field(
        default=None, description="API keys per tenant, quotas and priorities; unset: the routers serve anyone."
    )
    draft_model: DraftModelSpec | None = Field(
        default=None,
        description="The draft model of speculative decoding: pinned and pre-pulled with each revision's weights, "
        "and named to the engines by the operator (spec.engine.args.speculativeConfig then gives "
        "num_speculative_tokens and no model path). It must share the model's tokenizer.",
    )
    adapters: list[AdapterSpec] = Field(
        default_factory=list, max_length=MAX_ADAPTERS,
        description="LoRA adapters served on the base model's replicas, each pinned and rolled out on its own; "
        "adding one, or changing its revision, restarts no pod (see enableLora).",
    )  # fmt: skip

    @field_validator("adapters")
    @classmethod
    def _unique_adapters(cls, adapters: list[AdapterSpec]) -> list[AdapterSpec]:
        return unique_names(adapters, "adapter")

    @model_validator(mode="after")
    def _adapter_names(self) -> InferenceServiceSpec:
        served = self.model.served_name
        if served is not None and any(a.name == served for a in self.adapters):
            raise ValueError(f"adapter {served!r} is named like the base model's served name (spec.model.servedName)")
        return self


# --------------------------------------------------------------------------- status


class Lenient(Model):
    """Status models accept fields they do not know, so an older operator never chokes on a newer status."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


ConditionType = Literal["Ready", "Progressing", "Degraded", "WeightsReady"]
ConditionStatus = Literal["True", "False", "Unknown"]
RevisionRole = Literal["Stable", "Canary", "Retiring", "Failed", "Superseded"]
RUNNING_ROLES: tuple[RevisionRole, ...] = ("Stable", "Canary", "Retiring")  # the roles whose revisions run


class Condition(Lenient):
    type: str
    status: ConditionStatus = "Unknown"
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class TrafficTarget(Lenient):
    revision: str
    weight: int = Field(ge=0, le=100)


class AnalysisSample(Lenient):
    """One analysis interval's figures for the canary, compared with stable."""

    at: str | None = None
    requests: int = 0
    errors: int = 0
    error_rate: float = 0.0
    latency_p99_ms: float | None = None
    stable_latency_p99_ms: float | None = None
    ttft_p95_ms: float | None = None
    timeouts: int = 0
    timeout_rate: float = 0.0
    shadow_match_rate: float | None = None  # of the interval's compared shadow answers, when there were any
    verdict: Literal["Pass", "Fail", "Inconclusive"] = "Inconclusive"
    reasons: list[str] = Field(default_factory=list)
    # The window judged began then: the interval's start, or earlier when it grew over Inconclusive samples
    # (`folio.operator.analysis.growth`).
    since: str | None = None
    # Inconclusive samples of the router-scrape source: the window's counters so far, which the next sample
    # adds its interval to (kept here, in status, so that a restart keeps growing the same window).
    accumulated: list[RevisionCounts] | None = None


class RevisionCounts(Lenient):
    """One revision's router counters over a growing analysis window (histogram buckets keyed by their upper
    bound as text, ``+Inf`` included)."""

    revision: str
    codes: dict[str, float] = Field(default_factory=dict)
    duration: dict[str, float] = Field(default_factory=dict)
    ttft: dict[str, float] = Field(default_factory=dict)
    shadow: dict[str, float] = Field(default_factory=dict)


class ParityPromptDiff(Lenient):
    """One of the suite's worst prompts: how far the canary's answer is from stable's."""

    index: int
    prompt: str = ""  # truncated
    cosine: float | None = None
    prompt_tokens_differ: bool = False  # tokenizer or chat template changed
    first_divergence: int | None = None  # first differing continuation token; None when they match
    stable: str = ""  # stable's continuation (truncated)
    canary: str = ""


class ParityReport(Lenient):
    """The parity gate's verdict on a canary, against the stable revision of the time."""

    revision: str
    stable_revision: str | None = None
    at: str | None = None
    verdict: Literal["Pass", "Fail", "Error"] = "Error"
    prompts: int = 0
    mean_cosine: float | None = None
    min_cosine: float | None = None
    token_match: float | None = None  # share of prompts whose continuation matches token for token
    prompt_token_mismatches: int = 0  # prompts tokenized differently by the two revisions
    seconds: float | None = None  # the gate's wall time
    message: str = ""  # why it failed or could not run
    worst: list[ParityPromptDiff] = Field(default_factory=list)


class CanaryStatus(Lenient):
    step: int = 0  # index into spec.rollout.steps
    weight: int = 0
    started_at: str | None = None
    step_started_at: str | None = None
    consecutive_failures: int = 0
    last_analysis: AnalysisSample | None = None
    parity: ParityReport | None = None
    paused: CanaryPause | None = None  # held at its step until promote, abort or retry
    # Steps (indices) that ended without a conclusive sample, by ``onInconclusive: Promote``.
    steps_without_evidence: list[int] | None = None


class CanaryPause(Lenient):
    """Why and since when a canary is held at its step (``onInconclusive: Pause``)."""

    at: str
    reason: str
    message: str = ""


class FailedRevision(Lenient):
    revision: str
    reason: str
    at: str
    message: str = ""
    last_analysis: AnalysisSample | None = None  # the figures that decided it, when an analysis did
    parity: ParityReport | None = None  # the parity gate's report, when the gate decided it


class RevisionStatus(Lenient):
    """A revision the service still runs or remembers: what it serves and where it stands.

    The spec only describes the newest revision, so everything needed to keep running an older
    one (the stable revision during a canary) is kept here.
    """

    name: str
    role: RevisionRole
    model: ModelSource
    draft_model: DraftModelSpec | None = None  # speculative decoding's, pre-pulled beside the model
    image: str
    args: dict[str, EngineArgValue] = Field(default_factory=dict)
    created_at: str | None = None
    weights_ready: bool = False
    ready_replicas: int = 0
    retire_at: str | None = None  # Retiring: removed after this time


class AutoscalingStatus(Lenient):
    """The autoscaler's last decision (`folio.operator.autoscaling.decide`)."""

    desired_replicas: int = 0  # across the service's serving revisions
    current_replicas: int = 0  # ready now
    metric: str = ""
    value: float | None = None  # the metric's reading the decision used
    last_scale_time: str | None = None
    reason: str = ""
    # Since when demand has been below desiredReplicas, and the most it asked for since: a scale
    # down happens once that has lasted scaleDownDelay, to that most (no flapping).
    lower_since: str | None = None
    lower_peak: int | None = None
    keda: bool | None = None  # True: KEDA's ScaledObjects scale (`autoscaling.keda`), nothing above is Folio's


class RolloutStatus(Lenient):
    """Where the rollout of one thing stands: the InferenceService's base revisions, or one adapter's."""

    observed_generation: int | None = None
    phase: str | None = None  # human summary: Pending, WeightsPending, Canary, Paused, Promoted, RolledBack, Ready
    stable_revision: str | None = None
    canary_revision: str | None = None
    failed_revisions: list[FailedRevision] = Field(default_factory=list)
    traffic: list[TrafficTarget] = Field(default_factory=list)
    canary: CanaryStatus | None = None
    conditions: list[Condition] = Field(default_factory=list)
    revisions: list[RevisionStatus] = Field(default_factory=list)

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def revision(self, name: str | None) -> RevisionStatus | None:
        return next((r for r in self.revisions if r.name == name), None)

    @property
    def serving_canary(self) -> str | None:
        """The canary revision while it takes traffic (a positive weight in ``traffic``), else None.

        The rollout decides the weights; everything else (analysis, routing) reads them here.
        """
        canary = self.canary_revision
        return canary if any(t.revision == canary and t.weight > 0 for t in self.traffic) else None


class AdapterStatus(RolloutStatus):
    """One adapter's rollout (`folio.operator.rollout.adapters`): its revisions' ``model`` is the adapter's
    pin, their ``readyReplicas`` the engine replicas that have loaded them."""

    name: str


class InferenceServiceStatus(RolloutStatus):
    autoscaling: AutoscalingStatus | None = None
    adapters: list[AdapterStatus] = Field(default_factory=list)

    def adapter(self, name: str) -> AdapterStatus | None:
        return next((a for a in self.adapters if a.name == name), None)


class InferenceService(Model):
    """A whole object as `folio up` reads it from YAML (metadata kept loosely)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    api_version: Literal["serving.folio.dev/v1alpha1"] = API_VERSION
    kind: Literal["InferenceService"] = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: InferenceServiceSpec
    status: InferenceServiceStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))


# ------------------------------------------------------------------- revision identity


def engine_args(spec: InferenceServiceSpec) -> dict[str, EngineArgValue]:
    """`spec.engine.args` as the engines run them: with adapters, `enableLora`; with tenants of a priority
    other than Standard, `schedulingPolicy: priority` (so a higher priority preempts a lower one); each unless
    the spec says otherwise (the operator sets it itself). A service without either keeps its args, and so
    its revision."""
    args = dict(spec.engine.args)
    if spec.adapters:
        args.setdefault("enableLora", True)
    if spec.access is not None and any(t.priority != "Standard" for t in spec.access.tenants):
        args.setdefault("schedulingPolicy", "priority")
    return args


def new_revision(spec: InferenceServiceSpec, role: RevisionRole, created_at: str) -> RevisionStatus:
    """The spec's revision as status remembers it: everything needed to keep running it after the
    spec has moved on (the identity fields of `revision_name`, with the whole model source)."""
    return RevisionStatus(
        name=revision_name(spec),
        role=role,
        model=spec.model.model_copy(deep=True),
        draft_model=spec.draft_model.model_copy(deep=True) if spec.draft_model else None,
        image=spec.engine.image,
        args=engine_args(spec),
        created_at=created_at,
    )


def revision_name(spec: InferenceServiceSpec) -> str:
    """Short stable hash of what makes a revision: model source, revision, digest, the draft model's pin,
    engine image and args (`engine_args`: the first adapter turns LoRA on, a new revision unless `enableLora`
    was set already).

    Replicas, rollout settings, routing, scheduling fields and adapters are deliberately not part of it, so
    changing them updates the current revision in place.
    """
    return _identity(spec.model, spec.engine.image, engine_args(spec), spec.draft_model)


def adapter_revision_name(adapter: AdapterSpec) -> str:
    """The same hash for an adapter's revision: its pin alone (`ADAPTER_IMAGE`, no args)."""
    return _identity(adapter, ADAPTER_IMAGE, {})


ADAPTER_IMAGE = ""  # an adapter revision's `image`: it runs in its base revision's engines


def _identity(pin: PinnedSource, image: str, args: Mapping[str, EngineArgValue], draft: PinnedSource | None = None) -> str:
    identity: dict[str, Any] = {"source": pin.source, "revision": pin.revision, "digest": pin.digest, "image": image,
                                "args": args}  # fmt: skip
    if draft is not None:  # (absent otherwise: the names of revisions without one stay what they were)
        identity["draft"] = {"source": draft.source, "revision": draft.revision, "digest": draft.digest}
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


# ------------------------------------------------------------------------- timestamps


def now_iso(now: datetime) -> str:
    """RFC 3339 with a Z, as Kubernetes writes timestamps."""
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def as_utc(now: datetime) -> datetime:
    """Aware UTC datetime; a naive one is taken to be UTC already."""
    return now.replace(tzinfo=timezone.utc) if now.tzinfo is None else now.astimezone(timezone.utc)


def parse_time(text: str) -> datetime:
    """Inverse of `now_iso`: an RFC 3339 ``…Z`` timestamp (fractional seconds allowed) as aware UTC."""
    return as_utc(datetime.fromisoformat(text.replace("Z", "+00:00")))


# ------------------------------------------------------------------------ input errors


def describe_errors(exc: ValidationError | Sequence[Mapping[str, Any]], prefix: str = "") -> str:
    """A pydantic ValidationError (or some of its ``errors()``) as short ``field.path: message`` parts,
    without the URL noise."""
    parts = []
    for err in exc.errors() if isinstance(exc, ValidationError) else exc:
        loc = ".".join(str(p) for p in (*([prefix] if prefix else []), *err["loc"])) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
