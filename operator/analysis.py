"""Canary analysis: turn router metrics into one `AnalysisSample` per interval.

Two sources, same figures:

- **Router scrapes** (the default). Every router pod's ``/metrics`` is read each interval; the
  figures are the *deltas* since the previous scrape of that same pod, summed over pods. A pod seen
  for the first time only sets its baseline (its counters hold history of unknown age), and any
  counter that went down means the pod restarted, so its whole new scrape is the delta.
- **Prometheus** (``analysis.prometheus.url``): the same figures with PromQL ``increase`` over the
  interval.

Per revision: requests (one per upstream attempt), errors (5xx and ``code="error"``, which includes
the canary attempts the router then retried on stable: they count against the canary even though
the client got an answer), p99 latency from the duration histogram, p95 time to first token.

Verdict: fewer than ``minRequests`` canary requests is *Inconclusive* (never a pass); otherwise
*Fail* when any threshold is exceeded, else *Pass*. Reasons say which figure broke which limit.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import httpx
from prometheus_client.parser import text_string_to_metric_families

from folio.operator.spec import AnalysisSample, AnalysisSpec, now_iso
from folio.operator.status import as_utc

REQUESTS = "folio_router_requests_total"
DURATION = "folio_router_request_duration_seconds"
TTFT = "folio_router_time_to_first_token_seconds"

Buckets = dict[float, float]  # upper bound (le) -> cumulative count


@dataclass
class RevisionWindow:
    """Counters of one revision: absolute values in a scrape, or increases over an interval."""

    codes: dict[str, float] = field(default_factory=dict)
    duration: Buckets = field(default_factory=dict)
    ttft: Buckets = field(default_factory=dict)

    @property
    def requests(self) -> float:
        return sum(self.codes.values())

    @property
    def errors(self) -> float:
        return sum(n for code, n in self.codes.items() if is_error(code))


Snapshot = dict[str, RevisionWindow]  # revision -> counters


def is_error(code: str) -> bool:
    """A failed upstream attempt: a 5xx answer, or no answer at all (``error``)."""
    return code == "error" or (len(code) == 3 and code.startswith("5"))


def parse_router_metrics(text: str, isvc: str) -> Snapshot:
    """The per-revision counters of ``isvc`` in one router's Prometheus text exposition."""
    snap: Snapshot = defaultdict(RevisionWindow)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = s.labels
            if labels.get("isvc") != isvc or "revision" not in labels:
                continue
            rev = snap[labels["revision"]]
            if s.name == REQUESTS:
                code = labels.get("code", "")
                rev.codes[code] = rev.codes.get(code, 0.0) + s.value
            elif s.name == f"{DURATION}_bucket":
                rev.duration[float(labels["le"])] = s.value
            elif s.name == f"{TTFT}_bucket":
                rev.ttft[float(labels["le"])] = s.value
    return dict(snap)


def _parts(w: RevisionWindow) -> tuple[dict, dict, dict]:
    return w.codes, w.duration, w.ttft


def _went_down(current: Snapshot, previous: Snapshot) -> bool:
    for name, before in previous.items():
        now = current.get(name, RevisionWindow())
        for b, n in zip(_parts(before), _parts(now), strict=True):
            if any(n.get(key, -1.0) < value for key, value in b.items()):
                return True
    return False


def delta(current: Snapshot, previous: Snapshot) -> Snapshot:
    """What happened between two scrapes of the same router pod.

    If any series went down (or vanished) the pod restarted in between: everything it counts now
    happened since, so the current scrape is the delta.
    """
    if _went_down(current, previous):
        return current
    empty = RevisionWindow()
    return {
        name: RevisionWindow(
            *(
                {key: value - b.get(key, 0.0) for key, value in n.items()}
                for n, b in zip(_parts(now), _parts(previous.get(name, empty)), strict=True)
            )
        )
        for name, now in current.items()
    }


def merge(windows: Iterable[Snapshot]) -> Snapshot:
    """Sum the windows of several router pods."""
    out: Snapshot = defaultdict(RevisionWindow)
    for snap in windows:
        for name, w in snap.items():
            for src, dst in zip(_parts(w), _parts(out[name]), strict=True):
                for key, value in src.items():
                    dst[key] = dst.get(key, 0.0) + value
    return dict(out)


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative buckets; None without observations.

    Linear interpolation inside the bucket holding the rank; a rank in the ``+Inf`` bucket
    returns the largest finite bound (the histogram cannot say more).
    """
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0 or not math.isinf(bounds[-1]):
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = max(buckets[le], below)  # cumulative counts never decrease; guard against skew
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return None  # unreachable: the +Inf bucket holds every observation


@dataclass(frozen=True)
class Figures:
    """One interval's figures for the canary, compared with stable (latencies in ms)."""

    requests: float
    errors: float
    latency_p99_ms: float | None
    stable_latency_p99_ms: float | None
    ttft_p95_ms: float | None


def figures_from_windows(window: Snapshot, canary: str, stable: str | None) -> Figures:
    c = window.get(canary, RevisionWindow())
    s = window.get(stable, RevisionWindow()) if stable else RevisionWindow()
    return Figures(
        requests=c.requests,
        errors=c.errors,
        latency_p99_ms=_ms(histogram_quantile(0.99, c.duration)),
        stable_latency_p99_ms=_ms(histogram_quantile(0.99, s.duration)),
        ttft_p95_ms=_ms(histogram_quantile(0.95, c.ttft)),
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def judge(figures: Figures, spec: AnalysisSpec, now: datetime, notes: Sequence[str] = ()) -> AnalysisSample:
    """The verdict on one interval, with the figures and the reasons behind it."""
    requests, errors = round(figures.requests), round(figures.errors)
    rate = errors / requests if requests else 0.0
    reasons: list[str] = list(notes)
    if requests < spec.min_requests:
        verdict = "Inconclusive"
        reasons.append(f"only {requests} canary requests in the interval (minRequests {spec.min_requests})")
    else:
        failures = []
        if rate > spec.max_error_rate:
            failures.append(
                f"error rate {rate:.2%} ({errors}/{requests}) exceeds maxErrorRate {spec.max_error_rate:.2%}"
            )
        p99, stable_p99 = figures.latency_p99_ms, figures.stable_latency_p99_ms
        if p99 is not None and stable_p99 is not None:
            increase = p99 - stable_p99
            if increase > spec.max_latency_p99_increase_ms:
                failures.append(
                    f"p99 latency {p99:.0f} ms is {increase:.0f} ms above stable's {stable_p99:.0f} ms "
                    f"(maxLatencyP99IncreaseMs {spec.max_latency_p99_increase_ms:g})"
                )
        ttft = figures.ttft_p95_ms
        if ttft is not None and ttft > spec.max_time_to_first_token_p95_ms:
            failures.append(
                f"TTFT p95 {ttft:.0f} ms exceeds maxTimeToFirstTokenP95Ms "
                f"{spec.max_time_to_first_token_p95_ms:g}"
            )
        verdict = "Fail" if failures else "Pass"
        reasons += failures or ["error rate, latency and time to first token within limits"]
    return AnalysisSample(
        at=now_iso(as_utc(now)),
        requests=requests,
        errors=errors,
        error_rate=rate,
        latency_p99_ms=figures.latency_p99_ms,
        stable_latency_p99_ms=figures.stable_latency_p99_ms,
        ttft_p95_ms=figures.ttft_p95_ms,
        verdict=verdict,
        reasons=reasons,
    )


class RouterScrapes:
    """Keeps each router pod's previous scrape and turns new scrapes into interval windows.

    The state lives in memory only: after an operator restart the first interval is a baseline
    (Inconclusive), which costs one interval and never a wrong verdict.
    """

    def __init__(self, isvc: str) -> None:
        self.isvc = isvc
        self._previous: dict[str, Snapshot] = {}

    def ingest(self, texts: Mapping[str, str]) -> tuple[Snapshot, list[str]]:
        """Window since the previous scrapes, from ``{pod url: metrics text}``; plus notes."""
        windows, notes = [], []
        for url, text in texts.items():
            try:
                current = parse_router_metrics(text, self.isvc)
            except ValueError as exc:
                notes.append(f"unreadable metrics from router {url}: {exc}")
                continue
            previous = self._previous.get(url)
            self._previous[url] = current
            if previous is None:
                notes.append(f"router {url} scraped for the first time (baseline)")
            else:
                windows.append(delta(current, previous))
        # forget pods that are gone so a reused address starts from a fresh baseline
        for url in set(self._previous) - set(texts):
            del self._previous[url]
        return merge(windows), notes

    def sample(
        self, texts: Mapping[str, str], canary: str, stable: str | None, spec: AnalysisSpec, now: datetime,
        notes: Sequence[str] = (),
    ) -> AnalysisSample:
        window, more = self.ingest(texts)
        return judge(figures_from_windows(window, canary, stable), spec, now, [*notes, *more])


class IntervalSampler:
    """One analysis sample per ``analysis.interval``, however the routers are found (local or cluster).

    Routers are scraped every interval even while no canary takes traffic, so that a canary's first
    interval already has a baseline and yields a real sample rather than an inconclusive one.
    """

    def __init__(self, isvc: str) -> None:
        self.isvc = isvc
        self.scrapes = RouterScrapes(isvc)
        self._next = 0.0  # monotonic time of the next sample

    def due(self, spec: AnalysisSpec) -> bool:
        """True once per interval; a True answer starts the next interval."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + spec.interval_seconds
        return True

    async def take(
        self,
        client: httpx.AsyncClient,
        router_urls: Callable[[], Awaitable[Sequence[str]]],
        *,
        canary: str | None,
        stable: str | None,
        spec: AnalysisSpec,
    ) -> AnalysisSample | None:
        """Scrape now; a sample when ``canary`` takes traffic (None: only the baseline moves)."""
        wall = datetime.now(timezone.utc)
        if spec.prometheus is not None:
            if canary is None:
                return None
            return await prometheus_sample(client, spec.prometheus.url, self.isvc, canary, stable, spec, wall)
        texts, notes = await scrape_routers(client, await router_urls())
        if canary is None:
            self.scrapes.ingest(texts)  # keeps the baseline current
            return None
        return self.scrapes.sample(texts, canary, stable, spec, wall, notes)


async def scrape_routers(client: httpx.AsyncClient, urls: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """GET every router's /metrics; unreachable ones are left out and named in the notes."""
    texts, notes = {}, []
    for url in urls:
        try:
            resp = await client.get(url, timeout=5.0)
            resp.raise_for_status()
            texts[url] = resp.text
        except httpx.HTTPError as exc:
            notes.append(f"router {url} not scraped: {exc!r}")
    return texts, notes


# --------------------------------------------------------------------------- Prometheus


def promql_queries(isvc: str, canary: str, stable: str | None, window: str) -> dict[str, str]:
    """The PromQL behind each figure; ``window`` is the analysis interval (e.g. ``30s``)."""

    def sel(rev: str, extra: str = "") -> str:
        return f'{{isvc="{isvc}",revision="{rev}"{extra}}}'

    def p(q: float, metric: str, rev: str) -> str:
        return f"histogram_quantile({q}, sum by (le) (increase({metric}_bucket{sel(rev)}[{window}])))"

    errors = ',code=~"5..|error"'
    queries = {
        "requests": f"sum(increase({REQUESTS}{sel(canary)}[{window}]))",
        "errors": f"sum(increase({REQUESTS}{sel(canary, errors)}[{window}]))",
        "latency_p99": p(0.99, DURATION, canary),
        "ttft_p95": p(0.95, TTFT, canary),
    }
    if stable:
        queries["stable_latency_p99"] = p(0.99, DURATION, stable)
    return queries


def _scalar(body: dict) -> float | None:
    """The single value of an instant-query answer; None when empty or NaN (no observations)."""
    if body.get("status") != "success":
        raise ValueError(f"Prometheus answered {body.get('errorType', 'error')}: {body.get('error', body)}")
    result = body["data"]["result"]
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) else value


async def prometheus_figures(
    client: httpx.AsyncClient, base_url: str, isvc: str, canary: str, stable: str | None,
    spec: AnalysisSpec, now: datetime,
) -> Figures:
    """The interval's figures from Prometheus' HTTP API (instant queries evaluated at ``now``)."""
    values: dict[str, float | None] = {}
    for key, query in promql_queries(isvc, canary, stable, spec.interval).items():
        resp = await client.get(
            f"{base_url.rstrip('/')}/api/v1/query",
            params={"query": query, "time": f"{as_utc(now).timestamp():.3f}"},
            timeout=10.0,
        )
        resp.raise_for_status()
        values[key] = _scalar(resp.json())
    return Figures(
        requests=values["requests"] or 0.0,
        errors=values["errors"] or 0.0,
        latency_p99_ms=_ms(values["latency_p99"]),
        stable_latency_p99_ms=_ms(values.get("stable_latency_p99")),
        ttft_p95_ms=_ms(values["ttft_p95"]),
    )


async def prometheus_sample(
    client: httpx.AsyncClient, base_url: str, isvc: str, canary: str, stable: str | None,
    spec: AnalysisSpec, now: datetime,
) -> AnalysisSample:
    """`judge` on Prometheus figures; an unreachable Prometheus is Inconclusive, never a pass."""
    try:
        figures = await prometheus_figures(client, base_url, isvc, canary, stable, spec, now)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        empty = Figures(0.0, 0.0, None, None, None)
        return judge(empty, spec, now, [f"Prometheus at {base_url} could not be queried: {exc}"])
    return judge(figures, spec, now)
