"""A counting HTTP proxy and a server process, for the local object stores of the
tests and benchmarks (S3 on moto, GCS on gcp-storage-emulator, Azure on azurite).

Every request a client makes passes the proxy, which counts it by method and
bytes, can add a fixed latency, and can answer in the server's place (a
``Guard``: the GCS preconditions the emulator ignores). Servers listen on
127.0.0.1 only and are stopped by their PID.
"""

from __future__ import annotations

import collections
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

__all__ = ["Answer", "Forward", "Guard", "Traffic", "free_port", "proxied", "server_process"]

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}

Answer = tuple[int, list[tuple[str, str]], bytes]
"""An HTTP answer: status, headers, body."""
Forward = Callable[[str, str, dict[str, str], bytes | None], Answer]
"""Sends a request (method, path, headers, body) on to the server."""


class Guard(Protocol):
    def __call__(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None, forward: Forward
    ) -> Answer:
        """The answer to one request: the server's (``forward``) or the guard's own."""


def _forward_as_is(
    method: str, path: str, headers: dict[str, str], body: bytes | None, forward: Forward
) -> Answer:
    return forward(method, path, headers, body)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Traffic:
    """Requests through the proxy, by method and by ``"METHOD /path"``, and bytes."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    paths: collections.Counter[str] = field(default_factory=collections.Counter)
    latency_s: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0

    def reset(self) -> None:
        self.counts.clear()
        self.paths.clear()
        self.bytes_up = self.bytes_down = 0

    @property
    def requests(self) -> int:
        return sum(self.counts.values())


def _handler(upstream: tuple[str, int], traffic: Traffic, guard: Guard) -> type[BaseHTTPRequestHandler]:
    local = threading.local()

    def forward(method: str, path: str, headers: dict[str, str], body: bytes | None) -> Answer:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(*upstream, timeout=60)
        headers = {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (ConnectionError, http.client.HTTPException):
            local.conn = None
            raise
        answer = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
        if method == "HEAD":
            answer.append(("Content-Length", resp.getheader("Content-Length") or "0"))
        return resp.status, answer, data

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes: without TCP_NODELAY the body waits for
        # the client's delayed ACK (~40 ms a response for clients such as tensorstore's).
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            traffic.counts[self.command] += 1
            traffic.paths[f"{self.command} {self.path.split('?')[0]}"] += 1
            traffic.bytes_up += len(body or b"")
            if traffic.latency_s:
                time.sleep(traffic.latency_s)
            status, headers, data = guard(self.command, self.path, dict(self.headers.items()), body, forward)
            traffic.bytes_down += len(data)
            self.send_response_only(status)  # the upstream's Server and Date, not a second pair
            for k, v in headers:
                if k.lower() != "content-length":
                    self.send_header(k, v)
            lengths = [v for k, v in headers if k.lower() == "content-length"]
            self.send_header(
                "Content-Length", lengths[0] if self.command == "HEAD" and lengths else str(len(data))
            )
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _serve

    return Proxy


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request (a test's timeout, a killed writer) is no news."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    # clients open many connections at once (tensorstore: one per request in flight); with
    # the default backlog of 5 the rest wait a SYN retransmission, a second
    request_queue_size = 128


@contextmanager
def proxied(port: int, traffic: Traffic, guard: Guard = _forward_as_is) -> Iterator[str]:
    """A proxy on 127.0.0.1 in front of the server at ``port``: its URL."""
    proxy = _ProxyServer(("127.0.0.1", 0), _handler(("127.0.0.1", port), traffic, guard))
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}"
    finally:
        proxy.shutdown()
        proxy.server_close()


@contextmanager
def server_process(
    command: Sequence[str], port: int, name: str, timeout_s: float = 60, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``command`` (a server that will listen on 127.0.0.1:``port``), wait until it
    accepts connections, and stop it by its PID on exit (SIGTERM, then SIGKILL)."""
    with tempfile.TemporaryFile() as said:  # its output, for the error if it fails (never a full pipe)
        server = subprocess.Popen(
            list(command), stdout=said, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            _wait_listening(server, port, name, timeout_s, said)
            yield server
        finally:
            if server.poll() is None:
                os.kill(server.pid, 15)
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.kill(server.pid, 9)
                    server.wait()


def _wait_listening(
    server: subprocess.Popen[bytes], port: int, name: str, timeout_s: float, said: Any
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if server.poll() is not None:
                said.seek(0)
                output = said.read().decode(errors="replace")[-2000:]
                raise RuntimeError(
                    f"{name} exited ({server.returncode}) before it listened: {output}"
                ) from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} in {timeout_s:g} s") from None
            time.sleep(0.05)
