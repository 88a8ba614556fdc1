"""Router pods for the analysis tests: the router's own `RouterMetrics`, so that what the tests feed the
analysis is exactly what a router exports."""

from __future__ import annotations

from folio.operator.router.metrics import RouterMetrics

# Fine buckets (5 ms apart), so that quantiles can be checked against the true ones.
BUCKETS = (*(round(0.005 * i, 3) for i in range(1, 200)), 2.0, 5.0, 10.0, 30.0, 60.0)


class Router:
    """One router pod's metrics, recorded through the router's own metrics class."""

    def __init__(self, isvc: str = "chat") -> None:
        self.metrics = RouterMetrics(isvc, buckets=BUCKETS)

    def serve(self, revision: str, code: str, seconds: float, ttft: float | None = None) -> None:
        self.metrics.attempt_started(revision)
        self.metrics.attempt_finished(revision, code, seconds)
        if ttft is not None:
            self.metrics.first_byte(revision, ttft)

    def text(self) -> str:
        return self.metrics.render().decode()
