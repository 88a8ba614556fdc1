"""A tiny HTTP server for supervisor tests: 200 on /health, nothing else; optional child it spawns.

Usage: python fake_server.py PORT [--spawn-child] [--unhealthy-after SECONDS]
With --spawn-child it starts a long sleep in its process group, to check nothing is left behind.
With --unhealthy-after it stays up but answers /health with 503 from that many seconds after its start,
as an engine whose step loop died would.
"""

from __future__ import annotations

import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STARTED = time.monotonic()
UNHEALTHY_AFTER = float(sys.argv[sys.argv.index("--unhealthy-after") + 1]) if "--unhealthy-after" in sys.argv else None


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        sick = UNHEALTHY_AFTER is not None and time.monotonic() - STARTED >= UNHEALTHY_AFTER
        self.send_response((503 if sick else 200) if self.path == "/health" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    if "--spawn-child" in sys.argv:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
