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
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

import jsonpatch
import kmock
import kopf
import pytest
import yaml
from aiohttp import web

from folio.operator.controller.handlers import configure, register
from folio.operator.controller.reconcile import Context
from folio.operator.controller.watches import Watches
from folio.operator.k8s.client import ApiError, Kube
from folio.operator.k8s.names import (
    COMPONENT_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MANAGED_KINDS,
    PLURALS,
    base_labels,
    component_labels,
)
from folio.operator.router.metrics import RouterMetrics
from folio.operator.serving.objects import PlanSettings
from folio.operator.spec import GROUP, KIND, PLURAL, VERSION, InferenceServiceSpec, revision_name
from tests.support.wait import until

NAMESPACE = "ml"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "ef" * 32
RESYNC_S = 0.3
_versions = itertools.count(100)
_last_version = [99]


def _next_version() -> str:
    _last_version[0] = next(_versions)
    return str(_last_version[0])

T = TypeVar("T")


class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus the metadata bookkeeping of a real API server.

    Every write gets a fresh `resourceVersion` (kopf tells stale watch events from fresh ones by
    it), creation fills `uid`, `generation` and `generateName`, and a change of `spec` bumps
    `generation`, so `observedGeneration` can be checked as on a real cluster. A list answers with
    the current version and a watch from it leaves out what that list already held, as a real
    server does (the emulator would replay every object: kopf would act twice on one version).
    """

    async def _serve_list(self, request: kmock.Request) -> Any:
        payload = await super()._serve_list(request)
        payload["metadata"]["resourceVersion"] = str(_last_version[0])
        return payload

    async def _serve_watch(self, request: kmock.Request) -> Any:
        since = request.params.get("resourceVersion", "")
        async for event in super()._serve_watch(request):
            if isinstance(event, dict) and event.get("type") == "ADDED" and since.isdigit():
                version = str(event.get("object", {}).get("metadata", {}).get("resourceVersion", ""))
                if version.isdigit() and int(version) <= int(since):
                    continue  # the list this watch follows had it already
            yield event

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None and request.data is not None:
            if request.action == kmock.action.CREATE and isinstance(request.data, dict):
                meta = request.data.setdefault("metadata", {})
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("generation", 1)
                meta["resourceVersion"] = _next_version()
            elif request.action == kmock.action.UPDATE and isinstance(request.data, dict):
                meta = request.data.setdefault("metadata", {})
                meta["resourceVersion"] = _next_version()
                if "spec" in request.data and request.subresource is None:
                    key = (request.resource, request.namespace, request.name)
                    if key in self.objects and not self.objects[key].deleted:
                        current = self.objects[key].raw.get("metadata", {})
                        meta["generation"] = int(current.get("generation", 1)) + 1
            elif request.action == kmock.action.UPDATE and isinstance(request.data, list):
                request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": _next_version()})
        try:
            return await super()._handle(request)
        except jsonpatch.JsonPatchTestFailed as exc:  # kopf's optimistic lock: a conflict, not a crash
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc


def declare_resources(server: kmock.KubernetesEmulator, *, keda: bool = False) -> None:
    """A real server lists an empty collection; the emulator needs to know the resource for that.
    ``keda``: KEDA's CRDs are installed (without, kopf must cope with ScaledObjects it cannot watch)."""
    verbs = {"get", "list", "watch", "patch", "create", "delete"}
    server.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
        kind=KIND, namespaced=True, subresources={"status"}, verbs=verbs,
    )
    server.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs=verbs)
    for (api_version, kind), plural in PLURALS.items():
        if kind != KIND and (keda or not api_version.startswith("keda.sh/")):
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
            try:
                listed = await self.call(self.kube.list, api_version, kind, NAMESPACE, base_labels(isvc))
            except ApiError as exc:
                if exc.status == 404 and api_version.startswith("keda.sh/"):
                    continue  # KEDA not installed in this emulator
                raise
            for obj in listed:
                assert (kind, obj["metadata"]["name"]) not in found, "duplicate object"
                found[(kind, obj["metadata"]["name"])] = obj
        return found

    async def set_status(self, api_version: str, kind: str, name: str, status: dict[str, Any]) -> None:
        """Play the controller that owns a child (kubelet, the Job controller)."""
        await self.call(self.kube.merge_patch, api_version, kind, NAMESPACE, name, {"status": status}, "status")

    async def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        found = await self.call(self.kube.call, "GET", f"/api/v1/namespaces/{NAMESPACE}/events")
        items = found.get("items", [])
        return [e for e in items if reason is None or e.get("reason") == reason]


async def eventually(check: Callable[[], Awaitable[T]], timeout: float = 10.0, what: str = "") -> T:
    """Poll until `check` returns something truthy without failing an assertion; fail with its last one."""
    return await until(check, timeout, what or check.__name__, interval=0.1, ignore=(AssertionError,))


@contextlib.asynccontextmanager
async def running_operator(server: kmock.KubernetesEmulator, resync_s: float = RESYNC_S,
                           **context: Any) -> AsyncIterator[None]:
    """The real registry, settings and handlers, logged in to the emulator; stopped on exit.

    kopf runs in its own thread and event loop, as in production: on exit it cancels every task
    of its loop, which must not include the emulator's.
    """
    registry = register(kopf.OperatorRegistry())

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=str(server.url).rstrip("/"), insecure=True)

    settings = configure(kopf.OperatorSettings(), watch_timeout_s=5, peering=None)
    settings.batching.batch_window = 0.01
    # kmock cannot serve the cluster-wide /api/v1/namespaces list; with scanning off, kopf takes
    # the namespace names as given (it still needs the namespaces resource to be discoverable).
    settings.scanning.disabled = True
    watches = context.setdefault("watches", Watches(registry, settings))  # as `folio operator` shares it
    ctx = Context(kube=Kube.for_url(str(server.url)), plan_settings=PlanSettings(image="folio:test"),
                  resync_s=resync_s, **context)
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(kopf.operator(
                registry=registry, settings=settings, memo=kopf.Memo(ctx=ctx), standalone=True,
                insights=watches.insights,
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


# --------------------------------------------------------------------- scenarios


def rev_of(manifest: dict[str, Any]) -> str:
    return revision_name(InferenceServiceSpec.model_validate(manifest["spec"]))


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    """The condition of that type, or {} while there is none yet."""
    return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


async def bring_up(cluster: Cluster, manifest: dict[str, Any]) -> str:
    """Create, then play the pre-pull Job and kubelet until the service is Ready."""
    await cluster.create_isvc(manifest)
    return await serve_first_revision(cluster, manifest)


async def serve_first_revision(cluster: Cluster, manifest: dict[str, Any]) -> str:
    """Play the pre-pull Job and kubelet of a created InferenceService until it is Ready."""
    rev = rev_of(manifest)
    job = await eventually(lambda: cluster.get("batch/v1", "Job", f"chat-prepull-{rev}"), what="pre-pull Job")
    assert job["metadata"]["labels"]["serving.folio.dev/revision"] == rev
    await cluster.set_status("batch/v1", "Job", f"chat-prepull-{rev}",
                             {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})

    async def scaled_up() -> bool:
        dep = await cluster.get("apps/v1", "Deployment", f"chat-{rev}")
        return dep is not None and dep["spec"]["replicas"] == manifest["spec"]["replicas"]

    await eventually(scaled_up, what="engine Deployment scaled up after the weights were verified")
    await cluster.set_status("apps/v1", "Deployment", f"chat-{rev}", {"readyReplicas": 1, "replicas": 1})

    async def ready() -> bool:
        return condition(await cluster.isvc(), "Ready")["status"] == "True"

    await eventually(ready, what="Ready=True")
    return rev


def point_kubeconfig_at_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$KUBECONFIG names a cluster at a port nobody listens on: enough for a CLI to build its client."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "test", "user": {"token": "t"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
    }))  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))


# --------------------------------------------------------------------- operator processes (HA)

PEERING = "folio"


def declare_peering(server: kmock.KubernetesEmulator, name: str = PEERING) -> None:
    """kopf's namespaced peering CRD (the chart's crds/kopf-peering.yaml: no status subresource) and the
    peering object the replicas heartbeat into (the chart's templates/peering.yaml)."""
    server.resources["kopf.dev/v1/kopfpeerings"] = kmock.ResourceInfo(
        kind="KopfPeering", namespaced=True, verbs={"get", "list", "watch", "patch", "create"},
    )
    server.objects["kopf.dev/v1/kopfpeerings", NAMESPACE, name] = {
        "apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
        "metadata": {"name": name, "namespace": NAMESPACE, "resourceVersion": _next_version()},
    }  # fmt: skip


def write_kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig for a `folio operator` process: the emulator, plain HTTP, no credentials."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": url.rstrip("/")}}],
        "users": [{"name": "kmock", "user": {}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
    }))  # fmt: skip
    return path


class OperatorProcess:
    """`folio operator` as the chart runs it, in a process of its own against the emulator.

    Its log goes to a file (read by `log`); `kill` is SIGKILL (no goodbye in the peering object), `stop`
    asks it to stop and kills it if it does not. Ports: none (metrics and health endpoints off).
    """

    def __init__(self, name: str, kubeconfig: Path, log_dir: Path, *args: str,
                 namespaces: tuple[str, ...] = (NAMESPACE,)) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        env.update(KUBECONFIG=str(kubeconfig), POD_ID=name, PYTHONUNBUFFERED="1")
        scope = [arg for ns in namespaces for arg in ("-n", ns)]
        command = [sys.executable, "-m", "folio.operator", "operator", *scope, "--image", "folio:test",
                   "--metrics-port", "0", "--health-port", "0", *args]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class Replicas:
    """`folio operator` processes against one emulator, started one by one (`start`)."""

    def __init__(self, server: kmock.KubernetesEmulator, tmp_path: Path) -> None:
        self.kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(server.url))
        self.log_dir = tmp_path
        self.started: list[OperatorProcess] = []

    def start(self, name: str, *args: str, namespaces: tuple[str, ...] = (NAMESPACE,)) -> OperatorProcess:
        self.started.append(OperatorProcess(name, self.kubeconfig, self.log_dir, *args, namespaces=namespaces))
        return self.started[-1]


@contextlib.asynccontextmanager
async def operator_processes(server: kmock.KubernetesEmulator, tmp_path: Path) -> AsyncIterator[Replicas]:
    """Start `folio operator` processes with the `Replicas` given; every one is gone on exit."""
    replicas = Replicas(server, tmp_path)
    try:
        yield replicas
    finally:
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in replicas.started))


class Background:
    """``async with`` it: its ``_run`` goes on as a task while inside, and is cancelled on the way out."""

    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class _Work(Background):
    def __init__(self, work: Callable[[], Awaitable[None]]) -> None:
        self._work = work

    async def _run(self) -> None:
        await self._work()


def in_background(work: Callable[[], Awaitable[None]]) -> Background:
    """``async with`` it: ``work()`` (a load loop, say) goes on as a task while inside."""
    return _Work(work)


# --------------------------------------------------------------------- a fleet (tests/operator/test_scale.py, bench/scale.py)

# Analysis of the fleet's canaries: a sample every interval; `failureLimit` failed ones roll back.
FLEET_INTERVAL_S = 2.0
FLEET_FAILURE_LIMIT = 3
FLEET_ROLLOUT: dict[str, Any] = {
    "steps": [{"weight": 50, "pause": "8s"}],
    "analysis": {"interval": f"{FLEET_INTERVAL_S:g}s", "failureLimit": FLEET_FAILURE_LIMIT, "minRequests": 2,
                 "maxErrorRate": 0.05},
    "drainPeriod": "0s",
}


TEST_CLIENT_HEADER = "X-Folio-Test-Client"  # a test's own requests: not counted as the operator's


@dataclass(frozen=True)
class ApiCall:
    """One API request as `ScaleApiServer.calls` keeps it."""

    method: str
    plural: str
    namespace: str | None
    subresource: str | None
    watch: bool
    label_selector: str
    operator: bool  # not the test's own (`TEST_CLIENT_HEADER`)

    def __str__(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.method.rpartition('.')[2]} {self.plural}{sub}{'?watch' if self.watch else ''}"


def _selected(request: kmock.Request) -> Callable[[Any], bool]:
    """Whether an object matches the request's ``labelSelector`` (equality terms, as the operator sends)."""
    terms = [term.partition("=") for term in request.params.get("labelSelector", "").split(",") if term]
    wanted = {key: value for key, _, value in terms}

    def matches(obj: Any) -> bool:
        labels = ((obj or {}).get("metadata") or {}).get("labels") or {} if isinstance(obj, dict) else {}
        return all(labels.get(key) == value for key, value in wanted.items())

    return matches


class ScaleApiServer(ApiServer):
    """`ApiServer` closer to a real API server where an idle operator's requests are counted:

    - a list or watch with a ``labelSelector`` (equality terms) gets only the objects it selects, as the
      operator's watches of children and pods ask (`handlers.OWN_OBJECTS`);
    - every request is in `calls`, and kmock forgets each once answered (a watch once matched to its
      reaction): kmock matches a request by scanning every request it keeps, so a fleet's thousands would
      slow it quadratically; iterating the emulator (`list(server)`) gives only the requests in flight;
    - a watch asking for them (`allowWatchBookmarks`, as kopf's do) gets a BOOKMARK after ``BOOKMARK_S``
      without an event, as from a real API server about every minute. Without, kopf takes a quiet watch for
      a dead one after `settings.watching.inactivity_timeout` (70 s) and opens it again: requests made only
      against the emulator, which would count against an idle operator.
    """

    BOOKMARK_S = 50.0

    @property
    def calls(self) -> list[ApiCall]:
        """Every API request so far, in order (cheap to read: iterating the emulator filters each request)."""
        return self.__dict__.setdefault("_calls", [])

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None:
            self.calls.append(ApiCall(
                str(request.method), request.resource.plural or "", request.namespace, request.subresource,
                bool(request.params.get("watch")), request.params.get("labelSelector", ""),
                operator=TEST_CLIENT_HEADER not in request.headers))
        try:
            return await super()._handle(request)
        finally:  # answered (or refused before any reaction, as a patch of a missing object is)
            self._forget(request)

    def _forget(self, request: kmock.Request) -> None:
        """Drop a request kmock has matched to its reaction: it need not keep it."""
        for i, kept in enumerate(self._requests):
            if kept is request:
                del self._requests[i]
                break

    async def _serve_list(self, request: kmock.Request) -> Any:
        payload = await super()._serve_list(request)
        payload["items"] = [obj for obj in payload["items"] if _selected(request)(obj)]
        return payload

    # One object's reads and writes find it by its key: kmock scans every object it holds for each (with
    # thousands of children that scan was most of a fleet's time to Ready). Writes change the store in
    # `_handle` before these answer, as in kmock.
    def _stored(self, request: kmock.Request, namespace: str | None, name: str | None) -> Any:
        try:
            return self.objects[request.resource, namespace, name]
        except KeyError:
            return None

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        obj = self._stored(request, request.namespace, request.name)
        if obj is None or obj.deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return obj.raw

    async def _serve_create(self, request: kmock.Request) -> Any:
        meta = request.data.get("metadata", {})
        return self._stored(request, request.namespace or meta.get("namespace"), request.name or meta.get("name")).raw

    async def _serve_update(self, request: kmock.Request) -> Any:
        return self._stored(request, request.namespace, request.name).last.raw

    async def _serve_delete(self, request: kmock.Request) -> Any:
        return self._stored(request, request.namespace, request.name).last.raw

    async def _serve_watch(self, request: kmock.Request) -> Any:
        events = self._selecting(request).__aiter__()
        if request.params.get("allowWatchBookmarks") != "true":
            async for event in events:
                yield event
            return
        pending = asyncio.ensure_future(anext(events))
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=self.BOOKMARK_S)
                if not done:
                    yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(_last_version[0])}}}
                    continue
                try:
                    event = pending.result()
                except StopAsyncIteration:
                    return
                yield event
                pending = asyncio.ensure_future(anext(events))
        finally:
            pending.cancel()

    async def _selecting(self, request: kmock.Request) -> Any:
        self._forget(request)  # a watch is answered for minutes: forgotten once matched
        selected = _selected(request)
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict) or event.get("type") == "BOOKMARK" or selected(event.get("object")):
                yield event


def _fleet_manifest(namespace: str, name: str) -> dict[str, Any]:
    manifest = isvc_manifest(name, rollout=FLEET_ROLLOUT)
    manifest["metadata"] = {"name": name, "namespace": namespace}
    return manifest


@dataclass
class FleetService:
    namespace: str
    name: str
    router: RouterMetrics
    port: int = 0  # where its fake router pod serves /metrics
    scrapes: list[float] = field(default_factory=list)  # monotonic: when the operator read its /metrics
    faulty: bool = False  # its canary fails half its requests
    stable: str = ""
    canary_first: float | None = None  # monotonic: when its router first sent the canary traffic
    canary_last: float | None = None
    canary_done: float | None = None  # ...and when the canary had all or none of it again


class Fleet:
    """``count`` InferenceServices over ``namespaces``, and the cluster around them, driven from the
    emulator's own process: it plays the Job controller and kubelet (pre-pull Jobs complete, engine
    Deployments become ready), gives each service a router pod whose /metrics (a port of its own, served
    here) reports traffic split by the service's ``status.traffic``, and counts the operator's API requests
    (its own carry `TEST_CLIENT_HEADER`). Objects are read in-process, from the emulator's store."""

    TICK_S = 0.2  # the kubelet's and the routers' loop
    RPS = 10  # requests a second each router reports

    def __init__(self, server: ScaleApiServer, namespaces: list[str], count: int) -> None:
        self.server = server
        self.kube = Kube.for_url(str(server.url))
        self.kube.client.set_default_header(TEST_CLIENT_HEADER, "1")
        self.services = [FleetService(namespaces[i % len(namespaces)], f"svc-{i:03d}", RouterMetrics(f"svc-{i:03d}"))
                         for i in range(count)]
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._done: set[tuple[str, str, str, str]] = set()  # (kind, ns, name, resourceVersion) already played

    # ---- the emulator's store, read in-process
    def objects(self, plural: str) -> list[dict[str, Any]]:
        found = []
        for key, history in list(self.server.objects.items()):
            resource = key[0]
            if getattr(resource, "plural", None) == plural and not history.deleted:
                found.append(history.raw)
        return found

    def isvcs(self) -> dict[tuple[str, str], dict[str, Any]]:
        return {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in self.objects(PLURAL)}

    def ready(self) -> int:
        return sum(any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (o.get("status") or {}).get("conditions") or [])
                   for o in self.isvcs().values())

    def operator_requests(self) -> int:
        """API requests the emulator got from anyone but this driver (the operator's)."""
        return sum(call.operator for call in self.server.calls)

    def operator_calls(self, since: int = 0) -> list[str]:
        """The operator's requests from its ``since``-th on, as ``METHOD resource[/subresource][?watch]``."""
        return [str(call) for call in [c for c in self.server.calls if c.operator][since:]]

    def watching(self, namespaces: list[str]) -> bool:
        """Whether the operator has opened its watch of every kind it indexes (that the emulator serves) and of
        InferenceServices in each of ``namespaces`` (kopf opens them all at its start, in no set order)."""
        served = {f"{api_version}/{PLURALS[(api_version, kind)]}" for api_version, kind in (*MANAGED_KINDS, ("v1", "Pod"))}
        plurals = {key.rpartition("/")[2] for key in served if key in self.server.resources} | {PLURAL}
        opened = {(c.plural, c.namespace) for c in self.server.calls if c.watch and c.operator}
        return {(plural, ns) for plural in plurals for ns in namespaces} <= opened

    # ---- lifecycle
    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        for svc in self.services:  # one port each: a router pod's /metrics is at its podIP and `http` port
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            svc.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._by_port = {svc.port: svc for svc in self.services}
        self._tasks = [asyncio.create_task(self._kubelet()), asyncio.create_task(self._routers())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._runner is not None:
            await self._runner.cleanup()

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        svc = self._by_port[request.transport.get_extra_info("sockname")[1]]  # type: ignore[union-attr]
        svc.scrapes.append(time.monotonic())
        return web.Response(body=svc.router.render(), content_type="text/plain")

    async def create(self, concurrency: int = 8) -> None:
        """Router pods, then the InferenceServices, ``concurrency`` requests at a time."""
        gate = asyncio.Semaphore(concurrency)

        async def one(obj: dict[str, Any]) -> None:
            async with gate:
                await asyncio.to_thread(self.kube.create, obj)

        await asyncio.gather(*(one(self._router_pod(svc)) for svc in self.services))
        await asyncio.gather(*(one(_fleet_manifest(svc.namespace, svc.name)) for svc in self.services))

    def _router_pod(self, svc: FleetService) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{svc.name}-router-1", "namespace": svc.namespace,
                         "labels": component_labels(svc.name, "router")},
            "spec": {"containers": [{"name": "router", "ports": [{"name": "http", "containerPort": svc.port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1"},
        }  # fmt: skip

    async def bump(self, services: list[FleetService], *, faulty: set[str], concurrency: int = 8) -> None:
        """A new revision for each of ``services`` (one apply); the canary of those named in ``faulty`` fails."""
        gate = asyncio.Semaphore(concurrency)
        current = self.isvcs()

        async def one(svc: FleetService) -> None:
            svc.faulty = svc.name in faulty
            svc.stable = current[(svc.namespace, svc.name)]["status"]["stableRevision"]
            async with gate:
                await asyncio.to_thread(self.kube.merge_patch, f"{GROUP}/{VERSION}", KIND, svc.namespace, svc.name,
                                        {"spec": {"engine": {"args": {"maxNumSeqs": 8}}}})

        await asyncio.gather(*(one(svc) for svc in services))

    async def patch_spec(self, svc: FleetService, spec: dict[str, Any]) -> int:
        """Merge-patch a spec; the generation the operator has to observe."""
        patched = await asyncio.to_thread(self.kube.merge_patch, f"{GROUP}/{VERSION}", KIND, svc.namespace,
                                          svc.name, {"spec": spec})
        return int(patched["metadata"]["generation"])

    def observed(self, svc: FleetService) -> int:
        status = self.isvcs()[(svc.namespace, svc.name)].get("status") or {}
        return int(status.get("observedGeneration") or 0)

    # ---- the cluster's other controllers
    async def _kubelet(self) -> None:
        while True:
            for plural, kind, api_version in (("jobs", "Job", "batch/v1"), ("deployments", "Deployment", "apps/v1")):
                for obj in self.objects(plural):
                    meta = obj["metadata"]
                    key = (kind, meta["namespace"], meta["name"], str(meta.get("resourceVersion")))
                    if key in self._done or (meta.get("labels") or {}).get(MANAGED_BY_LABEL) != MANAGED_BY:
                        continue
                    status = obj.get("status") or {}
                    if kind == "Job" and not status.get("succeeded"):
                        new: dict[str, Any] | None = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
                    elif kind == "Deployment" and (meta.get("labels") or {}).get(COMPONENT_LABEL) == "engine" and (
                            status.get("readyReplicas") or 0) != (want := int(obj["spec"].get("replicas") or 0)):
                        new = {"readyReplicas": want, "replicas": want}
                    else:
                        new = None
                    self._done.add(key)
                    if new is not None:
                        with contextlib.suppress(ApiError):  # gone meanwhile
                            await asyncio.to_thread(self.kube.merge_patch, api_version, kind, meta["namespace"],
                                                    meta["name"], {"status": new}, "status")
            await asyncio.sleep(self.TICK_S)

    async def _routers(self) -> None:
        """Each router follows its service's status.traffic: RPS requests a second, split by the weights."""
        owed: dict[tuple[str, str], float] = {}
        sent: dict[tuple[str, str], int] = {}
        while True:
            if not any(svc.stable for svc in self.services):  # no bump yet: nothing to report
                await asyncio.sleep(self.TICK_S)
                continue
            current = self.isvcs()
            now = time.monotonic()
            for svc in self.services:
                obj = current.get((svc.namespace, svc.name))
                if obj is None or not svc.stable:
                    continue
                weights = {t["revision"]: t["weight"] for t in (obj.get("status") or {}).get("traffic") or []}
                canary = next((rev for rev, w in weights.items() if rev != svc.stable and 0 < w < 100), None)
                if canary is not None:
                    svc.canary_first = svc.canary_first or now
                    svc.canary_last = now
                elif svc.canary_first is not None and svc.canary_done is None:
                    svc.canary_done = now
                for rev, weight in weights.items():
                    key = (svc.name, rev)
                    owed[key] = owed.get(key, 0.0) + self.RPS * self.TICK_S * weight / 100
                    while owed[key] >= 1.0:
                        owed[key] -= 1.0
                        sent[key] = sent.get(key, 0) + 1
                        fail = svc.faulty and rev == canary and sent[key] % 2 == 0  # half of a faulty canary's
                        svc.router.attempt_started(rev)
                        svc.router.attempt_finished(rev, "500" if fail else "200", 0.01)
                        svc.router.first_byte(rev, 0.005)
            await asyncio.sleep(self.TICK_S)
