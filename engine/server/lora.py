"""The adapters a replica serves (`--enable-lora`), as the event loop sees them: which names a request's
``model`` may take, and loading and unloading at run time (vLLM's /v1/load_lora_adapter and
/v1/unload_lora_adapter).

The engine core holds the adapters themselves and is touched on its own thread only; this registry is the
loop's view of the names, so a request is resolved without a round trip to the engine thread. Unloading
takes the name out here first: new requests for it get 404 while the engine lets running ones finish.
"""

from __future__ import annotations

import logging
import os

from folio.engine.lora import LoRAError, LoRARequest
from folio.engine.server.async_engine import AsyncEngine, EngineDeadError
from folio.engine.server.errors import OpenAIError, bad_request, unavailable
from folio.engine.server.openai_errors import ErrorCode

log = logging.getLogger("folio.server")

RUNTIME_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # vLLM's switch for the load/unload endpoints


def runtime_updating_from_env() -> bool:
    """vLLM's reading of ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``: "1" or "true" in any case."""
    return os.environ.get(RUNTIME_UPDATING_ENV, "0").strip().lower() in ("1", "true")


def success_message(verb: str, name: str) -> str:
    """vLLM's plain-text answer to a load ("added") or an unload ("removed")."""
    return f"Success: LoRA adapter '{name}' {verb} successfully."


class LoRARegistry:
    """Adapter names → their `LoRARequest`. Each load gets a ``lora_int_id`` never used before in this
    process, so that nothing keyed by it (the prefix cache's block hashes) can take a reloaded adapter
    for the one it replaced."""

    def __init__(self, engine: AsyncEngine, base_name: str, *, enabled: bool, loaded: list[LoRARequest]) -> None:
        self._engine = engine
        self._base = base_name
        self.enabled = enabled
        self._adapters = {r.lora_name: r for r in loaded}
        self._busy: set[str] = set()  # names being loaded or unloaded now
        self._next_id = max((r.lora_int_id for r in loaded), default=0) + 1

    def get(self, name: str) -> LoRARequest | None:
        return self._adapters.get(name)

    def adapters(self) -> list[LoRARequest]:
        return list(self._adapters.values())

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise bad_request("LoRA is not enabled: start the server with --enable-lora.", param="lora_name")

    async def load(self, name: str, path: str, digest: str | None = None) -> LoRARequest:
        """Registers and loads an adapter; a 400 naming what is wrong with it (its engine-side `LoRAError`)."""
        self._check_enabled()
        if name == self._base:
            raise bad_request(f"'{name}' is the base model's name; an adapter needs a name of its own.", "lora_name")
        if name in self._adapters or name in self._busy:
            raise bad_request(f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        try:
            request = LoRARequest(name, self._new_id(), path, digest=digest)
        except ValueError as exc:  # e.g. a malformed digest
            raise bad_request(str(exc), param="digest" if "digest" in str(exc) else "lora_path") from exc
        self._busy.add(name)
        try:
            await self._engine.call(lambda: self._engine.engine.add_lora(request))
        except LoRAError as exc:
            raise bad_request(f"Failed to load LoRA adapter '{name}': {exc}", param="lora_path") from exc
        except EngineDeadError as exc:
            raise unavailable(str(exc), code=ErrorCode.ENGINE_UNAVAILABLE) from exc
        finally:
            self._busy.discard(name)
        self._adapters[name] = request
        log.info("loaded LoRA adapter %r (id %d) from %s", name, request.lora_int_id, path)
        return request

    async def unload(self, name: str) -> None:
        """Stops serving an adapter: new requests for it get 404 at once, running ones finish."""
        self._check_enabled()
        request = self._adapters.pop(name, None)
        if request is None:
            raise OpenAIError(
                404, f"The lora adapter '{name}' cannot be found.", param="lora_name", code=ErrorCode.MODEL_NOT_FOUND
            )
        self._busy.add(name)  # a load of the same name is refused until the engine has let this one go
        try:
            await self._engine.call(lambda: self._engine.engine.remove_lora(name))
        except EngineDeadError as exc:
            raise unavailable(str(exc), code=ErrorCode.ENGINE_UNAVAILABLE) from exc
        finally:
            self._busy.discard(name)
        log.info("unloaded LoRA adapter %r (id %d)", name, request.lora_int_id)
