"""Child processes of `folio up`: started on free loopback ports, health-probed, restarted, stopped.

Processes are kept in named groups (one per revision, one for the router). Each replica keeps its
port across restarts, so the router's endpoint list stays valid. A replica may be several processes
(`ensure_groups`: a revision whose replica spans several pods in a cluster, a LeaderWorkerSet's group):
the first serves and is probed, the others are its workers, and when any of them exits the whole replica
is killed and restarted together, as LeaderWorkerSet's ``RecreateGroupOnPodRestart`` does (a group that
lost a rank cannot serve). A process that exits is restarted
after an exponential backoff; a group whose processes exited ``crash_limit`` times within
``crash_window`` seconds is *crash-looping*, which the rollout treats as a failing revision. A process
that was healthy and then fails its health probe for ``unhealthy_timeout`` seconds (alive but unable to
serve, e.g. hung) is killed, and so restarted like one that exited.

No orphans, whatever happens to `folio up`:
- every child leads its own process group (``start_new_session``), so stopping it signals the
  group and reaches anything it spawned, and a Ctrl-C in the terminal reaches only `folio up`,
  which then drains the children in order;
- on Linux every child asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``),
  which covers `folio up` itself being killed with SIGKILL. The kernel ties that to the *thread*
  that forked the child, so all children are started from the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the child binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_pair(host: str = "127.0.0.1", attempts: int = 50) -> int:
    """A port P such that P and P + 1 are free right now (a group's `--master-port` and its step channel)."""
    for _ in range(attempts):
        port = free_port(host)
        if port >= 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port + 1))
            except OSError:
                continue
        return port
    raise OSError(f"no two consecutive free ports found on {host} in {attempts} attempts")


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec: keep it tiny
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


@dataclass
class Worker:
    """A process of a replica beside the one that serves (a group's worker): its ranks only, no HTTP."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class Replica:
    """One slot of a group: a port, and the process currently filling it (if any), with its workers."""

    group: str
    index: int
    port: int
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)  # besides the supervisor's
    workers: list[Worker] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    next_start: float = 0.0  # monotonic time of the next (re)start
    ready: bool = False
    served: bool = False  # answered /health with 200 since it was started
    unhealthy_since: float | None = None  # monotonic time its probe began failing after it served
    restarts: int = 0
    exits: deque[float] = field(default_factory=deque)  # monotonic times of recent exits
    last_exit_code: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return all(p is not None and p.poll() is None for p in self.procs(running=False))

    def procs(self, running: bool = True) -> list[subprocess.Popen[bytes] | None]:
        """Its processes, the serving one first (``running``: only those started)."""
        found = [self.proc, *(w.proc for w in self.workers)]
        return [p for p in found if p is not None] if running else found

    def exited(self) -> subprocess.Popen[bytes] | None:
        """The first of its processes that has exited, if any."""
        return next((p for p in self.procs() if p.poll() is not None), None)


# argv for a replica, given its port
ArgvFactory = Callable[[int], list[str]]
# A replica of several processes, given its port and its group's master port: each process's argv and
# environment (besides the supervisor's), the one that serves on the port first.
Process = tuple[list[str], dict[str, str]]
GroupFactory = Callable[[int, int], list[Process]]


class Supervisor:
    def __init__(
        self,
        logs_dir: Path,
        *,
        env: dict[str, str] | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 15.0,
        crash_window: float = 120.0,
        crash_limit: int = 3,
        stop_timeout: float = 30.0,
        unhealthy_timeout: float = 5.0,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.logs_dir = logs_dir
        self.env = env
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.crash_window = crash_window
        self.crash_limit = crash_limit
        self.stop_timeout = stop_timeout
        self.unhealthy_timeout = unhealthy_timeout
        self.on_event = on_event or (lambda _msg: None)
        self.groups: dict[str, list[Replica]] = {}
        self._stopping: set[asyncio.Future[None]] = set()
        self._http = httpx.AsyncClient(timeout=2.0, trust_env=False)

    # --------------------------------------------------------------- groups

    def ensure(self, group: str, replicas: int, argv: ArgvFactory, *, port: int | None = None) -> None:
        """Make ``group`` have ``replicas`` slots; new slots start at the next ``tick``.

        ``port`` pins the port of a single-replica group (the router listens where the user said).
        """
        slots = self.groups.setdefault(group, [])
        while len(slots) < replicas:
            index = len(slots)
            slot_port = port if port is not None and replicas == 1 else free_port()
            slots.append(
                Replica(group, index, slot_port, argv(slot_port), self.logs_dir / f"{group}-{index}.log")
            )

    def ensure_groups(self, group: str, replicas: int, processes: GroupFactory) -> None:
        """Make ``group`` have ``replicas`` slots of several processes each (``processes``: given the slot's
        port and a master port of its own); new slots start at the next ``tick``."""
        slots = self.groups.setdefault(group, [])
        while len(slots) < replicas:
            index, port = len(slots), free_port()
            (argv, env), *rest = processes(port, free_port_pair())
            slot = Replica(group, index, port, argv, self.logs_dir / f"{group}-{index}.log", env=env)
            slot.workers = [Worker(w_argv, w_env, self.logs_dir / f"{group}-{index}-node{node}.log")
                            for node, (w_argv, w_env) in enumerate(rest, start=1)]
            slots.append(slot)

    def has(self, group: str) -> bool:
        return group in self.groups

    def scale_down(self, group: str, replicas: int) -> None:
        slots = self.groups.get(group, [])
        while len(slots) > replicas:
            self._stop_later(slots.pop())

    def remove(self, group: str) -> None:
        """Take ``group`` out now and stop its processes in the background (they drain first)."""
        for r in self.groups.pop(group, []):
            self._stop_later(r)

    async def stop_all(self, order: list[str] | None = None) -> None:
        """Stop groups in ``order`` first (e.g. the router before the engines), then the rest."""
        for group in order or []:
            await asyncio.gather(*(self._stop(r) for r in self.groups.pop(group, [])))
        await asyncio.gather(*(self._stop(r) for slots in self.groups.values() for r in slots))
        self.groups.clear()
        await asyncio.gather(*self._stopping)
        await self._http.aclose()

    def _stop_later(self, r: Replica) -> None:
        task = asyncio.ensure_future(self._stop(r))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    # ---------------------------------------------------------- observation

    def ready_count(self, group: str) -> int:
        return sum(r.ready and r.alive for r in self.groups.get(group, []))

    def endpoints(self, group: str) -> list[str]:
        """URLs of the group's ready replicas."""
        return [r.url for r in self.groups.get(group, []) if r.ready and r.alive]

    def restarts(self, group: str) -> int:
        return sum(r.restarts for r in self.groups.get(group, []))

    def crash_looping(self, group: str) -> bool:
        horizon = time.monotonic() - self.crash_window
        return any(sum(t >= horizon for t in r.exits) >= self.crash_limit for r in self.groups.get(group, []))

    def pids(self, group: str | None = None) -> list[int]:
        groups = [self.groups.get(group, [])] if group is not None else list(self.groups.values())
        return [p.pid for slots in groups for r in slots if r.alive for p in r.procs()]

    # ----------------------------------------------------------------- work

    async def tick(self) -> None:
        """Reap exits, (re)start what is due and probe health; call it often (every ~0.5 s)."""
        now = time.monotonic()
        probes = []
        for slots in self.groups.values():
            for r in slots:
                if r.proc is not None and r.exited() is not None:
                    self._reaped(r, now)
                if r.proc is None and now >= r.next_start:
                    self._start(r)
                if r.alive:
                    probes.append(self._probe(r))
        await asyncio.gather(*probes)

    def _reaped(self, r: Replica, now: float) -> None:
        exited = r.exited()
        assert exited is not None
        code = exited.returncode
        node = r.procs().index(exited)
        # anything it left behind and, for a group, its other processes: a group that lost one cannot serve
        for proc in r.procs():
            self._kill_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)  # reaped at once after SIGKILL: no zombie left
        r.proc, r.ready, r.last_exit_code = None, False, code
        for w in r.workers:
            w.proc = None
        r.exits.append(now)
        while r.exits and r.exits[0] < now - self.crash_window:
            r.exits.popleft()
        delay = min(self.backoff_max, self.backoff_base * 2 ** (len(r.exits) - 1))
        r.next_start = now + delay
        r.restarts += 1
        what = f"{r.group} replica {r.index}"
        if r.workers:
            log = r.workers[node - 1].log_path if node else r.log_path
            what += f" (node {node} of {len(r.workers) + 1}: the whole group restarts)"
        else:
            log = r.log_path
        self.on_event(f"{what} exited with code {code}; restart {r.restarts} in {delay:.1f}s (log: {log})")

    def _start(self, r: Replica) -> None:
        r.proc = self._spawn(r.argv, r.env, r.log_path)
        for w in r.workers:
            w.proc = self._spawn(w.argv, w.env, w.log_path)
        r.started_at, r.ready, r.served, r.unhealthy_since = time.monotonic(), False, False, None

    def _spawn(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            log.write(f"\n--- starting: {' '.join(argv)}\n".encode())
            log.flush()
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**(self.env if self.env is not None else os.environ), **env} if env else self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),  # tiny and fork-safe
            )

    async def _probe(self, r: Replica) -> None:
        try:
            resp = await self._http.get(f"{r.url}/health")
            r.ready = resp.status_code == 200
        except httpx.HTTPError:
            r.ready = False
        if r.ready:
            r.served, r.unhealthy_since = True, None
            return
        if not r.served or r.proc is None:  # still starting up (loading weights), or already gone
            return
        now = time.monotonic()
        if r.unhealthy_since is None:
            r.unhealthy_since = now
        elif now - r.unhealthy_since >= self.unhealthy_timeout:
            self.on_event(
                f"{r.group} replica {r.index} is alive but failed its health probe for "
                f"{now - r.unhealthy_since:.1f}s; killing it so that it is restarted (log: {r.log_path})"
            )
            self._kill_group(r.proc.pid, signal.SIGKILL)  # the next tick reaps and restarts it
            r.unhealthy_since = None

    async def _stop(self, r: Replica) -> None:
        procs = r.procs()
        r.proc, r.ready = None, False
        for w in r.workers:
            w.proc = None
        for proc in procs:  # the whole group at once: the serving one drains, its workers follow it
            self._kill_group(proc.pid, signal.SIGTERM)
        started = time.monotonic()
        # stop_timeout is read on every turn: a second Ctrl-C sets it to 0 to stop at once
        while any(p.poll() is None for p in procs) and time.monotonic() - started < self.stop_timeout:
            await asyncio.sleep(0.05)
        for proc in procs:
            self._kill_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    @staticmethod
    def _kill_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
