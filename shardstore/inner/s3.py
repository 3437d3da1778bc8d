"""S3 (s3fs): shard commits as conditional writes, so several processes may write one shard.

A read for an update returns the object's ETag with its bytes (one GET, as
before); the write carries ``If-Match: <etag>`` (``If-None-Match: *`` for a
new object, ``If-Match`` on a delete). If another writer got there first S3
answers 412 and the update is re-read and re-applied
(:meth:`InnerStore.update`). Every other operation is plain fsspec.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import fsspec

from shardstore.inner.base import ANY_VERSION, failure
from shardstore.inner.fsspec_fs import FsspecInner

__all__ = ["S3Inner", "is_s3"]

_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict"}


def is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    return "s3" in fs.protocol and hasattr(fs, "_call_s3")


def _is_conflict(exc: BaseException) -> bool:
    """Whether s3fs's exception is S3 refusing a conditional write (412, or 409 when
    two conditional writes race)."""
    response = getattr(exc.__cause__, "response", None) or getattr(exc, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return response.get("Error", {}).get("Code") in _CONFLICT_CODES or status in (409, 412)


class S3Inner(FsspecInner):
    conditional_writes = True

    async def read_for_update(self, key: str) -> tuple[bytes | None, Hashable]:
        bucket, name, _ = self.fs.split_path(self._path(key))

        async def read(fs: Any) -> tuple[bytes | None, Hashable]:
            try:
                response = await fs._call_s3("get_object", Bucket=bucket, Key=name)
            except FileNotFoundError:
                return None, None
            try:
                return bytes(await response["Body"].read()), response["ETag"]
            finally:
                response["Body"].close()

        with failure("read", key):
            result: tuple[bytes | None, Hashable] = await self._on_home_loop(read)
            return result

    async def write_if(self, key: str, value: bytes | None, version: Hashable) -> bool:
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
                    await fs._call_s3("put_object", Bucket=bucket, Key=name, Body=value, **condition)
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
