"""A steady chat load on a router with the official `openai` client, counting every failure.

Its own retries are off, so every failure the router lets through is counted: the demo's and the
end-to-end tests' "no client request failed during the rollout".
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class LoadStats:
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


class LoadGenerator:
    """``concurrency`` threads sending chat requests back to back until stopped."""

    PROMPTS = (
        "Name a colour.",
        "What is two plus two?",
        "Say hello in French.",
        "Name a planet.",
        "What do bees make?",
    )

    def __init__(self, base_url: str, model: str, *, concurrency: int = 3, max_tokens: int = 8) -> None:
        import openai

        self.client = openai.OpenAI(
            base_url=f"{base_url}/v1", api_key="folio-demo", max_retries=0, timeout=60
        )
        self.model, self.concurrency, self.max_tokens = model, concurrency, max_tokens
        self.stats = LoadStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> LoadGenerator:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._run, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def snapshot(self) -> LoadStats:
        with self._lock:
            return LoadStats(
                self.stats.ok, self.stats.failed, list(self.stats.errors), list(self.stats.latencies)
            )

    def _run(self, worker: int) -> None:
        import openai

        n = worker
        while not self._stop.is_set():
            prompt = self.PROMPTS[n % len(self.PROMPTS)]
            n += 1
            start = time.monotonic()
            try:
                self.client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=self.max_tokens,
                    temperature=0.0,
                )
            except openai.OpenAIError as exc:
                with self._lock:
                    self.stats.failed += 1
                    self.stats.errors.append(f"{type(exc).__name__}: {exc}")
            else:
                with self._lock:
                    self.stats.ok += 1
                    self.stats.latencies.append(time.monotonic() - start)
