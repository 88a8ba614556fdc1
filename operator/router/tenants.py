"""Tenants (``spec.access``): who a request is, from its API key, and what it may still use.

Keys come from a Secret whose every key is a tenant's name and whose value holds that tenant's API keys,
one per line (`parse_secret`). They are held as BLAKE2s digests only (256 bits; hashlib's own BLAKE2, cheaper
per request than OpenSSL's SHA-256). A request presents its key as
``Authorization: Bearer KEY`` or, as Azure-style clients do, ``api-key: KEY``; its digest is looked up
and the one found compared with `hmac.compare_digest`. What any comparison's time depends on is a digest,
which a caller cannot steer a byte at a time: never how much of a key was right.

A tenant of the spec with no key in the Secret, a key given to two tenants (it is dropped from both), a
Secret that is missing: each is a problem the router reports, while it goes on serving the tenants that
are well defined, and never anyone without a key unless ``anonymous`` says so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from folio.operator.router.fair import RANK, Claim
from folio.operator.router.quota import Limits, TenantQuota
from folio.operator.spec import AccessSpec

_USAGE_KEY = b'"usage":'
_DECODER = json.JSONDecoder()
ANONYMOUS = "anonymous"  # the tenant of requests without a key, where access.anonymous allows them
# The engine's `priority` (lower first) of each tenant priority; Standard is the engines' default, 0.
ENGINE_PRIORITY = {"Critical": -1, "Standard": 0, "Sheddable": 1}
# What the router tells the engines (`X-Folio-Priority`) for a tenant's request; nothing for Standard ones.
ENGINE_PRIORITY_HEADER = {name: str(value) for name, value in ENGINE_PRIORITY.items() if value}


@dataclass(frozen=True)
class TenantPolicy:
    """A tenant as the spec describes it (`folio.operator.serving.router.Access`)."""

    name: str
    priority: str = "Standard"
    limits: Limits = field(default_factory=Limits)


def parse_secret(data: Mapping[str, str]) -> dict[str, list[str]]:
    """A Secret's decoded data as tenant -> keys: one key per line, blank lines and `#` comments skipped."""
    return {
        tenant: [s for line in value.splitlines() if (s := line.strip()) and not s.startswith("#")]
        for tenant, value in data.items()
    }


def presented_key(authorization: str | None, api_key: str | None) -> bytes | None:
    """The key a request presents: ``Authorization: Bearer KEY``, else ``api-key: KEY``."""
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and (token := token.strip()):
            return token.encode("utf-8", "surrogateescape")
    if api_key and (api_key := api_key.strip()):
        return api_key.encode("utf-8", "surrogateescape")
    return None


def _digest(key: bytes) -> bytes:
    return hashlib.blake2s(key).digest()


class TenantKeys:
    """Key digests -> tenant names, and what was wrong with the keys given."""

    def __init__(self, keys: Mapping[str, Iterable[str]], expected: Iterable[str] = ()) -> None:
        owners: dict[bytes, set[str]] = {}
        for tenant, tenant_keys in keys.items():
            for key in tenant_keys:
                owners.setdefault(_digest(key.encode()), set()).add(tenant)
        owned = {d: next(iter(ts)) for d, ts in owners.items() if len(ts) == 1}
        self._by_prefix: dict[bytes, list[tuple[bytes, str]]] = {}  # a digest's first bytes -> (digest, tenant)
        for digest, tenant in owned.items():
            self._by_prefix.setdefault(digest[:8], []).append((digest, tenant))
        problems = []
        shared = sorted({", ".join(sorted(ts)) for ts in owners.values() if len(ts) > 1})
        problems += [
            f"an API key is given to several tenants ({names}): refused for all of them" for names in shared
        ]
        with_keys = set(owned.values())
        problems += [f"tenant {t!r} has no API key in the Secret" for t in sorted(set(expected) - with_keys)]
        self.problems = tuple(problems)
        self.tenants = frozenset(with_keys)

    def identify(self, key: bytes) -> str | None:
        digest = _digest(key)
        for stored, tenant in self._by_prefix.get(digest[:8], ()):
            if hmac.compare_digest(stored, digest):
                return tenant
        return None


def check_keys(secret: str | None, keys: Mapping[str, Iterable[str]] | None,
               tenants: Iterable[str]) -> tuple[TenantKeys, tuple[str, ...]]:  # fmt: skip
    """spec.access's keys given its Secret ``secret``'s (None: missing), and what is wrong with them: what the
    router logs and shows on /health and the operator reports in status (Degraded, reason InvalidAccess)."""
    expected = [t for t in tenants if t != ANONYMOUS] if keys is not None else []
    tenant_keys = TenantKeys(keys or {}, expected)
    problems = tenant_keys.problems
    if secret is not None and keys is None:
        problems = (f"the API keys' Secret {secret!r} is missing (or not read yet): no key is accepted", *problems)
    return tenant_keys, problems


INVALID_ACCESS = "InvalidAccess"  # the Degraded reason of a spec.access its Secret does not fulfil


def access_unavailable(access: AccessSpec | None, keys: Mapping[str, Iterable[str]] | None) -> tuple[str, str] | None:
    """The operator's (reason, message) for Degraded (`rollout.Observed.unavailable`) when ``access``'s Secret,
    whose keys are ``keys`` (None: missing), leaves a tenant unusable; None when all is well."""
    if access is None or access.api_keys_secret_ref is None:
        return None
    _, problems = check_keys(access.api_keys_secret_ref.name, keys, [t.name for t in access.tenants])
    return (INVALID_ACCESS, "spec.access: " + "; ".join(problems)) if problems else None


class Tenants:
    """The tenants of one router: identification, policies and quotas."""

    def __init__(self, policies: Iterable[TenantPolicy], keys: TenantKeys, *, anonymous: bool, share: float,
                 now: float, previous: Tenants | None = None) -> None:  # fmt: skip
        given = {p.name: p for p in policies}
        names = {*given, *keys.tenants, *([ANONYMOUS] if anonymous else [])}
        self.policies = {name: given.get(name) or TenantPolicy(name) for name in names}
        self.keys = keys
        self.anonymous = anonymous
        self.share = share
        # Usage carries over a change of keys, limits or share: a rotation never resets anyone's quota.
        self.quotas: dict[str, TenantQuota] = {}
        for name in names:
            limits = self.policies[name].limits
            old = previous.quotas.get(name) if previous is not None else None
            self.quotas[name] = (
                TenantQuota(limits, now, share) if old is None else old.reshare(limits, share, now)
            )

    def policy(self, name: str) -> TenantPolicy:
        return self.policies.get(name) or TenantPolicy(name)

    def identify(self, authorization: str | None, api_key: str | None) -> str | None:
        """The tenant of a request's headers, or None (401)."""
        key = presented_key(authorization, api_key)
        if key is None:
            return ANONYMOUS if self.anonymous else None
        return self.keys.identify(key)


# Completion tokens reserved for a request that names no max_tokens: OpenAI's completions default; chat
# answers run longer. Settling corrects either from the real usage.
DEFAULT_RESERVED = {"/v1/completions": 16, "/v1/chat/completions": 256}
BYTES_PER_TOKEN = 4  # the prompt's estimate before the engine counts it: about four bytes of JSON a token


@dataclass(slots=True)
class Meter:
    """One admitted request's reservation, and the usage its answer shows (`folio.operator.router.proxy`)."""

    tenant: str
    prompt_estimate: int
    reserved: int  # prompt estimate + completion budget
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    priority: str = "Standard"  # its tenant's
    answer: bytes | None = None  # a whole JSON answer, its usage read at settling, once it is on its way

    @property
    def claim(self) -> Claim:
        """Its place in the queues of saturated replicas and of scale from zero."""
        return Claim(self.tenant, RANK[self.priority], self.reserved)

    @classmethod
    def reserve(cls, tenant: str, path: str, body: bytes, parsed: Mapping[str, Any]) -> Meter:
        """What a request reserves: its prompt's estimate (its body's length, which holds the prompt, the
        messages and the tools alike) and its completion budget, times its choices."""
        prompt = len(body) // BYTES_PER_TOKEN + 1
        budget = parsed.get("max_completion_tokens", parsed.get("max_tokens"))
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            budget = DEFAULT_RESERVED.get(path.partition("?")[0], 16)
        n = parsed.get("n", 1)
        choices = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 128 else 1
        return cls(tenant, prompt, prompt + budget * choices)

    def read_usage(self, body: bytes | None) -> None:
        """A whole JSON answer's ``usage``: read where its key is (``"usage":`` cannot occur unescaped inside a
        JSON string, and OpenAI's answers put it last), not by parsing the whole answer again."""
        body = body or b""
        at = body.rfind(_USAGE_KEY)
        try:
            if at >= 0:
                usage, _ = _DECODER.raw_decode(body[at + len(_USAGE_KEY) :].decode().lstrip())
            else:  # another layout (spaces after the key, say): the whole answer
                usage = json.loads(body).get("usage")
            usage = usage or {}
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        except (ValueError, AttributeError):
            return
        if isinstance(prompt, int) and isinstance(completion, int):
            self.prompt_tokens, self.completion_tokens = prompt, completion

    def count(self, completion_tokens: int) -> None:
        """A streamed answer's completion tokens, as its records counted them (its prompt stays estimated)."""
        if self.completion_tokens is None:
            self.completion_tokens = completion_tokens

    @property
    def used(self) -> int:
        """Tokens to settle the reservation with: what the answer showed, else what was reserved."""
        completion = (
            self.completion_tokens
            if self.completion_tokens is not None
            else self.reserved - self.prompt_estimate
        )
        return (self.prompt_tokens if self.prompt_tokens is not None else self.prompt_estimate) + completion
