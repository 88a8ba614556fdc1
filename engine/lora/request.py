"""A request's adapter, by vLLM's names: `LoRARequest(lora_name, lora_int_id, lora_path)`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from folio.engine.digest import DIGEST_RE


@dataclass(frozen=True, init=False)
class LoRARequest:
    """An adapter a request runs under. ``lora_int_id`` > 0 identifies it in the engine (0 is the base
    model); ``digest`` ("sha256:…", as `folio digest` prints it) pins the adapter folder's content."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    digest: str | None = field(default=None, compare=True)

    def __init__(
        self,
        lora_name: str,
        lora_int_id: int,
        lora_path: str = "",
        lora_local_path: str | None = None,  # vLLM's 4th positional argument, deprecated there too
        *,
        digest: str | None = None,
    ) -> None:
        if lora_local_path is not None:  # vLLM's deprecated name for lora_path
            warnings.warn("lora_local_path is deprecated: use lora_path", DeprecationWarning, stacklevel=2)
            if lora_path and lora_path != lora_local_path:
                raise ValueError("lora_path and lora_local_path name different folders")
            lora_path = lora_local_path
        if not lora_name:
            raise ValueError("lora_name must not be empty")
        if isinstance(lora_int_id, bool) or not isinstance(lora_int_id, int) or lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer > 0 (0 is the base model), got {lora_int_id!r}")
        if not lora_path:
            raise ValueError(f"adapter {lora_name!r}: lora_path must name its folder")
        if digest is not None and not DIGEST_RE.match(digest):
            raise ValueError(f"adapter {lora_name!r}: malformed digest {digest!r}: expected 'sha256:' and 64 hex digits")
        object.__setattr__(self, "lora_name", lora_name)
        object.__setattr__(self, "lora_int_id", lora_int_id)
        object.__setattr__(self, "lora_path", str(lora_path))
        object.__setattr__(self, "digest", digest)

    @property
    def lora_local_path(self) -> str:
        return self.lora_path

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id
