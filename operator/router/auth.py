"""Optional API-key auth: `Authorization: Bearer <key>` against a fixed set of keys."""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from pathlib import Path


class ApiKeys:
    """An empty set means auth is off."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        # Compared as bytes so a non-ASCII header value cannot raise in compare_digest.
        self._keys = [k.encode() for k in dict.fromkeys(k.strip() for k in keys) if k]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def allows(self, authorization: str | None) -> bool:
        if not self._keys:
            return True
        if not authorization:
            return False
        scheme, _, token = authorization.encode("utf-8", "surrogateescape").partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        token = token.strip()
        # Check every key, so the time taken does not reveal which one nearly matched.
        return any([hmac.compare_digest(token, key) for key in self._keys])


def read_keys_file(path: str | Path) -> list[str]:
    """One key per line (a mounted Secret works as is); blank lines and `#` comments are skipped."""
    lines = Path(path).read_text().splitlines()
    return [s for line in lines if (s := line.strip()) and not s.startswith("#")]
