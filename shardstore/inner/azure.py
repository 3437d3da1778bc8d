"""Azure Blob Storage (adlfs): ETag-conditional writes and reads, so several
processes may write one shard.

A read for an update returns the blob's ETag with its bytes (one download); the
write carries ``If-Match`` on it (``If-None-Match: *`` for a new blob), and so
does a delete. If another writer got there first Azure answers 412 (409 for a
blob that now exists) and the update is re-read and re-applied
(:meth:`InnerStore.update`). Range reads of chunks carry ``If-Match`` on the
ETag their index was read with, and a cached shard is asked for again with
``If-None-Match`` (304 when unchanged). These go through the Azure SDK client
adlfs holds (``service_client``); every other operation is plain adlfs.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import fsspec
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from shardstore.errors import ShardConflictError
from shardstore.inner.base import (
    ANY_VERSION,
    CONDITIONAL,
    NOT_MODIFIED,
    STALE,
    TaggedReadsOnly,
    VersionedReads,
    backoff,
    failure,
    handing_as_read,
)
from shardstore.inner.fsspec_fs import FsspecInner

__all__ = ["AzureInner", "is_azure"]


def is_azure(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return bool({"az", "abfs", "abfss"} & set(protocols)) and hasattr(fs, "service_client")


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


class AzureInner(TaggedReadsOnly, FsspecInner):
    """The Azure container path ``root`` through the adlfs file system ``fs``, with
    ETag-conditional writes and deletes and ETag-checked range reads."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        super().__init__(fs, root)
        self.capabilities = handing_as_read(self, CONDITIONAL, VersionedReads.get_many_versioned)

    def _blob(self, fs: Any, key: str) -> Any:
        container, name, _ = fs.split_path(self._path(key))
        return fs.service_client.get_blob_client(container, name)

    async def _get_tagged(
        self, key: str, byte_range: ByteRequest | None, expected: Hashable | None, unless: Hashable = None
    ) -> tuple[bytes | None, Hashable | None]:
        """One download with the blob's ETag; ``If-Match: expected`` (refused: STALE) or
        ``If-None-Match: unless`` (unchanged: NOT_MODIFIED). A suffix range asks for the
        blob's size first (Azure ranges have a start), under the same condition."""
        from azure.core import MatchConditions

        async def read(fs: Any) -> tuple[bytes | None, Hashable | None]:
            blob = self._blob(fs, key)
            condition: dict[str, Any] = {}
            if expected is not None:
                condition = {"etag": expected, "match_condition": MatchConditions.IfNotModified}
            elif unless is not None:
                condition = {"etag": unless, "match_condition": MatchConditions.IfModified}
            for attempt in range(_SUFFIX_ATTEMPTS):
                try:
                    offset, length, sized = await _limits(blob, byte_range, condition)
                    if length == 0:
                        return b"", expected
                    # a suffix is cut at the size of the version it was measured on: read
                    # from that version only (another would give other bytes at that offset)
                    at = (
                        condition
                        if sized is None
                        else {"etag": sized, "match_condition": MatchConditions.IfNotModified}
                    )
                    stream = await blob.download_blob(offset=offset, length=length, **at)
                    return bytes(await stream.readall()), stream.properties.etag
                except Exception as exc:  # the SDK's errors, told apart by their status
                    status = _status(exc)
                    if status == 404:
                        return None, None
                    if status == 304 and unless is not None:
                        return NOT_MODIFIED, unless
                    if status == 412 and expected is not None:
                        return STALE, None
                    if status == 416:  # a range that starts past the end: no bytes
                        return b"", None
                    if status != 412:
                        raise
                # replaced between its size and its bytes: measured again, after a pause
                await backoff(attempt)
            raise ShardConflictError(
                f"{key!r} was replaced by other writers between its size and its last bytes in each of "
                f"{_SUFFIX_ATTEMPTS} attempts to read them; try again"
            )

        with failure("read", key):
            result: tuple[bytes | None, Hashable | None] = await self._on_home_loop(read)
            return result

    async def write_if(self, key: str, value: bytes | None, version: Hashable) -> bool:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

        async def write(fs: Any) -> bool:
            blob = self._blob(fs, key)
            try:
                if value is None:
                    if version is ANY_VERSION:
                        await blob.delete_blob()
                    else:
                        await blob.delete_blob(etag=version, match_condition=MatchConditions.IfNotModified)
                elif version is ANY_VERSION:
                    await blob.upload_blob(value, overwrite=True)
                elif version is None:
                    await blob.upload_blob(value, overwrite=False)  # If-None-Match: *
                else:
                    await blob.upload_blob(
                        value, overwrite=True, etag=version, match_condition=MatchConditions.IfNotModified
                    )
            except ResourceNotFoundError:
                if value is not None:
                    raise
                return version is ANY_VERSION  # gone already: only an unconditional delete is done
            except (ResourceModifiedError, ResourceExistsError):  # another writer got there first
                if version is ANY_VERSION:
                    raise
                return False
            finally:
                fs.invalidate_cache(self._path(key))
            return True

        with failure("write" if value is not None else "delete", key):
            done: bool = await self._on_home_loop(write)
            return done


_SUFFIX_ATTEMPTS = 8
"""Tries of a suffix read whose blob is replaced between its size and its bytes."""


async def _limits(
    blob: Any, byte_range: ByteRequest | None, condition: dict[str, Any]
) -> tuple[int, int | None, str | None]:
    """(offset, length) of a byte request on a blob (length None: to the end), and the
    ETag of the version whose size placed a suffix (None: no size asked for)."""
    if byte_range is None:
        return 0, None, None
    if isinstance(byte_range, RangeByteRequest):
        return byte_range.start, max(byte_range.end - byte_range.start, 0), None
    if isinstance(byte_range, OffsetByteRequest):
        return byte_range.offset, None, None
    if isinstance(byte_range, SuffixByteRequest):
        properties = await blob.get_blob_properties(**condition)
        size = properties.size
        return max(size - byte_range.suffix, 0), min(byte_range.suffix, size), properties.etag
    raise TypeError(f"Unexpected byte_range, got {byte_range}")
