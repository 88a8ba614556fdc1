"""Per-tenant quotas: requests and tokens per minute (token buckets) and requests in flight.

A bucket holds up to its per-minute limit and refills at limit / 60 per second, so a tenant may burst up
to a minute's worth and then goes at its rate, as OpenAI's limits behave. Tokens are reserved at admission
(the prompt's estimate plus ``max_tokens``) and settled from the answer's real usage (`TenantQuota.settle`):
a reservation larger than the usage is given back, a smaller one leaves the bucket in debt, which the
tenant's next requests wait out. Each router enforces its share of the limits (``share``: 1 / the
routers of the service), so the routers together hold to them with no shared store.

Answers carry OpenAI's headers (`headers`): ``x-ratelimit-limit-requests``, ``-remaining-requests``,
``-reset-requests`` and the ``-tokens`` three, for the limits the tenant has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class Bucket:
    """Up to ``capacity`` units, refilled at capacity / 60 per second; may go below 0 (debt) on settling."""

    def __init__(self, capacity: float, now: float) -> None:
        assert capacity > 0
        self.capacity = capacity
        self.capacity_text = str(int(capacity))
        self.rate = capacity / 60.0
        self._level = capacity
        self._at = now

    def level(self, now: float) -> float:
        if now > self._at:
            self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
            self._at = now
        return self._level

    def can_take(self, n: float, now: float) -> bool:
        """Whether ``n`` may be taken now; more than the capacity is allowed from a full bucket, so a request
        larger than a minute's limit is refused only while others use the bucket (never for ever)."""
        return self.level(now) >= min(n, self.capacity)

    def take(self, n: float) -> None:
        """After `can_take` said yes, at the same ``now`` (`level` brought the bucket up to then)."""
        self._level -= n

    def give(self, n: float, now: float) -> None:
        """Return ``n`` (negative: take more, into debt)."""
        self._level = min(self.capacity, self.level(now) + n)

    def wait(self, n: float, now: float) -> float:
        """Seconds until ``n`` may be taken."""
        return max(0.0, (min(n, self.capacity) - self.level(now)) / self.rate)

    def until_full(self, now: float) -> float:
        return max(0.0, (self.capacity - self.level(now)) / self.rate)


_REQUEST_HEADERS = ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests")
_TOKEN_HEADERS = ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_in_flight: int | None = None


@dataclass(frozen=True)
class Refusal:
    """Why a request is over quota, and when to try again."""

    message: str
    retry_after: float  # seconds


@dataclass
class TenantQuota:
    """One tenant's usage against its limits (each times ``share``) in this router."""

    limits: Limits
    now: float
    share: float = 1.0
    requests: Bucket | None = field(init=False, default=None)
    tokens: Bucket | None = field(init=False, default=None)
    in_flight: int = field(init=False, default=0)
    max_in_flight: int | None = field(init=False, default=None)  # this router's share of maxInFlight

    def __post_init__(self) -> None:
        if self.limits.requests_per_minute is not None:
            self.requests = Bucket(max(1.0, self.limits.requests_per_minute * self.share), self.now)
        if self.limits.tokens_per_minute is not None:
            self.tokens = Bucket(max(1.0, self.limits.tokens_per_minute * self.share), self.now)
        if self.limits.max_in_flight is not None:
            self.max_in_flight = max(1, math.floor(self.limits.max_in_flight * self.share))

    def refusal(self, tokens: int, now: float) -> Refusal | None:
        """Why a request reserving ``tokens`` may not start now, or None: the check of `admit`."""
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            # Nothing says when one ends: a second is about what a short answer takes.
            return Refusal(f"{self.in_flight} requests in flight, the most allowed (maxInFlight)", 1.0)
        if self.requests is not None and not self.requests.can_take(1, now):
            return Refusal(f"rate limit of {self.limits.requests_per_minute} requests per minute reached",
                           self.requests.wait(1, now))  # fmt: skip
        if self.tokens is not None and not self.tokens.can_take(tokens, now):
            return Refusal(f"rate limit of {self.limits.tokens_per_minute} tokens per minute reached "
                           f"({tokens} reserved for this request)", self.tokens.wait(tokens, now))  # fmt: skip
        return None

    def admit(self, tokens: int) -> None:
        """After `refusal` said none, at the same time: takes one request and ``tokens`` (reserved) from the
        buckets, and one place in flight. (Not checked again: every request of a tenant pays for this.)"""
        if self.requests is not None:
            self.requests.take(1)
        if self.tokens is not None:
            self.tokens.take(tokens)
        self.in_flight += 1

    def settle(self, reserved: int, used: int, now: float) -> None:
        """The request ended having used ``used`` tokens of the ``reserved``: its place in flight is free."""
        assert self.in_flight > 0
        self.in_flight -= 1
        if self.tokens is not None:
            self.tokens.give(reserved - used, now)

    def headers(self, now: float) -> list[tuple[str, str]]:
        """OpenAI's rate-limit headers for the limits this tenant has (on every answer: kept cheap)."""
        out = []
        for (limit, remaining, reset), bucket in ((_REQUEST_HEADERS, self.requests), (_TOKEN_HEADERS, self.tokens)):
            if bucket is not None:
                level = bucket.level(now)
                out.append((limit, bucket.capacity_text))
                out.append((remaining, str(int(level)) if level > 0 else "0"))
                out.append((reset, duration((bucket.capacity - level) / bucket.rate)))
        return out

    def reshare(self, limits: Limits, share: float, now: float) -> TenantQuota:
        """This tenant's quota under new limits or a new share, keeping what was used (as a fraction)."""
        fresh = TenantQuota(limits, now, share)
        fresh.in_flight = self.in_flight
        for old, new in ((self.requests, fresh.requests), (self.tokens, fresh.tokens)):
            if old is not None and new is not None:
                new.give(-(1 - old.level(now) / old.capacity) * new.capacity, now)
        return fresh


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``250ms``."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
