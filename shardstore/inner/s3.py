"""S3 (s3fs): conditional writes and reads, so several processes may write one shard.

A read for an update returns the object's ETag with its bytes (one GET, as
before); the write carries ``If-Match: <etag>`` (``If-None-Match: *`` for a
new object, ``If-Match`` on a delete). If another writer got there first S3
answers 412 and the update is re-read and re-applied
(:meth:`InnerStore.update`). Reads of chunk ranges carry ``If-Match`` on the
ETag their index was read with, so a range is never read from a shard that
was replaced since. Every other operation is plain fsspec.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import threading
import zlib
from collections.abc import Hashable
from typing import Any, TypeVar

import fsspec
from zarr.abc.store import ByteRequest

from shardstore.errors import InnerStoreError
from shardstore.inner.base import (
    ANY_VERSION,
    CONDITIONAL,
    NOT_MODIFIED,
    STALE,
    VersionedReads,
    Written,
    failure,
    handing_as_read,
)
from shardstore.inner.fsspec_fs import FsspecInner, http_range, past_the_end

__all__ = ["CONNECTIONS", "S3Inner", "is_s3", "s3_storage_options"]

T = TypeVar("T")

CONNECTIONS = 64
"""Connections to S3 an s3fs file system made from a URL keeps (botocore's default is
10): as many as the requests one read or write of many chunks sends at once (a
request per shard, for up to 32 shards a group; a write commits groups side by
side). With 10, a 16-shard whole write waited a round trip more for connections."""


PARTS_FROM_BYTES = 100 << 20
"""Values s3fs's ``pipe_file`` uploads in parts (twice its 50 MiB part), not in one PUT."""


def is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    return "s3" in fs.protocol and hasattr(fs, "_call_s3")


def s3_storage_options(url: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """``storage_options`` for the file system of ``url``: on S3, with CONNECTIONS in
    botocore's connection pool unless they set ``max_pool_connections`` themselves."""
    if fsspec.core.split_protocol(url)[0] not in ("s3", "s3a"):
        return storage_options
    config = dict(storage_options.get("config_kwargs") or {})
    config.setdefault("max_pool_connections", CONNECTIONS)
    return {**storage_options, "config_kwargs": config}


_WARMING = threading.Lock()


def _warm_session(fs: Any) -> None:
    """Give ``fs`` the botocore session s3fs would make for its first call, with the S3
    service model, endpoints and rules already loaded. s3fs makes it inside that call,
    and loading those (a few MB of JSON) blocks the file system's event loop for
    0.1-0.3 s; here a worker thread does it, on a loop of its own."""
    from aiobotocore.session import AioSession

    async def load(session: Any) -> None:
        options = {"region_name": "us-east-1", "aws_access_key_id": "-", "aws_secret_access_key": "-"}
        async with session.create_client("s3", **options):  # no request is made
            pass

    with _WARMING:
        if fs.session is not None:
            return
        session = AioSession(**fs.kwargs)
        with contextlib.suppress(Exception):  # s3fs will try again, and say what fails
            asyncio.run(load(session), debug=False)
            fs.session = session


def _put_body(fs: Any, client: Any, value: Written) -> dict[str, Any]:
    """A PUT's body as botocore sends it in one piece, with the request: a bytearray
    (the shard's buffer or pieces copied into it once, as they were joined into bytes
    before), with its CRC32 where botocore would compute one.

    Bytes botocore turns into a file object, which costs (1) ``Expect: 100-continue``:
    a round trip to the server before the body goes; (2) aiohttp sending it 64 KiB per
    event-loop turn, so that with 16 PUTs under way each body waited until every other
    request was signed (a 16 MiB write: the first body reached the server after 95 ms,
    not 40). And over HTTPS a checksum botocore computes itself goes in a trailer, the
    body streamed again as a file in chunks, after one more copy: given, it goes in a
    header. (Not where the client computes checksums only when required, for stores
    that take none, or where the user named another algorithm.)"""
    body = bytearray().join(value) if isinstance(value, list) else bytearray(value)
    checksums = getattr(client.meta.config, "request_checksum_calculation", None) == "when_supported"
    if not checksums or "ChecksumAlgorithm" in (getattr(fs, "s3_additional_kwargs", None) or {}):
        return {"Body": body}
    crc = zlib.crc32(body).to_bytes(4, "big")
    return {"Body": body, "ChecksumCRC32": base64.b64encode(crc).decode("ascii")}


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind s3fs's translation of a botocore error."""
    response = getattr(exc.__cause__, "response", None) or getattr(exc, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _is_conflict(exc: BaseException) -> bool:
    """Whether s3fs's exception is S3 refusing a conditional request (412, or 409 when
    two conditional writes race)."""
    return _status(exc) in (409, 412)


class S3Inner(VersionedReads, FsspecInner):
    """The S3 bucket path ``root`` through the s3fs file system ``fs``, with
    conditional writes and version-checked range reads."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        super().__init__(fs, root)
        # (writes_buffers: see _put_body)
        self.capabilities = handing_as_read(
            self, dataclasses.replace(CONDITIONAL, writes_buffers=True), VersionedReads.get_many_versioned
        )

    async def _prepare(self, fs: fsspec.AbstractFileSystem) -> None:
        if getattr(fs, "session", False) is None and getattr(fs, "_s3", False) is None:
            await asyncio.to_thread(_warm_session, fs)

    async def _get_tagged(
        self, key: str, byte_range: ByteRequest | None, expected: Hashable | None, unless: Hashable = None
    ) -> tuple[bytes | None, Hashable | None]:
        """One GET with the object's ETag; ``If-Match: expected`` (refused: STALE) or
        ``If-None-Match: unless`` (not modified: NOT_MODIFIED)."""
        bucket, name, _ = self.fs.split_path(self._path(key))
        kwargs: dict[str, Any] = {} if expected is None else {"IfMatch": expected}
        if unless is not None:
            kwargs["IfNoneMatch"] = unless
        header = http_range(byte_range)
        if header is not None:
            kwargs["Range"] = header

        async def read(fs: Any) -> tuple[bytes | None, Hashable | None]:
            try:
                response = await fs._call_s3("get_object", Bucket=bucket, Key=name, **kwargs)
            except FileNotFoundError:
                return None, None
            except OSError as exc:
                if expected is not None and _is_conflict(exc):
                    return STALE, None
                if unless is not None and _status(exc) == 304:
                    return NOT_MODIFIED, unless
                if header is not None and past_the_end(exc):
                    return b"", None
                raise
            try:
                return bytes(await response["Body"].read()), response["ETag"]
            finally:
                response["Body"].close()

        with failure("read", key):
            result: tuple[bytes | None, Hashable | None] = await self._on_home_loop(read)
            return result

    async def set(self, key: str, value: bytes) -> None:
        """One PUT, as a shard's (s3fs's ``pipe_file`` asks for the go-ahead first); by
        ``pipe_file`` a value it uploads in parts, and one for a bucket not there yet
        (which it makes, where it may)."""
        if len(value) < PARTS_FROM_BYTES:
            try:
                await self.write_if(key, value, ANY_VERSION)
                return
            except InnerStoreError as exc:
                if not isinstance(exc.__cause__, FileNotFoundError):
                    raise
        await super().set(key, value)

    async def write_if(self, key: str, value: Written | None, version: Hashable) -> bool:
        path = self._path(key)
        bucket, name, _ = self.fs.split_path(path)
        condition: dict[str, Any] = {}
        if version is None:
            condition = {"IfNoneMatch": "*"}
        elif version is not ANY_VERSION:
            condition = {"IfMatch": version}

        async def write(fs: Any) -> None:
            try:
                if value is None:
                    await fs._call_s3("delete_object", Bucket=bucket, Key=name, **condition)
                else:
                    body = _put_body(fs, await fs.set_session(), value)
                    await fs._call_s3("put_object", Bucket=bucket, Key=name, **body, **condition)
            finally:
                fs.invalidate_cache(path)

        with failure("write" if value is not None else "delete", key):
            try:
                await self._on_home_loop(write)
            except FileNotFoundError:
                if value is not None or version is ANY_VERSION:
                    raise
                return False  # deleted by another writer since we read it: look again
            except Exception as exc:
                if condition and _is_conflict(exc):
                    return False
                raise
        return True
