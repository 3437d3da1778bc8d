"""A counting HTTP proxy and a server process, for the local object stores of the
tests and benchmarks (S3 on moto, GCS on gcp-storage-emulator, Azure on azurite).

Every request a client makes passes the proxy, which counts it by method and
bytes, can add a fixed latency, and can answer in the server's place (a
``Guard``: the GCS preconditions the emulator ignores). Servers listen on
127.0.0.1 only and are stopped by their PID.
"""

from __future__ import annotations

import collections
import fcntl
import http.client
import multiprocessing
import multiprocessing.connection
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "Answer",
    "Forward",
    "Guard",
    "SharedCounts",
    "Traffic",
    "proxied",
    "proxied_apart",
    "server_process",
]

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


def _single_server_and_date(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The headers without a second ``Server`` or ``Date`` (moto's error answers carry
    Werkzeug's and its own, which aiohttp's strict parser, in asyncio debug mode, refuses)."""
    seen: set[str] = set()
    kept = []
    for name, value in headers:
        if name.lower() in ("server", "date"):
            if name.lower() in seen:
                continue
            seen.add(name.lower())
        kept.append((name, value))
    return kept


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Traffic:
    """Requests through the proxy, by method and by ``"METHOD /path"``, bytes, the
    most requests it served at once (a client's concurrency), and the requests that
    asked for the server's go-ahead before sending their body (``Expect:
    100-continue``: a round trip more, which the latency is added to)."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    paths: collections.Counter[str] = field(default_factory=collections.Counter)
    latency_s: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    in_flight: int = 0
    most_in_flight: int = 0
    continues: int = 0
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def reset(self) -> None:
        self.counts.clear()
        self.paths.clear()
        self.bytes_up = self.bytes_down = self.most_in_flight = self.continues = 0

    def asked_ahead(self) -> None:
        """One request waited for the go-ahead to send its body."""
        with self._guard:
            self.continues += 1

    @contextmanager
    def serving(self) -> Iterator[None]:
        """One request in flight for the duration."""
        with self._guard:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self._guard:
                self.in_flight -= 1

    @property
    def requests(self) -> int:
        return sum(self.counts.values())

    def added_latency_s(self) -> float:
        """The latency added to each request now."""
        return self.latency_s


_CHANGES = frozenset({"PUT", "POST", "DELETE", "PATCH"})
"""Methods that change an object (the writes the proxy hands on one at a time per object)."""


def _handler(upstream: tuple[str, int], traffic: Traffic, guard: Guard) -> type[BaseHTTPRequestHandler]:
    local = threading.local()
    by_object: collections.defaultdict[str, threading.Lock] = collections.defaultdict(threading.Lock)
    made = threading.Lock()

    def forward(method: str, path: str, headers: dict[str, str], body: bytes | None) -> Answer:
        """The request handed on; a change one at a time per object, as a real object
        store applies them: moto checks a conditional write's precondition and then
        writes, with nothing between that keeps another write of the object out, so
        two commits that both expected the same version could both land (in one CI
        run, one of four Icechunk sessions racing to commit lost its chunk)."""
        if method not in _CHANGES:
            return _forward(method, path, headers, body)
        with made:
            turn = by_object[path.split("?")[0]]
        with turn:
            return _forward(method, path, headers, body)

    def _forward(method: str, path: str, headers: dict[str, str], body: bytes | None) -> Answer:
        headers = {k: v for k, v in headers.items() if k.lower() not in _HOP_BY_HOP}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        conn = getattr(local, "conn", None)
        while True:
            reused = conn is not None
            if conn is None:
                conn = local.conn = http.client.HTTPConnection(*upstream, timeout=60)
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (ConnectionError, http.client.HTTPException) as exc:
                conn.close()
                conn = local.conn = None
                # A kept-alive connection the server closed while idle (azurite, on Node.js,
                # after 5 s): the request never reached it, so send it on a new one.
                stale = isinstance(
                    exc, http.client.RemoteDisconnected | BrokenPipeError | ConnectionResetError
                )
                if not (reused and stale):
                    raise
        answer = _single_server_and_date(
            [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
        )
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

        def handle_expect_100(self) -> bool:
            """The go-ahead a client waits for before its body: a round trip away."""
            traffic.asked_ahead()
            time.sleep(traffic.added_latency_s())
            return super().handle_expect_100()

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            traffic.counts[self.command] += 1
            traffic.paths[f"{self.command} {self.path.split('?')[0]}"] += 1
            traffic.bytes_up += len(body or b"")
            with traffic.serving():
                if latency_s := traffic.added_latency_s():
                    time.sleep(latency_s)
                status, headers, data = guard(
                    self.command, self.path, dict(self.headers.items()), body, forward
                )
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


_SPAWN = multiprocessing.get_context("spawn")
"""How the proxy's process starts (not forked from a process with threads), and its
shared memory is made."""


class SharedCounts:
    """The requests and bytes each way through a proxy in another process
    (:func:`proxied_apart`), and the latency it adds, in memory both processes share:
    the proxy's threads then take no turns at this process's GIL."""

    _REQUESTS, _UP, _DOWN, _LATENCY_NS = range(4)

    def __init__(self) -> None:
        self.cells = _SPAWN.RawArray("q", 4)
        self.lock = _SPAWN.Lock()
        self._since = [0, 0, 0]  # requests, bytes up, bytes down at the last reset

    @property
    def requests(self) -> int:
        return int(self.cells[self._REQUESTS]) - self._since[0]

    @property
    def bytes_up(self) -> int:
        return int(self.cells[self._UP]) - self._since[1]

    @property
    def bytes_down(self) -> int:
        return int(self.cells[self._DOWN]) - self._since[2]

    @property
    def latency_s(self) -> float:
        return self.latency_in(self.cells)

    @latency_s.setter
    def latency_s(self, seconds: float) -> None:
        self.cells[self._LATENCY_NS] = round(seconds * 1e9)

    @staticmethod
    def latency_in(cells: Any) -> float:
        """The latency set in ``cells`` (the proxy's process reads it there)."""
        return int(cells[SharedCounts._LATENCY_NS]) / 1e9

    def reset(self) -> None:
        with self.lock:
            self._since = [int(self.cells[n]) for n in (self._REQUESTS, self._UP, self._DOWN)]


class _LatencyShared(Traffic):
    """A proxy's traffic whose latency another process sets (:class:`SharedCounts`)."""

    def __init__(self, cells: Any) -> None:
        super().__init__()
        self._cells = cells

    def added_latency_s(self) -> float:
        return SharedCounts.latency_in(self._cells)


def _serve_apart(port: int, cells: Any, lock: Any, parent: multiprocessing.connection.Connection) -> None:
    """A proxy process's life: serve until the parent says so or goes away."""

    def counted(
        method: str, path: str, headers: dict[str, str], body: bytes | None, forward: Forward
    ) -> Answer:
        answer = forward(method, path, headers, body)
        with lock:  # (counted before the client has its answer)
            cells[SharedCounts._REQUESTS] += 1
            cells[SharedCounts._UP] += len(body or b"")
            cells[SharedCounts._DOWN] += len(answer[2])
        return answer

    with proxied(port, _LatencyShared(cells), counted) as url:
        parent.send(url)
        with suppress(EOFError):
            parent.recv()


@contextmanager
def proxied_apart(port: int, counts: SharedCounts, timeout_s: float = 60.0) -> Iterator[str]:
    """A proxy on 127.0.0.1 in front of the server at ``port``, counting into ``counts``,
    in a process of its own: its URL. For benchmarks: a proxy in the client's process
    takes turns at the GIL with a Python client (s3fs, zarr), and not with one that
    runs without it (tensorstore); a real object store is in no client's process.
    No guards. It ends when the block is left (killed by its PID if it lingers)."""
    ours, theirs = _SPAWN.Pipe()
    child = _SPAWN.Process(
        target=_serve_apart, args=(port, counts.cells, counts.lock, theirs), daemon=True, name="proxy"
    )
    child.start()
    theirs.close()
    try:
        if not ours.poll(timeout_s):
            raise RuntimeError(f"the proxy process did not start listening within {timeout_s} s")
        url: str = ours.recv()
        yield url
    finally:
        ours.close()
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()


@contextmanager
def server_process(
    command: Callable[[int], Sequence[str]],
    name: str,
    timeout_s: float = 60,
    env: dict[str, str] | None = None,
) -> Iterator[int]:
    """Start ``command(port)``, a server that will listen on 127.0.0.1:``port``, on a free
    port; wait until it accepts connections; yield the port; stop it by its PID on exit
    (SIGTERM, then SIGKILL).

    Test processes running side by side (pytest-xdist) start servers at once: a port is
    chosen and taken under a lock they share, so no two pick the same one, and a server
    that exits before it listens (a port taken by another program) is started again on
    another port."""
    with tempfile.TemporaryFile() as said:  # its output, for the error if it fails (never a full pipe)
        for _ in range(_START_ATTEMPTS):
            with _port_lock():
                port = _free_port()
                server = subprocess.Popen(
                    list(command(port)),
                    stdout=said,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
                try:
                    listening = _wait_listening(server, port, name, timeout_s, said)
                except BaseException:
                    _stop(server)
                    raise
            if listening:
                break
        else:
            raise RuntimeError(f"{name} exited before it listened, {_START_ATTEMPTS} times: {_said(said)}")
        try:
            yield port
        finally:
            _stop(server)


_START_ATTEMPTS = 3


@contextmanager
def _port_lock() -> Iterator[None]:
    """A lock shared by this machine's test processes, from choosing a port until the
    server chosen for it listens there."""
    where = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shardstore"
    where.mkdir(parents=True, exist_ok=True)  # (not the temporary directory: each test may have its own)
    with open(where / "ports.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.kill(server.pid, 15)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, 9)
            server.wait()


def _said(said: Any) -> str:
    said.seek(0)
    return str(said.read().decode(errors="replace")[-2000:])


def _wait_listening(
    server: subprocess.Popen[bytes], port: int, name: str, timeout_s: float, said: Any
) -> bool:
    """True once the server accepts connections on ``port``; False if it exited first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if server.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server.poll() is None  # (listening, and still ours)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name} did not listen on 127.0.0.1:{port} in {timeout_s:g} s: {_said(said)}"
                ) from None
            time.sleep(0.05)  # (polling for the condition: the server listens)
