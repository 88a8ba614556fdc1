"""A tiny HTTP server for supervisor tests: 200 on /health, nothing else; optional child it spawns.

Usage: python fake_server.py PORT [--spawn-child]
With --spawn-child it starts a long sleep in its process group, to check nothing is left behind.
"""

from __future__ import annotations

import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    if "--spawn-child" in sys.argv:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
