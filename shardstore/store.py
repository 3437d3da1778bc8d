"""ShardingStore: the ZEP 2 sharding storage transformer as a zarr store.

zarr above sees ordinary chunk keys; the inner store below sees shard
objects. Keys that are not chunk keys of a sharded array pass through
unchanged. Reads fetch shard indices, then chunk ranges, each round as one
batch; writes go to the :class:`~shardstore.writing.writer.ShardWriter`; listings
read the indices so that they report exactly the chunks present.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable
from types import TracebackType
from typing import Any, Literal

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, Store, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.core.sync import sync

from shardstore.addressing import ChunkAddress, ShardAddress, locate
from shardstore.catalog import ArrayCatalog
from shardstore.errors import ChunkKeyError
from shardstore.formats.indexed import ShardIndex
from shardstore.inner import InnerStore, adapt, slice_range
from shardstore.inner.base import DEFAULT_ATTEMPTS
from shardstore.keys import check_key, split_key
from shardstore.metadata import (
    METADATA_NAMES,
    ArrayInfo,
    ChunksPerShard,
    Layout,
    ShardingPolicy,
)
from shardstore.metadata_gateway import MetadataGateway
from shardstore.options import IndexCacheMode, ReadPolicy, ReadStrategy, StoreOptions
from shardstore.reading.cache import IndexCache, ShardCache
from shardstore.reading.coalescing import ReadCoalescer
from shardstore.reading.reader import ShardReader
from shardstore.writing.updates import Splice, Update, apply_updates, independent_of_old
from shardstore.writing.writer import DEFAULT_BATCH_BYTES, ShardWriter, WriteStrategy

__all__ = ["ShardingStore"]

_LISTING_BATCH = 512
"""Shard indices read per inner batch while listing."""
_ADDRESS_CACHE = 1 << 17
"""Chunk keys whose shard address is remembered (cleared when full)."""


def _check_byte_range(byte_range: Any) -> None:
    if byte_range is not None and not isinstance(
        byte_range, RangeByteRequest | OffsetByteRequest | SuffixByteRequest
    ):
        raise TypeError(f"Unexpected byte_range, got {byte_range}")


def _dir(prefix: str) -> str:
    return prefix if prefix == "" or prefix.endswith("/") else prefix + "/"


_ChunkUpdates = dict[str, tuple[ShardAddress, dict[int, list[Update]]]]


def _add_update(by_shard: _ChunkUpdates, chunk: ChunkAddress, update: Update) -> None:
    """Group updates per shard, in order (a later full value replaces, splices stack)."""
    ups = by_shard.setdefault(chunk.shard.key, (chunk.shard, {}))[1].setdefault(chunk.position, [])
    if not isinstance(update, Splice):
        ups.clear()
    ups.append(update)


class _BatchScope:
    """``with store.batch():`` / ``async with store.batch():``."""

    def __init__(self, store: ShardingStore, max_bytes: int) -> None:
        self._store = store
        self._max_bytes = max_bytes

    def __enter__(self) -> ShardingStore:
        self._store._writer.begin_batch(self._max_bytes)
        return self._store

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        sync(self._store._writer.end_batch(exc))

    async def __aenter__(self) -> ShardingStore:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._store._writer.end_batch(exc)


class ShardingStore(Store):
    """A zarr store that bundles the chunks of sharded arrays into shard objects.

    ``inner`` is an fsspec mapper, a URL (with ``storage_options``), a zarr
    store or a mutable mapping. ``chunks_per_shard`` decides the sharding of
    arrays created through this store (a sequence for every array of its
    rank, a mapping by array path, a callable ``(path, metadata) ->
    sequence | None``, or None); existing arrays keep the config recorded in
    their metadata. ``write_strategy`` is ``"rewrite"`` (compact shards) or
    ``"append"`` (append new chunks and index where the inner store can).

    Reads: ``read_strategy="chunk"`` reads the ranges asked for (a batch that
    wants half of a shard's chunks fetches it whole); ``"shard"`` fetches every
    shard a read touches whole, into a shard cache of ``shard_cache_bytes``, so
    the rest of a slab or whole-array read costs no request; ``"auto"`` is
    ``"shard"`` on remote stores (shards up to 64 MiB uncompressed), fetches a
    local file's shard whole once it is read a third time within a second
    (up to 16 MiB), and is ``"chunk"`` on in-memory stores.
    ``index_cache="auto"`` caches what a read can check for free (local files:
    indices by version in the same read, whole shards by a ``stat``) and
    elsewhere serves a cached whole shard for at most ``cache_max_age`` seconds
    after it was fetched; ``"revalidate"`` keeps cached shards but asks for each
    again on every read, downloading it only if it changed (S3: a conditional GET
    on its ETag); ``"trust"`` caches both until evicted (data that only this store
    changes); ``"off"`` caches nothing. Writes through this
    store always drop what it cached.
    """

    def __init__(
        self,
        inner: Any,
        chunks_per_shard: ChunksPerShard = None,
        *,
        layout: Layout = "transformer",
        read_only: bool = False,
        index_location: Literal["start", "end"] = "end",
        index_checksum: bool = False,
        write_strategy: WriteStrategy = "rewrite",
        read_strategy: ReadStrategy = "auto",
        index_cache: IndexCacheMode = "auto",
        index_cache_bytes: int = 64 * 2**20,
        shard_cache_bytes: int = 256 * 2**20,
        cache_max_age: float = 1.0,
        write_attempts: int = DEFAULT_ATTEMPTS,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(read_only=read_only)
        self._options = StoreOptions(
            layout=layout,
            write_strategy=write_strategy,
            read_strategy=read_strategy,
            index_cache=index_cache,
            index_cache_bytes=index_cache_bytes,
            shard_cache_bytes=shard_cache_bytes,
            cache_max_age=cache_max_age,
            write_attempts=write_attempts,
        )
        self._inner_arg = inner
        self._storage_options = storage_options
        self._inner = adapt(inner, storage_options)
        self._policy = ShardingPolicy(chunks_per_shard, index_location, index_checksum)
        self._catalog = ArrayCatalog(self._inner)
        self._metadata = MetadataGateway(self._inner, self._catalog, self._policy, self._options.layout)
        reads = ReadPolicy.resolve(self._options, self._inner)
        self._indices = IndexCache(reads.index_cache_bytes)
        self._shards = ShardCache(reads.shard_cache_bytes)
        self._reader = ShardReader(self._inner, self._indices, self._shards, reads)
        self._writer = ShardWriter(
            self._inner, write_strategy, on_commit=self._reader.forget, attempts=write_attempts
        )
        self._reads = ReadCoalescer(self._read_checked)
        # chunk key -> (catalog generation, address): zarr touches the same keys over and over
        self._addresses: dict[str, tuple[int, ChunkAddress]] = {}

    # -- identity -------------------------------------------------------------

    def _init_kwargs(self) -> dict[str, Any]:
        return {
            "inner": self._inner_arg,
            "chunks_per_shard": self._policy.chunks_per_shard,
            "index_location": self._policy.index_location,
            "index_checksum": self._policy.index_checksum,
            **self._options.as_kwargs(),
            "storage_options": self._storage_options,
        }

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ShardingStore)
            and self._inner == other._inner
            and self._policy == other._policy
            and self._options == other._options
            and self.read_only == other.read_only
        )

    def __repr__(self) -> str:
        return f"ShardingStore({self._inner!r}, chunks_per_shard={self._policy.chunks_per_shard!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {**self._init_kwargs(), "read_only": self.read_only}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def with_read_only(self, read_only: bool = False) -> ShardingStore:
        return type(self)(**self._init_kwargs(), read_only=read_only)

    @property
    def inner(self) -> Any:
        """The wrapped store, as given."""
        return self._inner_arg

    @property
    def supports_writes(self) -> bool:
        return True

    @property
    def supports_deletes(self) -> bool:
        return True

    @property
    def supports_listing(self) -> bool:
        return True

    # -- the internal API of shardstore's own tools (maintenance, layouts) ---------

    @property
    def raw(self) -> InnerStore:
        """The inner store as shardstore sees it: shard objects, not chunk keys."""
        return self._inner

    async def shards_under(self, prefix: str) -> tuple[list[ShardAddress], list[str]]:
        """Shard objects that may hold keys under ``prefix``, and the other inner keys
        under it (which pass through); a batch open on this store is committed first."""
        return await self._scan(prefix)

    async def read_indices(self, shards: list[ShardAddress]) -> list[ShardIndex | None]:
        """The shards' indices, read afresh in one batch (None: no such shard)."""
        return await self._reader.read_indices(shards)

    async def compact_shard(self, shard: ShardAddress) -> None:
        """Rewrite one shard compactly (dropping dead bytes), as a commit."""
        self._check_writable()
        await self._writer.compact(shard)

    async def array_at(self, path: str) -> ArrayInfo | None:
        """What the store knows of the array at ``path`` (None: no array there)."""
        return await self._catalog.lookup(path.strip("/"))

    async def array_of_key(self, key: str) -> ArrayInfo | None:
        """The array a key belongs to, by the key's path (None: none)."""
        return await self._catalog.array_for_key(key)

    async def metadata_written(self, key: str, raw: bytes) -> None:
        """Write a metadata document exactly as given (tools that rewrite one do)."""
        await self._metadata.write_as_is(key, raw)

    async def chunks_per_shard_for(
        self, path: str, shape: tuple[int, ...], dtype: str = "float64"
    ) -> tuple[int, ...] | None:
        """Chunks per shard of the array at ``path``: as recorded if it exists, else as
        this store's config would shard a new array of that shape (None: unsharded)."""
        path = path.strip("/")
        info = await self._catalog.lookup(path)
        if info is not None:
            return None if info.shard_format is None else info.shard_format.chunks_per_shard
        doc = {"zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": dtype}
        layout = self._policy.format_for(path, doc, len(shape))
        return None if layout is None else layout.chunks_per_shard

    def batch(self, max_bytes: int = DEFAULT_BATCH_BYTES) -> _BatchScope:
        """Buffer chunk writes per shard until the block ends (``with`` or ``async with``).

        A shard is written as soon as the buffer holds all its chunks inside the
        array, without reading it; the others are committed (one read-modify-write
        each) when the block ends. Past ``max_bytes`` the fullest shards are
        committed early. If the block raises, buffered writes are dropped (nothing
        partial lands over good data) and a note on the exception names them; if a
        commit fails, :class:`~shardstore.errors.BatchCommitError` names the shards.
        Reads inside the block see its writes; listings first commit the buffer.
        """
        return _BatchScope(self, max_bytes)

    # -- synchronous conveniences (zarr's SupportsSyncStore protocol) -----------

    def get_sync(
        self, key: str, *, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        return sync(self.get(key, prototype or default_buffer_prototype(), byte_range))

    def set_sync(self, key: str, value: Buffer) -> None:
        sync(self.set(key, value))

    def delete_sync(self, key: str) -> None:
        sync(self.delete(key))

    # -- key routing ------------------------------------------------------------

    async def _resolve(self, key: str, *, writing: bool = False) -> ChunkAddress | Literal[False] | None:
        """Where ``key`` lives: a chunk of a sharded array, None to pass it through,
        or False for a key written like a chunk key of a sharded array that is none
        (wrong rank). Writes to such keys, or outside the grid, raise ChunkKeyError."""
        known = self._addresses.get(key)
        if known is not None and known[0] == self._catalog.generation:
            return known[1]
        info = await self._catalog.array_for_key(key)
        if writing and (info is None or (info.shard_format is not None and not self._in_grid(info, key))):
            # The array may have been created or grown through another store instance.
            info = await self._catalog.array_for_key(key, refresh=True)
        if info is None or info.shard_format is None:
            return None
        coords = info.coords(key)
        if writing and (coords is None or not info.in_grid(coords)):
            what = (
                "outside the chunk grid"
                if coords is not None
                else f"not a chunk key of this {info.ndim}-d array"
            )
            raise ChunkKeyError(
                f"cannot write {key!r}: {what} of array {info.path or '/'!r} "
                f"(grid shape {list(info.grid_shape)})"
            )
        if coords is None:
            return False
        address = locate(info, key, coords)
        if info.in_grid(coords):  # valid for reads and writes alike until the catalog changes
            if len(self._addresses) > _ADDRESS_CACHE:
                self._addresses.clear()
            self._addresses[key] = (self._catalog.generation, address)
        return address

    @staticmethod
    def _in_grid(info: ArrayInfo, key: str) -> bool:
        coords = info.coords(key)
        return coords is not None and info.in_grid(coords)

    # -- reads ---------------------------------------------------------------------

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        _check_byte_range(byte_range)
        check_key(key)
        return await self._reads.get(prototype, key, byte_range)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        """ZEP 2 ``get_partial_values``: one inner round for the shard indices, one
        for the chunk ranges and pass-through keys. Ranges on a chunk key address
        that chunk's own bytes."""
        requests = list(key_ranges)
        for key, byte_range in requests:
            _check_byte_range(byte_range)
            check_key(key)
        return await self._read_checked(prototype, requests)

    async def _read_checked(
        self, prototype: BufferPrototype, requests: list[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        """``get_partial_values`` for requests already checked (the coalesced ``get()``s)."""
        results: list[bytes | None] = [None] * len(requests)
        chunks: list[tuple[int, ChunkAddress, ByteRequest | None]] = []
        buffered: list[tuple[int, ByteRequest | None, list[Update]]] = []
        direct: list[tuple[int, str, ByteRequest | None]] = []
        metadata: list[tuple[int, str, ByteRequest | None]] = []
        for slot, (key, byte_range) in enumerate(requests):
            if split_key(key)[1] in METADATA_NAMES:
                metadata.append((slot, key, byte_range))
                continue
            where = await self._resolve(key)
            if where is None:
                direct.append((slot, key, byte_range))
            elif where is not False:
                pending = self._writer.pending(where)
                if pending is None:
                    chunks.append((slot, where, byte_range))
                elif independent_of_old(pending):
                    value = apply_updates(None, pending)
                    results[slot] = None if value is None else slice_range(value, byte_range)
                else:  # a splice still buffered: read the whole chunk below, then apply it
                    buffered.append((slot, byte_range, pending))
                    chunks.append((slot, where, None))

        parts: list[tuple[list[Any], Awaitable[list[bytes | None]]]] = []
        if chunks:
            parts.append((chunks, self._reader.read_chunks([(c, r) for _, c, r in chunks])))
        if direct:
            parts.append((direct, self._inner.get_many([(k, r) for _, k, r in direct])))
        if metadata:
            parts.append((metadata, asyncio.gather(*(self._metadata.get(k, r) for _, k, r in metadata))))
        # the common case, one chunk, needs no gather (and no tasks)
        values = [await parts[0][1]] if len(parts) == 1 else await asyncio.gather(*(p for _, p in parts))
        for (entries, _), part_values in zip(parts, values, strict=True):
            for entry, value in zip(entries, part_values, strict=True):
                results[entry[0]] = value
        for slot, byte_range, pending in buffered:
            value = apply_updates(results[slot], pending)
            results[slot] = None if value is None else slice_range(value, byte_range)
        return [None if v is None else prototype.buffer.from_bytes(v) for v in results]

    async def _chunk_size(self, chunk: ChunkAddress) -> int | None:
        if self._writer.pending(chunk) is not None:  # in a batch: what the batch would leave
            value = (await self.get_partial_values(default_buffer_prototype(), [(chunk.key, None)]))[0]
            return None if value is None else len(value)
        entry = (await self._reader.index_entries([chunk]))[0]
        return None if entry is None else entry[1]

    async def exists(self, key: str) -> bool:
        check_key(key)
        if split_key(key)[1] in METADATA_NAMES:
            return await self._metadata.get(key) is not None
        where = await self._resolve(key)
        if where is None:
            return await self._inner.exists(key)
        return where is not False and await self._chunk_size(where) is not None

    async def getsize(self, key: str) -> int:
        check_key(key)
        if split_key(key)[1] in METADATA_NAMES:
            value = await self._metadata.get(key)
            size = None if value is None else len(value)
        else:
            where = await self._resolve(key)
            if where is None:
                size = await self._inner.getsize(key)
            else:
                size = None if where is False else await self._chunk_size(where)
        if size is None:
            raise FileNotFoundError(key)
        return size

    async def getsize_prefix(self, prefix: str) -> int:
        shards, plain = await self._scan(prefix)
        sizes = await asyncio.gather(*(self._inner.getsize(k) for k in plain))
        total = sum(s or 0 for s in sizes)
        async for _, nbytes in self._chunks_in(shards, prefix):
            total += nbytes
        return total

    # -- writes --------------------------------------------------------------------

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()
        if not isinstance(value, Buffer):
            raise TypeError(f"ShardingStore.set(): `value` must be a Buffer instance. Got {type(value)!r}.")
        check_key(key)
        data = value.to_bytes()
        if split_key(key)[1] in METADATA_NAMES:
            await self._metadata.set(key, data)
            return
        where = await self._resolve(key, writing=True)
        if where:
            await self._writer.write(where.shard, {where.position: [data]})
        else:
            await self._inner.set(key, data)

    async def set_partial_values(
        self, key_start_values: Iterable[tuple[str, int, bytes | bytearray | memoryview]]
    ) -> None:
        """ZEP 2 ``set_partial_values``: write bytes at an offset into chunks (merged
        per shard, one commit each) or into pass-through objects."""
        self._check_writable()
        by_shard: _ChunkUpdates = {}
        others: list[tuple[str, int, bytes]] = []
        for key, start, data in key_start_values:
            check_key(key)
            chunk = None if split_key(key)[1] in METADATA_NAMES else await self._resolve(key, writing=True)
            if chunk:
                _add_update(by_shard, chunk, Splice(start, bytes(data)))
            else:
                others.append((key, start, bytes(data)))
        await asyncio.gather(*(self._writer.write(shard, ups) for shard, ups in by_shard.values()))
        for key, start, data in others:  # in order: several may touch one key
            old = await self.get(key, default_buffer_prototype())
            new = apply_updates(None if old is None else old.to_bytes(), [Splice(start, data)])
            await self.set(key, default_buffer_prototype().buffer.from_bytes(new or b""))

    def check_new_array(self, key: str, raw: bytes) -> None:
        """Raise ShardingConfigError if writing this new array document would (a dry
        run of the config checks of :meth:`set`, for tools writing many arrays)."""
        self._metadata.check_new_array(key, raw)

    # -- deletes -----------------------------------------------------------------

    async def delete(self, key: str) -> None:
        await self.erase_values([key])

    async def erase_values(self, keys: Iterable[str]) -> None:
        """ZEP 2 ``erase_values``: chunks are removed from their shards (a shard left
        empty is deleted); other keys are deleted from the inner store."""
        self._check_writable()
        by_shard: _ChunkUpdates = {}
        others: list[str] = []
        for key in keys:
            check_key(key)
            where = None if split_key(key)[1] in METADATA_NAMES else await self._resolve(key)
            if where:
                _add_update(by_shard, where, None)
            elif where is None:
                others.append(key)
        await asyncio.gather(
            *(self._writer.write(shard, ups) for shard, ups in by_shard.values()),
            *(self._delete_object(k) for k in others),
        )

    async def _delete_object(self, key: str) -> None:
        await self._inner.delete(key)
        self._reader.forget(key)
        path, name = split_key(key)
        self._catalog.remember(path, name, None)

    async def delete_dir(self, prefix: str) -> None:
        self._check_writable()
        await self.erase_prefix(_dir(prefix))

    async def erase_prefix(self, prefix: str) -> None:
        """ZEP 2 ``erase_prefix``: shards wholly under the prefix are deleted without
        reading them; shards partly under it lose only the chunks under it."""
        self._check_writable()
        shards, plain = await self._scan(prefix)
        whole = [s.key for s in shards if s.info.chunk_prefix.startswith(prefix)]
        partial = [s for s in shards if not s.info.chunk_prefix.startswith(prefix)]
        doomed: _ChunkUpdates = {}
        for shard, index in zip(partial, await self._reader.read_indices(partial), strict=True):
            for pos, key in [] if index is None else shard.present_keys(index):
                if key.startswith(prefix):
                    _add_update(doomed, ChunkAddress(key, shard, pos), None)
        metadata = [k for k in plain if split_key(k)[1] in METADATA_NAMES]
        await asyncio.gather(
            *(self._writer.write(shard, ups) for shard, ups in doomed.values()),
            *(self._writer.delete_shard(k) for k in whole),
            *(self._delete_object(k) for k in plain if k not in metadata),
        )
        # Metadata last: an interrupted erase never leaves shards without their array.
        await asyncio.gather(*(self._delete_object(k) for k in metadata))

    # -- listing -------------------------------------------------------------------

    async def _scan(self, prefix: str) -> tuple[list[ShardAddress], list[str]]:
        """Inner objects that may hold keys under ``prefix``: shard objects of sharded
        arrays, and the other keys under the prefix (which pass through)."""
        await self._writer.drain()  # a listing inside a batch sees the batch's writes
        around = await self._catalog.sharded_array_around(prefix)
        inner_prefix = prefix
        if around is not None and prefix.startswith(around.chunk_prefix):
            inner_prefix = around.chunk_prefix  # shard keys differ from the chunk keys below
        shards: list[ShardAddress] = []
        plain: list[str] = []
        async for key in self._inner.list_prefix(inner_prefix):
            info = await self._catalog.array_for_key(key)
            coords = info.coords(key) if info is not None and info.shard_format is not None else None
            if info is not None and coords is not None:
                shards.append(ShardAddress(info, key, coords))
            elif key.startswith(prefix):
                plain.append(key)
        return shards, plain

    async def _chunks_in(self, shards: list[ShardAddress], prefix: str) -> AsyncIterator[tuple[str, int]]:
        """Chunk keys under ``prefix`` present in the shards' indices, with their sizes."""
        for start in range(0, len(shards), _LISTING_BATCH):
            batch = shards[start : start + _LISTING_BATCH]
            for shard, index in zip(batch, await self._reader.read_indices(batch), strict=True):
                if index is None:
                    continue
                for pos, key in shard.present_keys(index):
                    if key.startswith(prefix):
                        yield key, int(index[pos, 1])

    async def list(self) -> AsyncIterator[str]:
        async for key in self.list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        shards, plain = await self._scan(prefix)
        for key in plain:
            yield key
        async for key, _ in self._chunks_in(shards, prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        prefix = _dir(prefix)
        await self._writer.drain()
        around = await self._catalog.sharded_array_around(prefix)
        chunk_dir = around is not None and around.chunk_prefix == prefix + "c/"
        if around is None or chunk_dir:
            # No shard key sits directly below: the inner names are the logical ones.
            async for name in self._inner.list_dir(prefix):
                yield name
            return
        names = {key[len(prefix) :].split("/", 1)[0] async for key in self.list_prefix(prefix)}
        for name in sorted(names):
            yield name
