"""The supervisor: replicas on free ports, health, restart with backoff, crash loops, no orphans."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from folio.operator.local.supervisor import Supervisor
from tests.support.wait import until as wait_until

FAKE = str(Path(__file__).with_name("fake_server.py"))


def fake(*extra: str):
    return lambda port: [sys.executable, FAKE, str(port), *extra]


async def until(cond, timeout: float = 15.0, sup: Supervisor | None = None) -> None:
    await wait_until(cond, timeout, tick=sup.tick if sup is not None else None)


_before: set[int] = set()


@pytest.fixture(autouse=True)
def _earlier_children() -> None:
    """Children this process had before the test (e.g. multiprocessing's resource tracker, which a
    test elsewhere in the session may have started and which lives as long as the interpreter)."""
    _before.clear()
    _before.update(p.pid for p in psutil.Process().children(recursive=True))


def descendants() -> list[psutil.Process]:
    """The processes the test started that still run."""
    return [p for p in psutil.Process().children(recursive=True)
            if p.pid not in _before and p.status() != psutil.STATUS_ZOMBIE]


async def test_replicas_become_ready_on_distinct_ports_and_stop(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    sup.ensure("rev1", 2, fake())
    await until(lambda: sup.ready_count("rev1") == 2, sup=sup)
    urls = sup.endpoints("rev1")
    assert len(set(urls)) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
    sup.scale_down("rev1", 1)
    assert sup.ready_count("rev1") == 1
    await sup.stop_all()
    assert descendants() == []


async def test_killed_replica_restarts_on_same_port_and_is_counted(tmp_path: Path) -> None:
    events: list[str] = []
    sup = Supervisor(tmp_path, backoff_base=0.1, on_event=events.append)
    sup.ensure("rev1", 1, fake())
    await until(lambda: sup.ready_count("rev1") == 1, sup=sup)
    [before] = sup.endpoints("rev1")
    os.kill(sup.pids()[0], signal.SIGKILL)
    await until(lambda: sup.restarts("rev1") == 1, sup=sup)
    assert sup.ready_count("rev1") == 0
    await until(lambda: sup.ready_count("rev1") == 1, sup=sup)
    assert sup.endpoints("rev1") == [before]
    assert not sup.crash_looping("rev1")
    assert any("exited with code -9" in e for e in events)
    await sup.stop_all()


async def test_alive_but_unhealthy_replica_is_killed_and_restarted(tmp_path: Path) -> None:
    """Up, but failing /health after it had served (an engine whose loop died): as good as dead."""
    events: list[str] = []
    sup = Supervisor(tmp_path, backoff_base=0.1, unhealthy_timeout=1.0, on_event=events.append)
    sup.ensure("rev1", 1, fake("--unhealthy-after", "1"))
    await until(lambda: sup.ready_count("rev1") == 1, sup=sup)
    [first] = sup.pids("rev1")
    await until(lambda: sup.ready_count("rev1") == 0, sup=sup)
    assert sup.pids("rev1") == [first]  # not restarted on the first failed probe
    await until(lambda: sup.restarts("rev1") == 1, sup=sup)
    assert any("alive but failed its health probe" in e for e in events)
    await until(lambda: sup.ready_count("rev1") == 1, sup=sup)  # its successor serves
    assert sup.pids("rev1") != [first] and not psutil.pid_exists(first)
    await sup.stop_all()


async def test_replica_still_starting_is_not_killed_for_failing_health(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, unhealthy_timeout=0.2)
    sup.ensure("rev1", 1, fake("--unhealthy-after", "0"))  # never healthy, like an engine loading weights
    await until(lambda: bool(sup.pids("rev1")), sup=sup)
    [pid] = sup.pids("rev1")
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        await sup.tick()
        await asyncio.sleep(0.05)
    assert sup.pids("rev1") == [pid] and sup.restarts("rev1") == 0
    await sup.stop_all()


async def test_process_that_keeps_dying_is_crash_looping(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path, backoff_base=0.05, backoff_max=0.2, crash_limit=3)
    sup.ensure("bad", 1, lambda _port: [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])
    await until(lambda: sup.crash_looping("bad"), sup=sup)
    replica = sup.groups["bad"][0]
    assert replica.last_exit_code == 3 and sup.restarts("bad") >= 3
    assert "boom" in replica.log_path.read_text()
    await sup.stop_all()


async def test_stop_reaches_grandchildren(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    sup.ensure("rev1", 1, fake("--spawn-child"))
    await until(lambda: sup.ready_count("rev1") == 1, sup=sup)
    await until(lambda: len(descendants()) == 2)
    await sup.stop_all()
    await until(lambda: descendants() == [], timeout=5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    # a parent that starts a supervised child and is then SIGKILLed: the child must not survive it
    script = f"""
import asyncio, sys
sys.path.insert(0, {str(Path(__file__).parents[2])!r})
from pathlib import Path
from folio.operator.local.supervisor import Supervisor
from tests.support.wait import until as wait_until
async def main():
    sup = Supervisor(Path({str(tmp_path)!r}))
    sup.ensure("r", 1, lambda port: [sys.executable, {FAKE!r}, str(port)])
    await sup.tick()
    print(sup.pids()[0], flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""
    import subprocess

    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        assert child.is_running()
        parent.kill()
        parent.wait()
        child.wait(timeout=10)  # raises TimeoutExpired if it was orphaned
    finally:
        parent.kill()
