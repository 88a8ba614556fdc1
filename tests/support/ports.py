"""Ports for a test's processes."""

from __future__ import annotations

import socket


def master_port() -> int:
    """A free loopback port P whose next one is free too: a multi-node engine's rendezvous takes P (its TCP
    store) and P + 1 (rank 0's step channel)."""
    while True:
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
