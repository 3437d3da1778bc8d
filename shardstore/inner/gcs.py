"""Google Cloud Storage (gcsfs): generation-conditional writes and reads, so several
processes may write one shard.

Every GCS object has a *generation*, a number that changes whenever it is
written. A read for an update returns the generation with the bytes (the
``x-goog-generation`` header of the download, one request); the write carries
``ifGenerationMatch`` on it (``0``: the object must not exist), and so does a
delete. If another writer got there first GCS answers 412 and the update is
re-read and re-applied (:meth:`InnerStore.update`). Range reads of chunks carry
``ifGenerationMatch`` on the generation their index was read at, and a cached
shard is asked for again with ``ifGenerationNotMatch`` (304 when unchanged).
A server that sends no generation with a download (some emulators) costs one
metadata request more, followed by a read pinned to that generation. Every
other operation is plain gcsfs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Hashable, Mapping
from typing import Any

import fsspec
from zarr.abc.store import ByteRequest

from shardstore.inner.base import (
    ANY_VERSION,
    CONDITIONAL,
    NOT_MODIFIED,
    STALE,
    VersionedReads,
    failure,
    handing_as_read,
)
from shardstore.inner.fsspec_fs import FsspecInner, http_range, past_the_end

__all__ = ["GCSInner", "is_gcs"]

_GENERATION = "x-goog-generation"


def _keep_retries_off_stderr() -> None:
    """gcsfs logs each request it gives up on with a traceback (about 70 lines for one
    unreachable endpoint) and then raises, which the store turns into the one error a
    program sees. With no handler on its logger Python prints those records on stderr
    (its last resort); a handler that drops them stops only that: logging a program
    configures (``logging.basicConfig``) still receives every record."""
    logger = logging.getLogger("gcsfs")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())


def is_gcs(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return bool({"gs", "gcs"} & set(protocols)) and hasattr(fs, "_request")


class GCSInner(VersionedReads, FsspecInner):
    """The GCS bucket path ``root`` through the gcsfs file system ``fs``, with
    generation-conditional writes and deletes and generation-checked range reads."""

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str) -> None:
        super().__init__(fs, root)
        self.capabilities = handing_as_read(self, CONDITIONAL, VersionedReads.get_many_versioned)
        _keep_retries_off_stderr()

    async def _request(
        self,
        method: str,
        url: str,
        *args: str,
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
        **params: Any,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request through gcsfs (its session, credentials and retries of 429/5xx):
        status, headers, body. gcsfs raises FileNotFoundError for 404, FileExistsError
        for 412 and OSError subclasses for other failures."""

        async def call(fs: Any) -> tuple[int, Mapping[str, str], bytes]:
            status, answer, _, body = await fs._request(
                method, url, *args, headers=dict(headers or {}), data=data, **params
            )
            return int(status), answer, bytes(body)

        result: tuple[int, Mapping[str, str], bytes] = await self._on_home_loop(call)
        return result

    def _object(self, key: str) -> tuple[str, str]:
        bucket, name, _ = self.fs.split_path(self._path(key))
        return bucket, name

    async def _generation(self, key: str) -> str | None:
        """The object's generation from its metadata (None: no such object)."""
        try:
            _, _, body = await self._request("GET", "b/{}/o/{}", *self._object(key), fields="generation")
        except FileNotFoundError:
            return None
        return str(json.loads(body)["generation"])

    async def _get_tagged(
        self,
        key: str,
        byte_range: ByteRequest | None,
        expected: Hashable | None,
        unless: Hashable | None = None,
        pinned: str | None = None,
    ) -> tuple[bytes | None, Hashable | None]:
        """One download with the object's generation: ``ifGenerationMatch=expected``
        (refused: STALE), ``ifGenerationNotMatch=unless`` (unchanged: NOT_MODIFIED),
        or ``generation=pinned`` (that generation's bytes, None if it is gone)."""
        params: dict[str, Any] = {}
        if expected is not None:
            params["ifGenerationMatch"] = expected
        if unless is not None:
            params["ifGenerationNotMatch"] = unless
        if pinned is not None:
            params["generation"] = pinned
        header = http_range(byte_range)
        with failure("read", key):
            try:
                status, answer, body = await self._request(
                    "GET",
                    self.fs.url(self._path(key)),
                    headers={"Range": header} if header else None,
                    **params,
                )
            except FileNotFoundError:
                return None, None
            except FileExistsError:  # gcsfs's name for 412 Precondition Failed
                if expected is None:
                    raise
                return STALE, None
            except OSError as exc:
                if header is not None and past_the_end(exc):
                    return b"", None
                raise
        if status == 304:
            return NOT_MODIFIED, unless
        generation = answer.get(_GENERATION) or pinned or expected
        if generation is None:  # a server that does not say: ask, then read that generation
            found = await self._generation(key)
            if found is None:
                return None, None
            return await self._get_tagged(key, byte_range, None, pinned=found)
        return body, str(generation)

    async def write_if(self, key: str, value: bytes | None, version: Hashable) -> bool:
        bucket, name = self._object(key)
        condition: dict[str, Any] = {}
        if version is not ANY_VERSION:
            condition["ifGenerationMatch"] = 0 if version is None else version
        with failure("write" if value is not None else "delete", key):
            try:
                if value is None:
                    await self._request("DELETE", "b/{}/o/{}", bucket, name, **condition)
                else:
                    await self._request(
                        "POST",
                        f"{self.fs._location}/upload/storage/v1/b/{bucket}/o",
                        headers={"Content-Type": "application/octet-stream"},
                        data=value,
                        uploadType="media",
                        name=name,
                        **condition,
                    )
            except FileNotFoundError:
                if value is not None or not condition:
                    return value is None  # an unconditional delete of nothing is done
                return False  # deleted by another writer since we read it: look again
            except FileExistsError:  # 412: another writer got there first
                if not condition:
                    raise
                return False
            finally:
                self.fs.invalidate_cache(self._path(key))
        return True
