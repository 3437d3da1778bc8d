"""A local S3 API for tests and benchmarks: moto_server behind a counting proxy.

Every request any client makes (s3fs under zarr or shardstore, tensorstore)
passes the proxy, which counts it by method and can add a fixed latency, so
request counts and round trips compare fairly across tools. Only 127.0.0.1
is used; the server is started here and stopped by its PID.
"""

from __future__ import annotations

import collections
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["LocalS3", "local_s3"]

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalS3:
    """A moto S3 server on 127.0.0.1 with a bucket, and its request counts."""

    endpoint_url: str
    bucket: str
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    """Requests by HTTP method."""
    paths: collections.Counter[str] = field(default_factory=collections.Counter)
    """Requests by ``"METHOD /bucket/key"``."""
    latency_s: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0

    @property
    def storage_options(self) -> dict[str, Any]:
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
        }

    def url(self, path: str) -> str:
        return f"s3://{self.bucket}/{path}"

    def reset(self) -> None:
        self.counts.clear()
        self.paths.clear()
        self.bytes_up = self.bytes_down = 0

    @property
    def requests(self) -> int:
        return sum(self.counts.values())


def _handler(upstream: tuple[str, int], s3: LocalS3) -> type[BaseHTTPRequestHandler]:
    local = threading.local()

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without TCP_NODELAY the body waits for
        # the client's delayed ACK (~40 ms a response for clients such as tensorstore's).
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            s3.counts[self.command] += 1
            s3.paths[f"{self.command} {self.path.split('?')[0]}"] += 1
            s3.bytes_up += len(body or b"")
            if s3.latency_s:
                time.sleep(s3.latency_s)
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection(*upstream, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body is not None:
                headers["Content-Length"] = str(len(body))
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
            except (ConnectionError, http.client.HTTPException):
                local.conn = None
                raise
            data = resp.read()
            s3.bytes_down += len(data)
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP_BY_HOP:
                    self.send_header(k, v)
            upstream_length = resp.getheader("Content-Length") or "0"
            self.send_header("Content-Length", upstream_length if self.command == "HEAD" else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Proxy


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    # clients open many connections at once (tensorstore: one per request in flight); with
    # the default backlog of 5 the rest wait a SYN retransmission, a second
    request_queue_size = 128


@contextmanager
def local_s3(bucket: str = "shardstore", latency_s: float = 0.0) -> Iterator[LocalS3]:
    """Start moto_server and a counting proxy on 127.0.0.1; stop both on exit."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proxy: ThreadingHTTPServer | None = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.05)
        s3 = LocalS3("", bucket)
        proxy = _ProxyServer(("127.0.0.1", 0), _handler(("127.0.0.1", port), s3))
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        s3.endpoint_url = f"http://127.0.0.1:{proxy.server_address[1]}"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("PUT", f"/{bucket}")
        conn.getresponse().read()
        s3.latency_s = latency_s
        yield s3
    finally:
        if proxy is not None:
            proxy.shutdown()
            proxy.server_close()
        os.kill(server.pid, 15)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, 9)
