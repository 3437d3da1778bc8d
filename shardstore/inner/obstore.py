"""obstore (Rust ``object_store``): S3, and by construction GCS and Azure, without fsspec.

The same semantics as :class:`~shardstore.inner.s3.S3Inner`, on obstore's
async API: a read for an update returns the object's version with its bytes,
the pair (ETag, store version) obstore reports (S3 and Azure check the ETag,
GCS the generation); the write is a conditional PUT (``PutMode`` ``"create"``
for a new object, ``{"e_tag", "version"}`` for an update) and a refused one
(412, or 409 when two conditional writes race) makes
:meth:`InnerStore.update` re-read and retry.
Range reads of chunks carry ``If-Match`` on their index's ETag (refused:
``STALE``); revalidating reads carry ``If-None-Match`` (304:
``NOT_MODIFIED``).

Choose it by passing an instance as the inner store::

    ShardingStore(ObstoreInner.from_url("s3://bucket/path", storage_options), (8, 8))

``from_url`` takes the s3fs-style ``storage_options`` that URLs take
elsewhere in shardstore (``key``, ``secret``, ``token``, ``anon``,
``client_kwargs={"endpoint_url", "region_name"}``) or obstore's own
``S3Config`` names; other schemes (``gs://``, ``az://``, ...) go to
:func:`obstore.store.from_url` with obstore's options as given.

obstore is an optional dependency (``pip install shardstore[obstore]``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Hashable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

try:
    import obstore
except ImportError as exc:  # pragma: no cover - an optional dependency
    raise ImportError("ObstoreInner needs obstore: pip install 'shardstore[obstore]'") from exc
from obstore.exceptions import AlreadyExistsError, NotModifiedError, PreconditionError
from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from shardstore.inner.base import (
    ANY_VERSION,
    NOT_MODIFIED,
    STALE,
    Capabilities,
    TaggedReadsOnly,
    VersionedReads,
    failure,
    handing_as_read,
    slice_range,
)
from shardstore.inner.fsspec_fs import past_the_end

if TYPE_CHECKING:
    from obstore import GetOptions, ObjectMeta, PutMode
    from obstore.store import ClientConfig, ObjectStore, S3Config

__all__ = ["ObstoreInner"]

_SCHEMES = {"S3Store": "s3", "GCSStore": "gs", "AzureStore": "az", "LocalStore": "file"}
_S3FS_IGNORED = {"asynchronous", "skip_instance_cache", "use_listings_cache", "listings_expiry_time"}
"""s3fs options that mean nothing here (fsspec instance and listings caches)."""


def _options(byte_range: ByteRequest | None) -> GetOptions:
    if byte_range is None:
        return {}
    if isinstance(byte_range, RangeByteRequest):
        return {"range": (byte_range.start, byte_range.end)}
    if isinstance(byte_range, OffsetByteRequest):
        return {"range": {"offset": byte_range.offset}}
    if isinstance(byte_range, SuffixByteRequest):
        return {"range": {"suffix": byte_range.suffix}}
    raise TypeError(f"Unexpected byte_range, got {byte_range}")


def _version(meta: ObjectMeta) -> tuple[str | None, str | None]:
    """An object's version as this store hands it out: (ETag, store version)."""
    return meta["e_tag"], meta.get("version")


def _etag(version: Hashable) -> str:
    return str(version[0] if isinstance(version, tuple) else version)


def _is_conflict(exc: BaseException) -> bool:
    """Whether obstore's exception is the store refusing a conditional write: 412 on
    If-Match (Precondition), If-None-Match: * (AlreadyExists), or 409 when two
    conditional writes race."""
    return isinstance(exc, PreconditionError | AlreadyExistsError) or "409 Conflict" in str(exc)


def _location(store: ObjectStore) -> str:
    """The store's bucket (container) and prefix as a URL, without credentials."""
    config: Any = getattr(store, "config", None) or {}
    bucket = str(config.get("bucket") or config.get("container_name") or "")
    prefix = str(getattr(store, "prefix", None) or "")
    scheme = _SCHEMES.get(type(store).__name__, type(store).__name__)
    name = "/".join(p.strip("/") for p in (bucket, prefix) if p)
    return f"{scheme}://{name or hex(id(store))}"


def s3_config(storage_options: dict[str, Any] | None) -> tuple[S3Config, ClientConfig]:
    """obstore's S3 config and client options for s3fs-style ``storage_options``
    (``key``, ``secret``, ``token``, ``anon``, ``endpoint_url``/``region_name`` at the
    top or in ``client_kwargs``); obstore's own ``S3Config`` names pass through, and
    ``client_options`` is obstore's ``ClientConfig``. Path-style requests; plain HTTP
    is allowed for an ``http://`` endpoint."""
    options = dict(storage_options or {})
    client: dict[str, Any] = dict(options.pop("client_options", None) or {})
    kwargs: dict[str, Any] = dict(options.pop("client_kwargs", None) or {})
    config: dict[str, Any] = {"virtual_hosted_style_request": False}
    renames = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token"}
    for name, value in options.items():
        if name in renames:
            config[renames[name]] = value
        elif name == "anon":
            config["skip_signature"] = bool(value)
        elif name in ("endpoint_url", "region_name"):
            kwargs[name] = value
        elif name in _S3FS_IGNORED:
            continue
        else:
            config[name] = value  # obstore's S3Config names; obstore rejects unknown ones
    for name, value in kwargs.items():
        if name == "endpoint_url":
            config["endpoint"] = value
        elif name == "region_name":
            config["region"] = value
        else:
            raise TypeError(f"ObstoreInner cannot translate client_kwargs[{name!r}] for obstore")
    if str(config.get("endpoint", "")).startswith("http://"):
        client.setdefault("allow_http", True)
    return config, client  # type: ignore[return-value]


def _open(url: str, storage_options: dict[str, Any] | None) -> ObjectStore:
    from obstore.store import S3Store, from_url

    parts = urlsplit(url)
    if parts.scheme in ("s3", "s3a"):
        config, client = s3_config(storage_options)
        prefix = parts.path.strip("/") or None
        return S3Store(parts.netloc, prefix=prefix, config=config, client_options=client)
    return from_url(url, **(storage_options or {}))


_CLIENTS: dict[tuple[int, str, str], ObjectStore] = {}
"""Stores opened by :meth:`ObstoreInner.from_url`, by process (a client's connections
do not survive a fork), URL and options."""


class ObstoreInner(TaggedReadsOnly):
    """An obstore ``ObjectStore`` (its bucket and prefix), with conditional writes and
    version-checked range reads. Keys are paths below the store's prefix.

    Deletes carry no condition: object_store offers no conditional delete. So the
    store does not claim ``conditional_deletes``, and an update that empties a shard
    writes an empty shard (a conditional PUT) instead of deleting it: nothing another
    writer adds meanwhile is lost. A ``write_if(key, None, version)`` called directly
    checks the version with a HEAD first, which leaves one round trip in which another
    writer's update could be deleted.
    """

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._origin: tuple[str, dict[str, Any] | None] | None = None
        self.location = _location(store)
        self.capabilities = handing_as_read(
            self,
            Capabilities(remote=True, versioned_ranges=True, conditional_writes=True, hands_as_read=True),
            VersionedReads.get_many_versioned,
        )

    @classmethod
    def from_url(cls, url: str, storage_options: dict[str, Any] | None = None) -> ObstoreInner:
        """``s3://bucket/path`` with s3fs-style ``storage_options`` (see :func:`s3_config`);
        other URLs through :func:`obstore.store.from_url` with obstore's options.

        Like fsspec's instance cache, stores opened with the same URL and options in
        one process share one obstore client (its connection pool); an instance made
        here pickles as its URL and options, so an unpickled one shares it too."""
        try:
            key = (os.getpid(), url, json.dumps(storage_options or {}, sort_keys=True))
        except TypeError:  # options that are objects (a credential provider): a client of its own
            inner = cls(_open(url, storage_options))
        else:
            if (store := _CLIENTS.get(key)) is None:
                store = _CLIENTS[key] = _open(url, storage_options)
            inner = cls(store)
        inner._origin = (url, storage_options)
        return inner

    def __reduce__(self) -> tuple[Any, ...]:
        if self._origin is None:
            return type(self), (self.store,)
        return type(self).from_url, self._origin

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObstoreInner) and self.store == other.store

    def __repr__(self) -> str:
        return f"ObstoreInner({self.location})"

    @property
    def lock_scope(self) -> Hashable:
        return ("obstore", self.location)

    # -- reads ------------------------------------------------------------------

    async def _get_tagged(
        self, key: str, byte_range: ByteRequest | None, expected: Hashable | None, unless: Hashable = None
    ) -> tuple[bytes | None, Hashable | None]:
        """One GET with the object's ETag; ``If-Match: expected`` (refused: STALE) or
        ``If-None-Match: unless`` (not modified: NOT_MODIFIED). A range starting past
        the end reads b"" (416); a range the store cannot serve as asked (an empty
        range, a suffix of an empty object) is read whole and sliced."""
        options = _options(byte_range)
        if expected is not None:
            options["if_match"] = _etag(expected)
        if unless is not None:
            options["if_none_match"] = _etag(unless)
        with failure("read", key):
            try:
                result = await obstore.get_async(self.store, key, options=options)
                tag = _version(result.meta)
                return bytes(await result.bytes_async()), tag
            except FileNotFoundError:
                return None, None
            except PreconditionError:
                if expected is None:
                    raise
                return STALE, None
            except NotModifiedError:
                if unless is None:
                    raise
                return NOT_MODIFIED, unless
            except Exception as exc:
                if byte_range is None:
                    raise
                if past_the_end(exc):
                    return b"", None
            whole, version = await self._get_tagged(key, None, expected)
            if whole is None or whole is STALE:
                return whole, version
            return slice_range(whole, byte_range), version

    # -- writes -----------------------------------------------------------------

    async def set(self, key: str, value: bytes) -> None:
        with failure("write", key):  # one PUT (up to 5 GiB): atomic, no multipart leftovers
            await obstore.put_async(self.store, key, value, mode="overwrite", use_multipart=False)

    async def write_if(self, key: str, value: bytes | None, version: Hashable) -> bool:
        """A PUT that creates (``version`` None), replaces ``version`` (its ETag, and its
        generation where the store keeps one), or
        overwrites (``ANY_VERSION``); refused: False. A delete checks the version
        first and cannot be conditional (see the class docstring)."""
        if value is None:
            return await self._delete_if(key, version)
        mode: PutMode = "overwrite"
        if version is None:
            mode = "create"
        elif version is not ANY_VERSION:
            e_tag, generation = version if isinstance(version, tuple) else (version, None)
            mode = {}  # both where the store gave both (obstore refuses None in either)
            if e_tag is not None:
                mode["e_tag"] = str(e_tag)
            if generation is not None:
                mode["version"] = str(generation)
        with failure("write", key):
            try:
                await obstore.put_async(self.store, key, value, mode=mode, use_multipart=False)
            except Exception as exc:
                if mode != "overwrite" and _is_conflict(exc):
                    return False  # another writer got there first (or deleted it): look again
                raise
        return True

    async def _delete_if(self, key: str, version: Hashable) -> bool:
        if version is not ANY_VERSION:
            current: Hashable | None = None
            with failure("delete", key), contextlib.suppress(FileNotFoundError):
                current = _version(await obstore.head_async(self.store, key))
            if current != version:
                return False  # changed (or created, or deleted) since we read it: look again
            if current is None:
                return True  # absent, as we read it: nothing to delete
        await self.delete(key)
        return True

    async def delete(self, key: str) -> None:
        with failure("delete", key), contextlib.suppress(FileNotFoundError):
            await obstore.delete_async(self.store, key)

    # -- sizes and listings -------------------------------------------------------

    async def getsize(self, key: str) -> int | None:
        with failure("size", key):
            try:
                return int((await obstore.head_async(self.store, key))["size"])
            except FileNotFoundError:
                return None

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        """Keys starting with ``prefix`` (object stores list whole path segments: list
        the folder ``prefix`` is in, keep the keys that start with it)."""
        folder = prefix.rpartition("/")[0] or None
        with failure("list", prefix):
            async for batch in obstore.list(self.store, folder):
                for meta in batch:
                    if meta["path"].startswith(prefix):
                        yield meta["path"]

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        with failure("list", prefix):
            listing = await obstore.list_with_delimiter_async(self.store, prefix.rstrip("/") or None)
        paths = [*listing["common_prefixes"], *(meta["path"] for meta in listing["objects"])]
        for name in sorted({p.rstrip("/").rpartition("/")[2] for p in paths}):
            yield name
