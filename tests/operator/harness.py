"""Run the real operator (kopf + our handlers) against kmock's Kubernetes emulator over HTTP.

The emulator stores objects as given: it assigns no uid/resourceVersion/generation, runs no
controllers and no garbage collector. `ApiServer` adds the metadata bookkeeping; tests play
kubelet and the Job controller by patching child statuses, and the garbage collector is not
needed because the operator deletes children itself. Reusable by any kmock test of the operator:
`pytest.mark.kmock(cls=ApiServer)`, `declare_resources`, `running_operator`, `Cluster`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import jsonpatch
import kmock
import kopf

from folio.operator.executor import MANAGED_KINDS
from folio.operator.handlers import Context, configure, register
from folio.operator.kube import PLURALS, Kube
from folio.operator.planner import PlanSettings, base_labels
from folio.operator.spec import GROUP, KIND, PLURAL, VERSION

NAMESPACE = "ml"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "ef" * 32
RESYNC_S = 0.3
_versions = itertools.count(100)

T = TypeVar("T")


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus the metadata bookkeeping of a real API server.

    Every write gets a fresh `resourceVersion` (kopf tells stale watch events from fresh ones by
    it), creation fills `uid`, `generation` and `generateName`, and a change of `spec` bumps
    `generation`, so `observedGeneration` can be checked as on a real cluster.
    """

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None and request.data is not None:
            if request.action == kmock.action.CREATE and isinstance(request.data, dict):
                meta = request.data.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
                meta["resourceVersion"] = str(next(_versions))
            elif request.action == kmock.action.UPDATE and isinstance(request.data, dict):
                meta = request.data.setdefault("metadata", {})
                meta["resourceVersion"] = str(next(_versions))
                if "spec" in request.data and request.subresource is None:
                    key = (request.resource, request.namespace, request.name)
                    if key in self.objects and not self.objects[key].deleted:
                        current = self.objects[key].raw.get("metadata", {})
                        meta["generation"] = int(current.get("generation", 1)) + 1
            elif request.action == kmock.action.UPDATE and isinstance(request.data, list):
                request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": str(next(_versions))})
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:  # kopf's optimistic lock: a conflict, not a crash
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc


def declare_resources(server: kmock.KubernetesEmulator) -> None:
    """A real server lists an empty collection; the emulator needs to know the resource for that."""
    verbs = {"get", "list", "watch", "patch", "create", "delete"}
    server.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
        kind=KIND, namespaced=True, subresources={"status"}, verbs=verbs,
    )
    server.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs=verbs)
    for (api_version, kind), plural in PLURALS.items():
        if kind != KIND:
            server.resources[f"{api_version}/{plural}"] = kmock.ResourceInfo(
                kind=kind, namespaced=True, subresources={"status"}, verbs=verbs,
            )


def isvc_manifest(name: str = "chat", **spec: Any) -> dict[str, Any]:
    body = {"model": {"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct", "revision": COMMIT,
                      "digest": DIGEST}, "replicas": 1, **spec}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}"},
        "spec": body,
    }


class Cluster:
    """The emulator plus the API calls a test makes (through the same client the operator uses)."""

    def __init__(self, server: kmock.KubernetesEmulator) -> None:
        self.server = server
        self.kube = Kube.for_url(str(server.url))

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def create_isvc(self, manifest: dict[str, Any]) -> None:
        await self.call(self.kube.create, manifest)

    async def isvc(self, name: str = "chat") -> dict[str, Any]:
        found = await self.call(self.kube.get, f"{GROUP}/{VERSION}", KIND, NAMESPACE, name)
        assert found is not None, f"InferenceService {name} is gone"
        return found

    async def update_spec(self, name: str, spec_patch: dict[str, Any]) -> None:
        await self.call(self.kube.merge_patch, f"{GROUP}/{VERSION}", KIND, NAMESPACE, name, {"spec": spec_patch})

    async def delete_isvc(self, name: str = "chat") -> None:
        await self.call(self.kube.delete, f"{GROUP}/{VERSION}", KIND, NAMESPACE, name)

    async def get(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        return await self.call(self.kube.get, api_version, kind, NAMESPACE, name)

    async def children(self, isvc: str = "chat") -> dict[tuple[str, str], dict[str, Any]]:
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for api_version, kind in MANAGED_KINDS:
            for obj in await self.call(self.kube.list, api_version, kind, NAMESPACE, base_labels(isvc)):
                assert (kind, obj["metadata"]["name"]) not in found, "duplicate object"
                found[(kind, obj["metadata"]["name"])] = obj
        return found

    async def set_status(self, api_version: str, kind: str, name: str, status: dict[str, Any]) -> None:
        """Play the controller that owns a child (kubelet, the Job controller)."""
        await self.call(self.kube.merge_patch, api_version, kind, NAMESPACE, name, {"status": status}, "status")

    async def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        found = await self.call(self.kube._call, "GET", f"/api/v1/namespaces/{NAMESPACE}/events")
        items = found.get("items", [])
        return [e for e in items if reason is None or e.get("reason") == reason]


async def eventually(check: Callable[[], Awaitable[T]], timeout: float = 10.0, what: str = "") -> T:
    """Poll until `check` returns something truthy without raising; fail with its last error."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = await check()
            if value:
                return value
            last = AssertionError(f"{what or check.__name__} is still {value!r}")
        except AssertionError as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check.__name__}: {last}")
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def running_operator(server: kmock.KubernetesEmulator) -> AsyncIterator[None]:
    """The real registry, settings and handlers, logged in to the emulator; stopped on exit.

    kopf runs in its own thread and event loop, as in production: on exit it cancels every task
    of its loop, which must not include the emulator's.
    """
    registry = register(kopf.OperatorRegistry(), resync_s=RESYNC_S)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=str(server.url).rstrip("/"), insecure=True)

    settings = configure(kopf.OperatorSettings(), watch_timeout_s=5, peering=None)
    settings.batching.batch_window = 0.01
    # kmock cannot serve the cluster-wide /api/v1/namespaces list; with scanning off, kopf takes
    # the namespace names as given (it still needs the namespaces resource to be discoverable).
    settings.scanning.disabled = True
    ctx = Context(kube=Kube.for_url(str(server.url)), plan_settings=PlanSettings(image="folio:test"),
                  resync_s=RESYNC_S)
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(kopf.operator(
                registry=registry, settings=settings, memo=kopf.Memo(ctx=ctx), standalone=True,
                namespaces=[NAMESPACE], stop_flag=stop,
            ))
        except BaseException as exc:  # surfaced in the test below
            failure.append(exc)

    thread = threading.Thread(target=run, name="kopf-under-test", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 15)
        assert not thread.is_alive(), "the operator did not stop"
        assert not failure, f"the operator crashed: {failure[0]!r}"
