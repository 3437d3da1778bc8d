"""A local Google Cloud Storage JSON API for tests: gcp-storage-emulator behind a
counting proxy that enforces GCS's generation preconditions.

The emulator (PyPI ``gcp-storage-emulator``) stores objects and answers the JSON
API, but ignores every precondition (``ifGenerationMatch`` and the rest) and
sends no ``x-goog-generation`` header with downloads (checked: see the tests'
``test_gcs_emulator_alone_ignores_preconditions``). The proxy in front of it
does both as GCS documents them, one request at a time: before a download,
upload or delete that carries a condition it asks the emulator for the
object's generation, and answers 412 (or 304) itself where the condition
fails. So the tests check shardstore's side of the protocol (the right
conditions, sent and obeyed); GCS's own enforcement is taken from its
documentation. It also answers suffix ranges (``Range: bytes=-N``), which the
emulator serves whole. Only 127.0.0.1 is used; the server is stopped by its PID.

gcsfs 2026 asks a bucket's type over gRPC before its first call and waits
60 s per call for an emulator that has no gRPC: importing this module turns
that off for the process and the processes it starts
(``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``), before gcsfs is imported.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from shardstore.testing.proxy import Answer, Forward, Traffic, proxied, server_process

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

__all__ = ["LocalGCS", "local_gcs"]

_CONDITIONS: tuple[str, ...] = ("ifGenerationMatch", "ifGenerationNotMatch", "generation")
_EMULATOR = "from gcp_storage_emulator.__main__ import main; main()"


@dataclass
class LocalGCS(Traffic):
    """A GCS emulator on 127.0.0.1 with a bucket, and its request counts."""

    endpoint_url: str = ""
    bucket: str = "shardstore"
    enforce: bool = True
    """Whether the proxy enforces preconditions (False: the emulator as it is)."""

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"token": "anon", "project": "test", "endpoint_url": self.endpoint_url}

    def url(self, path: str) -> str:
        return f"gs://{self.bucket}/{path}"


def _object_of(path: str) -> tuple[str, str, dict[str, str]] | None:
    """(bucket, object name, query) of a JSON API object request, None for others."""
    parsed = urllib.parse.urlsplit(path)
    query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query).items()}
    parts = parsed.path.split("/")
    # /download/storage/v1/b/B/o/NAME, /storage/v1/b/B/o/NAME, /upload/storage/v1/b/B/o?name=NAME
    if "b" not in parts:
        return None
    i = parts.index("b")
    if len(parts) < i + 3 or parts[i + 2] != "o":
        return None
    bucket = urllib.parse.unquote(parts[i + 1])
    if len(parts) > i + 3 and parts[i + 3]:
        return bucket, urllib.parse.unquote("/".join(parts[i + 3 :])), query
    if "name" in query:
        return bucket, query["name"], query
    return None


class _Preconditions:
    """The guard: GCS's generation preconditions over an emulator that ignores them."""

    def __init__(self, gcs: LocalGCS) -> None:
        self.gcs = gcs
        self.lock = threading.Lock()  # check and act as one step, as GCS does

    def _generation(self, bucket: str, name: str, forward: Forward) -> str | None:
        quoted = urllib.parse.quote(name, safe="")
        status, _, body = forward("GET", f"/storage/v1/b/{bucket}/o/{quoted}?fields=generation", {}, None)
        return str(json.loads(body)["generation"]) if status == 200 else None

    def __call__(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None, forward: Forward
    ) -> Answer:
        target = _object_of(path)
        if not self.gcs.enforce or target is None:
            return forward(method, path, headers, body)
        bucket, name, query = target
        media = query.get("alt") == "media"
        conditions = {k: query[k] for k in _CONDITIONS if k in query}
        if not conditions and not media:
            return forward(method, path, headers, body)
        suffix = _suffix(headers) if media else None
        if suffix is not None:  # the emulator ignores "bytes=-N": read whole, answer the tail
            headers = {k: v for k, v in headers.items() if k.lower() != "range"}
        with self.lock:
            current = self._generation(bucket, name, forward)
            failed = _failed(conditions, current, method)
            if failed is not None:
                return failed
            status, answer, data = forward(method, path, headers, body)
            if media and current is not None and 200 <= status < 300:
                answer.append(("x-goog-generation", current))
                if suffix is not None and status == 200:
                    size = len(data)
                    data = data[max(size - suffix, 0) :]
                    answer.append(("Content-Range", f"bytes {size - len(data)}-{size - 1}/{size}"))
                    status = 206
            return status, answer, data


def _suffix(headers: dict[str, str]) -> int | None:
    """N of a ``Range: bytes=-N`` header (None: none such)."""
    asked = next((v for k, v in headers.items() if k.lower() == "range"), "").strip()
    if asked.startswith("bytes=-") and asked[7:].isdigit():
        return int(asked[7:])
    return None


def _failed(conditions: dict[str, str], current: str | None, method: str) -> Answer | None:
    """GCS's answer where a condition fails (None: all hold)."""

    def error(status: int, message: str) -> Answer:
        body = json.dumps({"error": {"code": status, "message": message}}).encode()
        return status, [("Content-Type", "application/json")], body

    if "generation" in conditions and conditions["generation"] != current:
        return error(404, "No such object (at that generation)")
    if "ifGenerationMatch" in conditions and conditions["ifGenerationMatch"] != (current or "0"):
        if current is None and method in ("GET", "DELETE"):
            return error(404, "No such object")
        return error(412, "At least one of the pre-conditions you specified did not hold.")
    if "ifGenerationNotMatch" in conditions and conditions["ifGenerationNotMatch"] == current:
        return (304, [], b"") if method == "GET" else error(412, "Precondition failed")
    return None


@contextmanager
def local_gcs(bucket: str = "shardstore", latency_s: float = 0.0) -> Iterator[LocalGCS]:
    """Start gcp-storage-emulator (in memory) and the proxy on 127.0.0.1; stop both on exit."""
    command = [sys.executable, "-c", _EMULATOR, "start", "--host=127.0.0.1", "--in-memory"]
    command.append(f"--default-bucket={bucket}")
    with server_process(
        lambda port: [*command, f"--port={port}"], "gcp-storage-emulator", timeout_s=30
    ) as port:
        gcs = LocalGCS(bucket=bucket)
        with proxied(port, gcs, _Preconditions(gcs)) as url:
            gcs.endpoint_url = url
            gcs.latency_s = latency_s
            yield gcs
