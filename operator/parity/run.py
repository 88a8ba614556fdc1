"""Running the parity gate: the suite against one stable and one canary replica, over HTTP.

Both sides are asked at once, each in batches of `BATCH` prompts with `CONCURRENCY` batches in flight,
so the engine batches them while its other clients' requests keep their fair share of the queue. A
503 (queue full) is retried after its ``Retry-After``; anything else that goes wrong (unreachable
replica, a 4xx, a malformed answer, the gate's timeout) makes a report with verdict ``Error`` that says
why: the canary then waits without traffic, and Degraded says so, until the gate can run.

`GateRunner` keeps at most one gate in flight per InferenceService, in a background task, so that
the operator's passes and `folio up`'s ticks never wait for it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone

import httpx
import numpy as np

from folio.operator.parity.compare import ParityAnswer, compare
from folio.operator.parity.gate import due
from folio.operator.parity.suite import SuiteError, SuitePrompt
from folio.operator.spec import (
    InferenceServiceSpec,
    InferenceServiceStatus,
    ParityReport,
    ParitySpec,
    now_iso,
)

PATH = "/folio/v1/parity"
BATCH = 16
CONCURRENCY = 2
MAX_503_RETRIES = 30


class GateError(RuntimeError):
    """The gate could not get comparable answers from a replica."""


async def fetch_answers(
    client: httpx.AsyncClient, base_url: str, suite: Sequence[SuitePrompt], max_tokens: int, timeout: float,
    model: str | None = None,
) -> list[ParityAnswer]:
    """``model``: the model (an adapter) the replica answers as; None: its base model."""
    batches = [suite[i : i + BATCH] for i in range(0, len(suite), BATCH)]
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(batch: Sequence[SuitePrompt]) -> list[ParityAnswer]:
        async with limit:
            return await _post(client, base_url, batch, max_tokens, timeout, model)

    parts = await asyncio.gather(*(one(b) for b in batches))
    return [a for part in parts for a in part]


async def _post(
    client: httpx.AsyncClient, base_url: str, batch: Sequence[SuitePrompt], max_tokens: int, timeout: float,
    model: str | None,
) -> list[ParityAnswer]:
    body: dict[str, object] = {"prompts": [p.to_wire() for p in batch], "maxTokens": max_tokens}
    if model is not None:
        body["model"] = model
    url = base_url.rstrip("/") + PATH
    for _ in range(MAX_503_RETRIES):
        try:
            r = await client.post(url, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            raise GateError(f"{url}: {type(exc).__name__}: {exc}") from None
        if r.status_code == 503:
            await asyncio.sleep(_retry_after(r))
            continue
        if r.status_code != 200:
            raise GateError(f"{url} answered {r.status_code}: {error_message(r)}")
        return _decode(r, len(batch), url)
    raise GateError(f"{url} stayed overloaded (503) through {MAX_503_RETRIES} tries")


def _decode(r: httpx.Response, count: int, url: str) -> list[ParityAnswer]:
    try:
        results = r.json()["results"]
        if len(results) != count:
            raise GateError(f"{url} answered {len(results)} results for {count} prompts")
        return [
            ParityAnswer(
                prompt_token_ids=list(r["promptTokenIds"]),
                mean_logits=np.frombuffer(base64.b64decode(r["meanLogits"]), dtype="<f4"),
                token_ids=list(r["tokenIds"]),
                text=str(r["text"]),
            )
            for r in results
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise GateError(f"{url} answered a malformed parity response: {exc!r}") from None


def _retry_after(r: httpx.Response) -> float:
    try:
        return min(10.0, max(0.1, float(r.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


def error_message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return r.text[:300]


async def run_gate(
    client: httpx.AsyncClient,
    *,
    stable_url: str,
    canary_url: str,
    load_suite: Callable[[], Awaitable[list[SuitePrompt]]],
    spec: ParitySpec,
    revision: str,
    stable_revision: str | None,
    now: Callable[[], str],
    stable_model: str | None = None,
    canary_model: str | None = None,
) -> ParityReport:
    """The gate's report; never raises for what a replica or the suite did wrong (verdict Error then)."""
    started = time.monotonic()

    def error(message: str) -> ParityReport:
        return ParityReport(revision=revision, stable_revision=stable_revision, at=now(), verdict="Error",
                            message=message, seconds=round(time.monotonic() - started, 3))

    try:
        suite = (await load_suite())[: spec.prompts]
    except SuiteError as exc:
        return error(f"the prompt suite cannot be used: {exc}")
    if not suite:
        return error("the prompt suite holds no prompt")
    per_request = spec.timeout_seconds
    try:
        stable, canary = await asyncio.wait_for(
            asyncio.gather(
                fetch_answers(client, stable_url, suite, spec.max_tokens, per_request, stable_model),
                fetch_answers(client, canary_url, suite, spec.max_tokens, per_request, canary_model),
            ),
            spec.timeout_seconds,
        )
    except GateError as exc:
        return error(str(exc))
    except asyncio.TimeoutError:
        return error(f"the gate took longer than its timeout {spec.timeout}")
    seconds = round(time.monotonic() - started, 3)
    return compare(suite, stable, canary, spec, revision=revision, stable_revision=stable_revision,
                   at=now(), seconds=seconds)


class GateRunner:
    """At most one gate in flight for one InferenceService; its report is handed out once."""

    def __init__(self) -> None:
        self._task: asyncio.Task[ParityReport] | None = None
        self._key: tuple[str, ...] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def poll(self, key: tuple[str, ...] | None, start: Callable[[], Awaitable[ParityReport]]) -> ParityReport | None:
        """``key`` names the gate that is due now (canary, stable, …), None when none is. Starts it if it
        is not running; returns its report once, when done. A gate no longer due is cancelled."""
        if key != self._key:
            self.cancel()
            self._key = key
        if key is None:
            return None
        if self._task is None:
            self._task = asyncio.ensure_future(start())
            return None
        if not self._task.done():
            return None
        task, self._task, self._key = self._task, None, None
        if task.cancelled() or task.exception() is not None:  # a bug, not the replicas': report it, retry later
            why = "cancelled" if task.cancelled() else repr(task.exception())
            return ParityReport(revision=key[0], stable_revision=key[1] if len(key) > 1 else None,
                                verdict="Error", message=f"the gate failed: {why}")
        return task.result()

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task, self._key = None, None


def poll_gate(
    runner: GateRunner,
    client: httpx.AsyncClient | None,
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    now: datetime,
    *,
    urls: Callable[[str], Sequence[str]],
    load_suite: Callable[[], Awaitable[list[SuitePrompt]]],
    model: Callable[[str], str | None] = lambda revision: None,
) -> ParityReport | None:
    """What the operator's passes and `folio up`'s ticks call: runs the gate that is due (in the
    background) and returns its report once it is done. ``urls`` gives a revision's replica base URLs;
    ``client`` None: the gate opens (and closes) a client of its own; ``model``: what a revision answers as
    (an adapter revision's engine name; None: the replica's base model)."""
    key = due(spec, status, now)
    gate = spec.rollout.parity

    async def start() -> ParityReport:
        assert key is not None and gate is not None
        canary, stable = key
        at = lambda: now_iso(datetime.now(timezone.utc))  # noqa: E731
        sides = {rev: list(urls(rev)) for rev in (canary, stable)}
        missing = [rev for rev, found in sides.items() if not found]
        if missing:
            return ParityReport(revision=canary, stable_revision=stable, at=at(), verdict="Error",
                                message=f"no replica address for revision {', '.join(missing)}")
        async with contextlib.AsyncExitStack() as stack:
            http = client or await stack.enter_async_context(httpx.AsyncClient(trust_env=False))
            return await run_gate(http, stable_url=sides[stable][0], canary_url=sides[canary][0],
                                  load_suite=load_suite, spec=gate, revision=canary, stable_revision=stable, now=at,
                                  stable_model=model(stable), canary_model=model(canary))

    return runner.poll(key, start)
