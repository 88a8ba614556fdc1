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
import random

from folio.engine.lora import LoRAError, LoRARequest
from folio.engine.server.adapter_faults import FAULT_FILE, read_fault
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

    def __init__(self, engine: AsyncEngine, base_name: str, *, enabled: bool, loaded: list[LoRARequest],
                 fault_files: bool = False) -> None:
        self._engine = engine
        self._fault_files = fault_files  # --fault-adapter-files: honor an adapter's fault file (a test aid)
        self._faults: dict[str, float] = {}  # lora_name -> the error rate its fault file asks for
        self._rng = random.Random()
        self._base = base_name
        self.enabled = enabled
        self._adapters = {r.lora_name: r for r in loaded}
        self._served: dict[str, str] = {}  # lora_name -> the name its answers carry, when not lora_name
        self._busy: set[str] = set()  # names being loaded or unloaded now
        self._next_id = max((r.lora_int_id for r in loaded), default=0) + 1

    def get(self, name: str) -> LoRARequest | None:
        return self._adapters.get(name)

    def adapters(self) -> list[LoRARequest]:
        return list(self._adapters.values())

    def check_fault(self, lora: LoRARequest) -> None:
        """--fault-adapter-files: a 500 at the rate the adapter's fault file asks for."""
        rate = self._faults.get(lora.lora_name)
        if rate and self._rng.random() < rate:
            raise OpenAIError(500, f"Injected fault ({FAULT_FILE} of adapter '{self.served_name(lora)}').",
                              code=ErrorCode.FAULT_INJECTED)

    def served_name(self, lora: LoRARequest) -> str:
        """The ``model`` an answer under ``lora`` names: the load's ``served_name``, else its own name."""
        return self._served.get(lora.lora_name, lora.lora_name)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise bad_request("LoRA is not enabled: start the server with --enable-lora.", param="lora_name")

    async def load(self, name: str, path: str, digest: str | None = None, served_name: str | None = None) -> LoRARequest:
        """Registers and loads an adapter; a 400 naming what is wrong with it (its engine-side `LoRAError`).
        ``served_name``: the ``model`` its answers name (Folio's router sends ``name``, clients know this one)."""
        self._check_enabled()
        if self._base in (name, served_name):
            raise bad_request(f"'{name}' is the base model's name; an adapter needs a name of its own.", "lora_name")
        if name in self._adapters or name in self._busy:
            raise bad_request(f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        try:
            request = LoRARequest(name, self._new_id(), path, digest=digest)
            fault = read_fault(path) if self._fault_files else None
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
        if served_name is not None and served_name != name:
            self._served[name] = served_name
        if fault is not None:
            self._faults[name] = fault
        log.info("loaded LoRA adapter %r (id %d) from %s", name, request.lora_int_id, path)
        return request

    async def unload(self, name: str) -> None:
        """Stops serving an adapter: new requests for it get 404 at once, running ones finish."""
        self._check_enabled()
        request = self._adapters.pop(name, None)
        self._served.pop(name, None)
        self._faults.pop(name, None)
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
