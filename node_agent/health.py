"""``/healthz``, ``/readyz`` and ``/metrics`` on one small HTTP server (a daemon thread).

Liveness says the publish loop is turning (the kubelet restarts a stuck agent); readiness says the
last publish succeeded recently (a Redis outage makes agents unready, not dead: restarting them
would throw their buffers away).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest


class HealthServer:
    def __init__(self, *, port: int, live: Callable[[], bool], ready: Callable[[], bool],
                 address: str = "127.0.0.1") -> None:
        checks = {"/healthz": live, "/readyz": ready}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/metrics":
                    body, status, ctype = generate_latest(REGISTRY), 200, CONTENT_TYPE_LATEST
                elif path in checks:
                    ok = checks[path]()
                    body, status, ctype = (b"ok\n" if ok else b"not ok\n"), (200 if ok else 503), "text/plain"
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: probes every few seconds would flood the log."""

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="agent-health", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> HealthServer:
        self.thread.start()
        return self

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
