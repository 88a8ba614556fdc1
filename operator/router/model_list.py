"""`GET /v1/models` through the router: the engine's list as clients may use it.

An engine lists each adapter revision it holds under the name Folio loaded it by (``NAME@REVISION``,
`folio.operator.serving.adapters.engine_name`); a client sends NAME. So the router lists each adapter it
routes once, under NAME, and none it does not route (one being loaded, or drained after its removal).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any


def served_models(body: bytes, adapters: Collection[str]) -> bytes:
    """The engine's ``/v1/models`` answer with its adapter cards named as clients send them; ``body``
    unchanged when it is not a model list."""
    try:
        doc = json.loads(body)
        cards: list[dict[str, Any]] = doc["data"]
    except (ValueError, KeyError, TypeError):
        return body
    kept, seen = [], set()
    for card in cards:
        if isinstance(card, dict) and card.get("parent") and isinstance(card.get("id"), str):
            name = card["id"].rpartition("@")[0] or card["id"]
            if name not in adapters or name in seen:
                continue
            seen.add(name)
            card = {**card, "id": name}
        kept.append(card)
    return json.dumps({**doc, "data": kept}).encode()
