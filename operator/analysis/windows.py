"""Per-revision counters from a router's metrics, what happened between two scrapes, and the figures.

A window holds one revision's counters: absolute values in a scrape, or increases over an
interval. Between two scrapes of the same router pod the window is the difference, unless a series
went down: then the pod restarted, and everything it counts now happened since.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from folio.operator import metric_names as m

Buckets = dict[float, float]  # upper bound (le) -> cumulative count


@dataclass
class RevisionWindow:
    """Counters of one revision: absolute values in a scrape, or increases over an interval."""

    codes: dict[str, float] = field(default_factory=dict)
    duration: Buckets = field(default_factory=dict)
    ttft: Buckets = field(default_factory=dict)
    shadow: dict[str, float] = field(default_factory=dict)  # shadow comparisons by result (match, …)

    @property
    def requests(self) -> float:
        return sum(self.codes.values())

    @property
    def errors(self) -> float:
        return sum(n for code, n in self.codes.items() if m.is_error(code))

    @property
    def timeouts(self) -> float:
        return self.codes.get(m.TIMEOUT, 0.0)


Snapshot = dict[str, RevisionWindow]  # revision -> counters


def parse_router_metrics(text: str, isvc: str, adapter: str | None = None) -> Snapshot:
    """The per-revision counters of ``isvc`` in one router's Prometheus text exposition: every request's by
    base revision, or (``adapter``) that adapter's requests' by adapter revision."""
    snap: Snapshot = defaultdict(RevisionWindow)
    key = m.REVISION if adapter is None else m.ADAPTER_REVISION
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = s.labels
            if labels.get(m.ISVC) != isvc or not labels.get(key):
                continue
            if adapter is not None and labels.get(m.ADAPTER) != adapter:
                continue
            rev = snap[labels[key]]
            if s.name == m.REQUESTS:
                _add(rev.codes, labels.get(m.CODE, ""), s.value)
            elif s.name == f"{m.DURATION}_bucket":
                _add(rev.duration, float(labels["le"]), s.value)
            elif s.name == f"{m.TTFT}_bucket":
                _add(rev.ttft, float(labels["le"]), s.value)
            elif s.name == m.SHADOW_COMPARISONS:
                _add(rev.shadow, labels.get(m.RESULT, ""), s.value)
    return dict(snap)


def _add(counts: dict, key: object, value: float) -> None:
    """Series that differ only in labels this window does not keep (a revision's adapters) add up."""
    counts[key] = counts.get(key, 0.0) + value


def _parts(w: RevisionWindow) -> tuple[dict, dict, dict, dict]:
    return w.codes, w.duration, w.ttft, w.shadow


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
    """Sum the windows of several router pods, or a grown window's counters and the next interval's."""
    out: Snapshot = defaultdict(RevisionWindow)
    for snap in windows:
        for name, w in snap.items():
            acc = out[name]
            for key, value in w.codes.items():
                acc.codes[key] = acc.codes.get(key, 0.0) + value
            for key, value in w.shadow.items():
                acc.shadow[key] = acc.shadow.get(key, 0.0) + value
            acc.duration = add_buckets(acc.duration, w.duration)
            acc.ttft = add_buckets(acc.ttft, w.ttft)
    return dict(out)


def add_buckets(a: Buckets, b: Buckets) -> Buckets:
    """The sum of two cumulative histograms that may not name the same bounds (status keeps a trimmed one).

    A cumulative histogram is a step function of the bound: at a bound it does not name it counts what its
    largest named bound below holds (nothing below its first). Adding key by key instead would leave a
    bound only one side names without the other's observations below it, and a quantile would land in ``+Inf``.
    """
    if not a or not b:
        return dict(a or b)
    return {le: _at(a, le) + _at(b, le) for le in sorted({*a, *b})}


def _at(buckets: Buckets, le: float) -> float:
    below = [bound for bound in buckets if bound <= le]
    return buckets[max(below)] if below else 0.0


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
    timeouts: float = 0.0
    shadow_matches: float = 0.0  # mirrored requests whose canary answer matched the primary's
    shadow_compared: float = 0.0  # of all compared (match, mismatch, error)


NO_FIGURES = Figures(0.0, 0.0, None, None, None)


def figures_from_windows(window: Snapshot, canary: str, stable: str | None) -> Figures:
    c = window.get(canary, RevisionWindow())
    s = window.get(stable, RevisionWindow()) if stable else RevisionWindow()
    return Figures(
        requests=c.requests,
        errors=c.errors,
        latency_p99_ms=ms(histogram_quantile(0.99, c.duration)),
        stable_latency_p99_ms=ms(histogram_quantile(0.99, s.duration)),
        ttft_p95_ms=ms(histogram_quantile(0.95, c.ttft)),
        timeouts=c.timeouts,
        shadow_matches=c.shadow.get("match", 0.0),
        shadow_compared=sum(c.shadow.values()),
    )


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0
