"""The benchmark scripts' child processes: a free port to give one, waiting until it answers, stopping them."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time
from pathlib import Path

import aiohttp
import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float = 600) -> None:
    """Until ``url``/health answers 200 (blocking); exits the benchmark, pointing at ``log``, if the
    server dies or is not up within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"server did not come up within {timeout:g}s; see {log}")
        time.sleep(0.2)


async def wait_ready(session: aiohttp.ClientSession, url: str, procs: list[subprocess.Popen[bytes]],
                     timeout: float = 60.0, poll: float = 0.05) -> None:
    """Until `url` answers 200; exits the benchmark when one of `procs` exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise SystemExit(f"a benchmark process exited early ({proc.args})")
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(poll)
    raise SystemExit(f"{url} never became ready")


def stop(procs: list[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    """SIGTERM to each that still runs, then wait for all (killing one that outlasts `timeout`)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
