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

from shardstore.testing.proxy import SharedCounts, Traffic, proxied, proxied_apart, server_process

__all__ = ["MOTO_SERVER", "ApartS3", "LocalS3", "S3Address", "apart_s3", "local_s3"]


MOTO_SERVER = [sys.executable, "-c", "from moto.server import main; main()", "-H", "127.0.0.1"]
"""moto_server on 127.0.0.1 (its port, ``-p``, and any other option to follow)."""


@dataclass
class S3Address:
    """Where a local S3 API answers, and the options that reach it."""

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


@dataclass
class LocalS3(Traffic, S3Address):
    """A moto S3 server on 127.0.0.1 with a bucket, and its request counts."""


@dataclass
class ApartS3(S3Address, SharedCounts):
    """A moto S3 server on 127.0.0.1 with a bucket, behind a proxy in a process of its
    own (:func:`~shardstore.testing.proxy.proxied_apart`), and its request counts."""

    def __post_init__(self) -> None:
        SharedCounts.__init__(self)


@contextmanager
def _moto(bucket: str) -> Iterator[int]:
    """moto_server on 127.0.0.1 with ``bucket`` made: its port."""
    with server_process(lambda port: [*MOTO_SERVER, "-p", str(port)], "moto_server", timeout_s=30) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("PUT", f"/{bucket}")
        conn.getresponse().read()
        yield port


@contextmanager
def local_s3(bucket: str = "shardstore", latency_s: float = 0.0) -> Iterator[LocalS3]:
    """Start moto_server and a counting proxy on 127.0.0.1; stop both on exit."""
    with _moto(bucket) as port:
        s3 = LocalS3(bucket=bucket)
        with proxied(port, s3) as url:
            s3.endpoint_url = url
            s3.latency_s = latency_s
            yield s3


@contextmanager
def apart_s3(bucket: str = "shardstore", latency_s: float = 0.0) -> Iterator[ApartS3]:
    """:func:`local_s3` with the proxy in a process of its own (for benchmarks: see
    :func:`~shardstore.testing.proxy.proxied_apart`)."""
    with _moto(bucket) as port:
        s3 = ApartS3(bucket=bucket)
        with proxied_apart(port, s3) as url:
            s3.endpoint_url = url
            s3.latency_s = latency_s
            yield s3
