"""The internal extension by which Folio's router follows an answer and continues it on another replica.

A router that may continue requests (``spec.router.migration.maxAttempts`` > 0) sends each completion and
chat request with ``X-Folio-Resumable: 1``. An engine that honours it answers with the same header, the
answer's ``id`` and ``created`` in ``X-Folio-Response-Id`` / ``X-Folio-Created``, and a *record* for
everything it sends of a choice: a server-sent-event comment line, which the router strips (and any other
SSE reader ignores), holding JSON::

    : folio-resume {"index": 0, "token_ids": [1, 2]}
    data: {...the chunk the client sees...}

- A streamed request: every event that carries a choice's output (its opening, each piece) starts with the
  choice's record: its index, the token ids since its previous record and, once it has finished, its
  ``finish_reason`` and ``stop_reason``. Events that carry no choice (the usage chunk, ``[DONE]``) have none.
- A request that is not streamed is answered as an event stream too (content type ``text/event-stream``):
  records alone, one event each, as the choices progress, then one ``data:`` event holding the whole JSON
  response, and the end. Their records also carry what the whole answer needs again after a seam: each
  token's ``logprobs`` entry (``[[token_id, logprob], ...]``) and, in a choice's first record of an
  ``echo`` request, its ``prompt_logprobs``.
- An answer the engine cannot finish (it is stopping, its loop died, a step failed) ends with a ``failed``
  record, ``{"failed": "<error code>", "message": "..."}``, before the error event: the router continues the
  request elsewhere instead of relaying the error.

To continue, the router sends the client's body again with one more field, `RESUME_FIELD`::

    "folio_resume": {"id": "cmpl-…", "created": 1733…,
                     "choices": [{"index": 0, "token_ids": [...], "finish_reason": null, ...}]}

listing every choice the client has anything of (an opened chat choice may have no tokens yet), with all it
has: its tokens (and, for a request that is not streamed, their logprobs and its prompt logprobs) and, for
a finished choice, how it finished. The engine answers under the given ``id`` and ``created``: a listed
unfinished choice continues after its tokens (the same sampling parameters; its stop strings, penalties,
``max_tokens`` and seeded random stream carry on across the seam) without opening again, a finished one is
only counted (and, unstreamed, rendered whole), an unlisted one starts from the beginning. Usage counts
the whole answer. The client sees no seam.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

RESUMABLE_HEADER = "X-Folio-Resumable"
RESPONSE_ID_HEADER = "X-Folio-Response-Id"
CREATED_HEADER = "X-Folio-Created"
RESUME_FIELD = "folio_resume"
RECORD_PREFIX = b": folio-resume "
_PREFIX = RECORD_PREFIX.decode()


@dataclass(frozen=True)
class Record:
    """One record, as the engine writes it and the router reads it."""

    index: int | None = None  # the choice (None: a ``failed`` record)
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[list[list[float]]] | None = None  # per token: [[token_id, logprob], ...] (unstreamed only)
    prompt_logprobs: list[list[list[float]] | None] | None = None  # per prompt token (unstreamed echo only)
    failed: str | None = None  # the error code of an answer the engine could not finish
    message: str | None = None

    def line(self) -> str:
        """The record as its comment line, newline included."""
        body: dict[str, Any]
        if self.failed is not None:
            body = {"failed": self.failed, "message": self.message or ""}
        else:
            body = {"index": self.index, "token_ids": list(self.token_ids)}
            if self.finish_reason is not None:
                body["finish_reason"] = self.finish_reason
                body["stop_reason"] = self.stop_reason
            if self.logprobs is not None:
                body["logprobs"] = self.logprobs
            if self.prompt_logprobs is not None:
                body["prompt_logprobs"] = self.prompt_logprobs
        return _PREFIX + json.dumps(body, separators=(",", ":")) + "\n"

    @classmethod
    def parse(cls, payload: bytes) -> Record:
        """A record from the JSON after `RECORD_PREFIX`; ValueError when it is not one."""
        raw = json.loads(payload)
        if not isinstance(raw, dict):
            raise ValueError("a record must be a JSON object")
        if "failed" in raw:
            return cls.failure(raw)
        index, ids = raw.get("index"), raw.get("token_ids", [])
        if not isinstance(index, int) or not isinstance(ids, list):
            raise ValueError("a record needs an integer index and a list of token_ids")
        return cls(
            index=index, token_ids=tuple(ids), finish_reason=raw.get("finish_reason"),
            stop_reason=raw.get("stop_reason"), logprobs=raw.get("logprobs"),
            prompt_logprobs=raw.get("prompt_logprobs"),
        )  # fmt: skip

    @classmethod
    def failure(cls, raw: dict[str, Any]) -> Record:
        """The ``failed`` record of a parsed JSON object that holds the key ``failed``."""
        return cls(failed=str(raw["failed"]), message=str(raw.get("message", "")))
