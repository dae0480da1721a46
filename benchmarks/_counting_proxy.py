"""A counting HTTP reverse proxy on 127.0.0.1, for ``benchmarks/ray.py`` (d): put in front of a
Ray dashboard (the Jobs API, the state and log APIs), it forwards every request as it is and keeps
the time, method and path of each, so that a client pointed at it (``compute.address=<proxy>``)
can be counted without touching the client.

    with CountingProxy("http://127.0.0.1:8265") as proxy:
        ... compute.address={proxy.address} ...
        proxy.requests   # [(time.time(), "GET", "/api/jobs/<id>"), ...]

Plain HTTP only (no websocket upgrade: ddlkit's Ray target makes none); each response is read
whole from the dashboard and sent on with its length.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: headers that belong to one connection, not to the message (RFC 9110 7.6.1), and the length, set anew
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
        "content-length"}


class CountingProxy:
    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.requests: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _forward(self) -> None:
                with proxy._lock:
                    proxy.requests.append((time.time(), self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP and k.lower() != "host"}
                conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=600)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    reply = conn.getresponse()
                    data = reply.read()
                finally:
                    conn.close()
                self.send_response(reply.status, reply.reason)
                for key, value in reply.getheaders():
                    if key.lower() not in _HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def between(self, start: float, end: float) -> list[tuple[float, str, str]]:
        with self._lock:
            return [r for r in self.requests if start <= r[0] <= end]
