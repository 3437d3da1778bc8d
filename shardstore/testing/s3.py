"""A local S3 API for tests and benchmarks: moto_server behind a counting proxy.

Every request any client makes (s3fs under zarr or shardstore, tensorstore)
passes the proxy, which counts it by method and can add a fixed latency, so
request counts and round trips compare fairly across tools. Only 127.0.0.1
is used; the server is started here and stopped by its PID.
"""

from __future__ import annotations

import http.client
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from shardstore.testing.proxy import Traffic, proxied, server_process

__all__ = ["MOTO_SERVER", "LocalS3", "local_s3"]


MOTO_SERVER = [sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1"]
"""moto_server on 127.0.0.1 (its port, ``-p``, and any other option to follow)."""


@dataclass
class LocalS3(Traffic):
    """A moto S3 server on 127.0.0.1 with a bucket, and its request counts."""

    endpoint_url: str = ""
    bucket: str = "shardstore"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": "us-east-1"},
        }

    def url(self, path: str) -> str:
        return f"s3://{self.bucket}/{path}"


@contextmanager
def local_s3(bucket: str = "shardstore", latency_s: float = 0.0) -> Iterator[LocalS3]:
    """Start moto_server and a counting proxy on 127.0.0.1; stop both on exit."""
    with server_process(lambda port: [*MOTO_SERVER, "-p", str(port)], "moto_server", timeout_s=30) as port:
        s3 = LocalS3(bucket=bucket)
        with proxied(port, s3) as url:
            s3.endpoint_url = url
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("PUT", f"/{bucket}")
            conn.getresponse().read()
            s3.latency_s = latency_s
            yield s3
