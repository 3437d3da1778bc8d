"""ShardingStore: the ZEP 2 sharding storage transformer as a zarr store.

zarr above sees ordinary chunk keys; the inner store below sees shard
objects. Keys that are not chunk keys of a sharded array pass through
unchanged. Reads fetch shard indices, then chunk ranges, each round as one
batch; writes go to the :class:`~shardstore.writing.writer.ShardWriter`; listings
read the indices so that they report exactly the chunks present.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from typing import Any, Literal

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

import shardstore.sync_bridge as sync_bridge
from shardstore.addressing import ChunkAddress, ShardAddress
from shardstore.catalog import ArrayCatalog
from shardstore.choices import IndexCacheMode, Layout, ReadStrategy, Renumbering, WriteStrategy
from shardstore.default_pipeline import become_default, warn_if_another_pipeline
from shardstore.errors import ReadOnlyError, StaleArrayError, StrategyFallbackWarning
from shardstore.inner import ChunkBytes, adapt, slice_range
from shardstore.inner.base import DEFAULT_ATTEMPTS
from shardstore.inner.icechunk import IcechunkInner
from shardstore.internals import StoreInternals
from shardstore.keys import check_byte_range, check_key, checked_offset, split_key
from shardstore.listing import ShardLister, as_dir
from shardstore.metadata import METADATA_NAMES, ChunksPerShard, ShardingPolicy
from shardstore.metadata_gateway import MetadataGateway
from shardstore.options import DEFAULT_FETCH_CONCURRENCY, ReadPolicy, StoreOptions
from shardstore.reading.cache import IndexCache, ShardCache
from shardstore.reading.coalescing import ReadCoalescer
from shardstore.reading.reader import ShardReader
from shardstore.routing import KeyRouter
from shardstore.tasks import gather
from shardstore.writing.updates import (
    Splice,
    Update,
    UpdatesByShard,
    add_update,
    apply_updates,
    independent_of_old,
)
from shardstore.writing.writer import DEFAULT_BATCH_BYTES, BatchScope, ShardWriter

__all__ = ["ShardingStore"]


class ShardingStore(Store):
    """A zarr store that bundles the chunks of sharded arrays into shard objects.

    Arrays created through it are sharded as ``chunks_per_shard`` says; existing
    arrays keep the configuration recorded in their metadata, so a plain
    ``ShardingStore(inner)`` re-opens them. The options after ``layout`` are this
    instance's own choices, never recorded.

    Args:
        inner: What holds the shards: an fsspec mapper, a URL or path (with
            ``storage_options``), a zarr store or a mutable mapping.
        chunks_per_shard: The sharding of new arrays: a sequence for every array of
            its rank, a mapping by array path, a callable ``(path, metadata) ->
            sequence | None``, a neuroglancer ``sharding`` object, or None (unsharded).
        layout: How new arrays' metadata describes their sharding:
            ``"transformer"`` (the ZEP 2 storage transformer) or ``"codec"`` (the
            standard ``sharding_indexed`` codec, readable without shardstore).
        read_only: Refuse every write (as it does over a read-only zarr store).
        index_location: Where new shards keep their index, ``"end"`` or ``"start"``.
        index_checksum: Whether new shards' indices carry a crc32c.
        write_strategy: ``"rewrite"`` writes each commit as one compact shard;
            ``"append"`` appends new chunks and a new index where the inner store can
            (local files), leaving dead bytes for ``compact``.
        read_strategy: ``"chunk"`` reads the ranges asked for (a batch wanting half
            of a shard's chunks fetches it whole); ``"shard"`` fetches every shard a
            read touches whole, into the shard cache; ``"auto"`` fetches a remote
            shard whole on its first read if it is at most ``whole_shard_bytes``, and
            a local one once it is read a third time within a second. In-memory
            stores always read whole shards.
        index_cache: ``"auto"`` caches what a read can check for free (local files:
            by version; S3, GCS, Azure: each range read is conditional on the version
            its index came from) and elsewhere trusts a cached shard for
            ``cache_max_age`` seconds; ``"revalidate"`` asks for each cached shard
            again on every read (a conditional GET); ``"trust"`` caches until evicted
            (data only this store changes); ``"off"`` caches nothing. Writes through
            the store always drop what it cached.
        index_cache_bytes: The bound of the index cache.
        shard_cache_bytes: The bound of the shard cache (whole shards).
        cache_max_age: Seconds a cached shard is served where it cannot be checked
            (over an Icechunk session, whose merge, rebase and discard_changes change
            what it serves unseen, ``index_cache="auto"`` serves none to a later call).
        write_attempts: Conditional writes one commit tries against other writers
            before :class:`ShardConflictError`.
        whole_shard_bytes: The byte budget of ``read_strategy="auto"`` (None: 2 MiB
            remote, 16 MiB local).
        fetch_concurrency: Shards that one read or write of many chunks holds at
            once; a read fetches half of them while it decodes the other half
            (small shards: as many as hold 8 MiB a half; big ones: 64 MiB at most
            a half), a write commits up to three quarters while it encodes the last
            (small shards: 4 MiB a quarter; big ones: 32 MiB at most).
        renumbering: What a resize of a neuroglancer-format array does when the new
            grid gives stored chunks other ids: ``"migrate"`` moves them (a copy
            committed by the metadata write), ``"refuse"`` raises
            :class:`ShardingConfigError` before anything changes.
        storage_options: For a URL ``inner``: the fsspec file system's options.
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
        whole_shard_bytes: int | None = None,
        fetch_concurrency: int = DEFAULT_FETCH_CONCURRENCY,
        renumbering: Renumbering = "migrate",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(read_only=read_only)
        become_default()  # zarr opens this store's arrays with shardstore's pipeline (once decided)
        self._options = StoreOptions(
            layout=layout,
            write_strategy=write_strategy,
            read_strategy=read_strategy,
            index_cache=index_cache,
            index_cache_bytes=index_cache_bytes,
            shard_cache_bytes=shard_cache_bytes,
            cache_max_age=cache_max_age,
            write_attempts=write_attempts,
            whole_shard_bytes=whole_shard_bytes,
            fetch_concurrency=fetch_concurrency,
            renumbering=renumbering,
        )
        self._inner_arg = inner
        self._storage_options = storage_options
        self._inner = adapt(inner, storage_options)
        if self._inner.read_only or (isinstance(inner, Store) and inner.read_only):
            # a read-only zarr store (or Icechunk session): writes refused here, naming the key
            self._read_only = True
        self._policy = ShardingPolicy(chunks_per_shard, index_location, index_checksum)
        self._catalog = ArrayCatalog(self._inner)
        reads = ReadPolicy.resolve(self._options, self._inner.capabilities)
        self._reader = ShardReader(
            self._inner, IndexCache(reads.index_cache_bytes), ShardCache(reads.shard_cache_bytes), reads
        )
        self._writer = ShardWriter(
            self._inner,
            write_strategy,
            on_commit=self._reader.forget,
            attempts=write_attempts,
            confirm_place=self._catalog.confirm_place,
        )
        self._metadata = MetadataGateway(
            self._inner,
            self._catalog,
            self._policy,
            self._options.layout,
            renumbering=renumbering,
            attempts=write_attempts,
            settle=self._writer.drain,
            forget=self._reader.forget,
        )
        if write_strategy == "append" and not self._inner.capabilities.append:
            warnings.warn(
                f"write_strategy='append' needs an inner store that can append in place (local "
                f"files); {self._inner!r} cannot, so shards are rewritten whole ('rewrite')",
                StrategyFallbackWarning,
                stacklevel=2,
            )
        self._router = KeyRouter(self._catalog)
        self._lister = ShardLister(self._inner, self._catalog, self._reader, self._writer.drain)
        self._reads = ReadCoalescer(self._read_checked)
        self.internals = StoreInternals(
            self._inner,
            self._catalog,
            self._policy,
            self._metadata,
            self._reader,
            self._writer,
            self._lister,
            self._router,
            self._check_writable,
            self._options.fetch_concurrency,
        )
        """The internal API of shardstore's own tools (see :mod:`shardstore.internals`)."""

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
        """The same store (same inner store and options), opened read-only or writable:
        writable over a read-only zarr store is over that store's writable twin (its
        ``with_read_only(False)``), as zarr's own wrappers are."""
        kwargs = self._init_kwargs()
        inner = kwargs["inner"]
        if not read_only and isinstance(inner, Store) and inner.read_only:
            kwargs["inner"] = inner.with_read_only(False)
        return type(self)(**kwargs, read_only=read_only)

    @property
    def inner(self) -> Any:
        """The wrapped store, as given."""
        return self._inner_arg

    @property
    def session(self) -> Any:
        """The Icechunk session of the wrapped store (AttributeError for any other store).

        Icechunk's own helpers for dask and distributed writes find a zarr array's
        session as ``array.store.session``; through this they work on arrays of a
        ShardingStore over a session or a fork too."""
        if not isinstance(self._inner, IcechunkInner):
            raise AttributeError(f"{self!r} wraps no Icechunk session")
        return self._inner.session

    @property
    def supports_writes(self) -> bool:
        """True: chunks and metadata can be written (unless opened read-only)."""
        return True

    @property
    def supports_deletes(self) -> bool:
        """True: keys can be deleted; a shard emptied of its chunks is deleted too."""
        return True

    @property
    def supports_listing(self) -> bool:
        """True: listings read the shard indices and name chunk keys, as zarr expects."""
        return True

    @property
    def supports_partial_writes(self) -> Literal[False]:
        """Always False, as zarr 3.1.1+ says of every store; zarr 3.1.0 requires the
        property of each store."""
        return False

    def _check_writable(self, keys: Sequence[str] = ()) -> None:
        """Refuse a write to a read-only store, naming the first key it would write."""
        if self.read_only:
            what = f"{keys[0]!r} was not written: " if keys else ""
            raise ReadOnlyError(
                f"{what}store was opened in read-only mode and does not support writing: {self!r}"
            )

    def batch(self, max_bytes: int = DEFAULT_BATCH_BYTES) -> BatchScope[ShardingStore]:
        """Buffer chunk writes per shard until the block ends (``with`` or ``async with``).

        A shard is written as soon as the buffer holds all its chunks inside the
        array, without reading it; the others are committed (one read-modify-write
        each) when the block ends. Past ``max_bytes`` the fullest shards are
        committed early. If the block raises, the writes not committed yet are dropped
        (a shard committed early keeps what that commit wrote) and a note on the
        exception names the shards; if a commit fails,
        :class:`~shardstore.errors.BatchCommitError` names the shards (after an error
        in the block: a note on that error, which goes on).
        Reads inside the block see its writes; listings first commit the buffer.
        A read-only store refuses a batch (ReadOnlyError).
        """
        self._check_writable()
        return self._writer.batch(max_bytes, self)

    # -- synchronous conveniences (zarr's SupportsSyncStore protocol) -----------
    # They observe exactly what the async methods observe (they run them), from any
    # thread, inside a running event loop or not (see shardstore.sync_bridge).

    def get_sync(
        self, key: str, *, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """:meth:`get` from synchronous code, also inside a running event loop."""
        return sync_bridge.run(self.get(key, prototype or default_buffer_prototype(), byte_range))

    def set_sync(self, key: str, value: Buffer) -> None:
        """:meth:`set` from synchronous code, also inside a running event loop."""
        sync_bridge.run(self.set(key, value))

    def delete_sync(self, key: str) -> None:
        """:meth:`delete` from synchronous code, also inside a running event loop."""
        sync_bridge.run(self.delete(key))

    # -- reads ---------------------------------------------------------------------

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """The value of ``key`` (a chunk is read out of its shard), or ``byte_range`` of it;
        None if absent. The reads of one event-loop turn are batched per shard."""
        check_byte_range(byte_range)
        check_key(key)
        if split_key(key)[1] not in METADATA_NAMES:  # a chunk read alone: another pipeline's way
            warn_if_another_pipeline(key)
        return await self._reads.get(prototype, key, byte_range)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        """ZEP 2 ``get_partial_values``: one inner round for the shard indices, one
        for the chunk ranges and pass-through keys. Ranges on a chunk key address
        that chunk's own bytes."""
        requests = list(key_ranges)
        for key, byte_range in requests:
            check_byte_range(byte_range)
            check_key(key)
        return await self._read_checked(prototype, requests)

    async def _read_checked(
        self, prototype: BufferPrototype, requests: list[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        """``get_partial_values`` for requests already checked (the coalesced ``get()``s):
        chunk reads, metadata reads and reads passed through, each kind in one batch."""
        results: list[ChunkBytes | None] = [None] * len(requests)
        chunks: list[tuple[int, ChunkAddress, ByteRequest | None]] = []
        metadata: list[tuple[int, str, ByteRequest | None]] = []
        passed: list[tuple[int, str, ByteRequest | None]] = []
        for slot, (key, byte_range) in enumerate(requests):
            where = await self._router.route(key)
            if isinstance(where, ChunkAddress):
                chunks.append((slot, where, byte_range))
            elif where == "metadata":
                metadata.append((slot, key, byte_range))
            elif where == "inner":
                passed.append((slot, key, byte_range))
        reads: list[tuple[list[int], Awaitable[Sequence[ChunkBytes | None]]]] = []
        if chunks:
            reads.append(([i for i, _, _ in chunks], self._read_chunks([(c, r) for _, c, r in chunks])))
        if metadata:
            reads.append(
                ([i for i, _, _ in metadata], self._metadata.get_many([(k, r) for _, k, r in metadata]))
            )
        if passed:
            reads.append(([i for i, _, _ in passed], self._inner.get_many([(k, r) for _, k, r in passed])))
        # the common case, one kind of key, needs no gather (and no tasks)
        values = [await reads[0][1]] if len(reads) == 1 else await gather(*(r for _, r in reads))
        for (slots, _), read_values in zip(reads, values, strict=True):
            for slot, value in zip(slots, read_values, strict=True):
                results[slot] = value
        buffers = [None if v is None else prototype.buffer.from_bytes(v) for v in results]
        missing = {
            slot: chunk.shard
            for slot, chunk, _ in chunks
            if results[slot] is None and chunk.shard.shard_format.places_follow_grid
        }
        if missing and await self._renumbered_elsewhere(list(missing.values())):
            # a chunk of a renumbered array: read at its new id, as plain zarr would find it
            again = await self._read_checked(prototype, [requests[slot] for slot in missing])
            for slot, found in zip(missing, again, strict=True):
                buffers[slot] = found
        return buffers

    async def _renumbered_elsewhere(self, shards: list[ShardAddress]) -> bool:
        """Whether another process renumbered the chunk ids of these shards' arrays since
        this store read their metadata (asked when chunks of them were not found: the
        catalog then holds the new metadata)."""
        moved = False
        for shard in {s.info.path: s for s in shards}.values():
            try:
                await self._catalog.confirm_place(shard)
            except StaleArrayError:
                moved = True
        return moved

    async def _read_chunks(
        self, chunks: list[tuple[ChunkAddress, ByteRequest | None]]
    ) -> list[ChunkBytes | None]:
        """Chunk bytes from their shards, as an open ``batch()`` would leave them: a chunk
        the batch gives a whole new value is served from it; one with a splice still
        buffered is read whole and the splice applied."""
        if not self._writer.buffering:
            return await self._reader.read_chunks(chunks)
        results: list[ChunkBytes | None] = [None] * len(chunks)
        stored: list[int] = []
        spliced: list[tuple[int, list[Update]]] = []
        for slot, (chunk, byte_range) in enumerate(chunks):
            pending = self._writer.pending(chunk)
            if pending is None:
                stored.append(slot)
            elif independent_of_old(pending):
                value = apply_updates(None, pending)
                results[slot] = None if value is None else slice_range(memoryview(value), byte_range)
            else:
                spliced.append((slot, pending))
        wanted = [chunks[i] for i in stored] + [(chunks[i][0], None) for i, _ in spliced]
        values = await self._reader.read_chunks(wanted) if wanted else []
        for slot, read_value in zip([*stored, *(i for i, _ in spliced)], values, strict=True):
            results[slot] = read_value
        for slot, pending in spliced:
            spliced_value = apply_updates(results[slot], pending)
            results[slot] = (
                None if spliced_value is None else slice_range(memoryview(spliced_value), chunks[slot][1])
            )
        return results

    async def _size(self, key: str) -> int | None:
        where = await self._router.route(key)
        if where == "metadata":
            value = await self._metadata.get(key)
            return None if value is None else len(value)
        if where == "inner":
            return await self._inner.getsize(key)
        if where == "absent":
            return None
        if self._writer.pending(where) is not None:  # in a batch: what the batch would leave
            chunk = (await self._read_chunks([(where, None)]))[0]
            return None if chunk is None else len(chunk)
        entry = (await self._reader.index_entries([where]))[0]
        return None if entry is None else entry[1]

    async def exists(self, key: str) -> bool:
        """Whether ``key`` is present: a chunk if its shard's index lists it."""
        check_key(key)
        if await self._router.route(key) == "inner":
            return await self._inner.exists(key)
        return await self._size(key) is not None

    async def getsize(self, key: str) -> int:
        """The size of ``key``'s value (a chunk's stored bytes); FileNotFoundError if absent."""
        check_key(key)
        size = await self._size(key)
        if size is None:
            raise FileNotFoundError(key)
        return size

    async def getsize_prefix(self, prefix: str) -> int:
        """The total size of the keys under the directory ``prefix/`` (zarr 3.4's rule:
        a sibling ``prefixx/k`` does not count): the sum of :meth:`getsize` over the keys
        :meth:`list_prefix` gives."""
        return await self._lister.size_under(as_dir(prefix), self._size)

    # -- writes --------------------------------------------------------------------

    async def set(self, key: str, value: Buffer) -> None:
        """Write ``key``: a chunk is committed into its shard (read-modify-write that loses
        no other writer's chunk) before this returns, or held by an open ``batch()``."""
        self._check_writable([key])
        if not isinstance(value, Buffer):
            raise TypeError(f"ShardingStore.set(): `value` must be a Buffer instance. Got {type(value)!r}.")
        check_key(key)
        data = value.to_bytes()
        where = await self._router.route(key, writing=True)
        if isinstance(where, ChunkAddress):
            warn_if_another_pipeline(key)  # a chunk written alone: another pipeline's way
            try:
                await self._writer.write(where.shard, {where.position: [data]})
            except StaleArrayError:
                await self._write_rerouted({key: data})
        elif where == "metadata":
            await self._metadata.set(key, data)
        else:
            await self._inner.set(key, data)

    async def set_many(self, values: Iterable[tuple[str, Buffer | bytes | None]]) -> None:
        """Whole new values of several keys (None: delete), each shard's chunks merged
        into one commit, the shards committed concurrently; done when all are durable.

        zarr's own writes reach a store one chunk at a time, so a shard is
        rewritten once per burst; a caller holding many chunks at once (such as
        :class:`~shardstore.pipeline.ShardAwarePipeline`) writes each shard once,
        and a shard whose chunks are all given is written without reading it.
        Values may be ``bytes`` as well as zarr Buffers (no copy is made of them)."""
        values = list(values)
        self._check_writable([k for k, _ in values[:1]])
        by_shard: UpdatesByShard = {}
        chunks: dict[str, bytes | None] = {}
        others: list[tuple[str, Buffer | None]] = []
        for key, value in values:
            check_key(key)
            if value is not None and not isinstance(value, Buffer | bytes):
                raise TypeError(
                    f"ShardingStore.set_many(): the value of {key!r} must be a Buffer, bytes or None"
                )
            where = await self._router.route(key, writing=value is not None)
            if isinstance(where, ChunkAddress):
                chunks[key] = value.to_bytes() if isinstance(value, Buffer) else value
                add_update(by_shard, where, chunks[key])
            elif where != "absent":
                if isinstance(value, bytes):
                    value = default_buffer_prototype().buffer.from_bytes(value)
                others.append((key, value))
        try:
            await gather(
                self._writer.write_all(by_shard),
                *(self.set(k, v) if v is not None else self.delete(k) for k, v in others),
            )
        except StaleArrayError:
            await self._write_rerouted(chunks)

    async def set_partial_values(
        self, key_start_values: Iterable[tuple[str, int, bytes | bytearray | memoryview]]
    ) -> None:
        """ZEP 2 ``set_partial_values``: write bytes at an offset into chunks (merged
        per shard, one commit each) or into pass-through objects."""
        key_start_values = [(key, checked_offset(key, start), data) for key, start, data in key_start_values]
        self._check_writable([k for k, _, _ in key_start_values[:1]])
        by_shard: UpdatesByShard = {}
        others: list[tuple[str, int, bytes]] = []
        for key, start, data in key_start_values:
            check_key(key)
            where = await self._router.route(key, writing=True)
            if isinstance(where, ChunkAddress):
                add_update(by_shard, where, Splice(start, bytes(data)))
            else:
                others.append((key, start, bytes(data)))
        await self._writer.write_all(by_shard)
        for key, start, data in others:  # in order: several may touch one key
            old = await self.get(key, default_buffer_prototype())
            new = apply_updates(None if old is None else old.to_bytes(), [Splice(start, data)])
            await self.set(key, default_buffer_prototype().buffer.from_bytes(new or b""))

    # -- deletes -----------------------------------------------------------------

    async def delete(self, key: str) -> None:
        """Delete ``key`` (a chunk: its entry in its shard's index); absent keys are no error."""
        await self.erase_values([key])

    async def erase_values(self, keys: Iterable[str]) -> None:
        """ZEP 2 ``erase_values``: chunks are removed from their shards (a shard left
        empty is deleted); other keys are deleted from the inner store."""
        keys = list(keys)
        self._check_writable(keys)
        by_shard: UpdatesByShard = {}
        chunks: list[str] = []
        others: list[str] = []
        for key in keys:
            check_key(key)
            where = await self._router.route(key)
            if isinstance(where, ChunkAddress):
                add_update(by_shard, where, None)
                chunks.append(key)
            elif where != "absent":
                others.append(key)
        try:
            await gather(self._writer.write_all(by_shard), *(self._delete_object(k) for k in others))
        except StaleArrayError:
            await self._write_rerouted(dict.fromkeys(chunks))

    async def _write_rerouted(self, values: dict[str, bytes | None]) -> None:
        """Write chunks again after StaleArrayError: another process renumbered their
        array since this store read its metadata, and the catalog has now read it
        afresh, so each key routes to its chunk's new id (as plain zarr, whose chunk
        keys never move, would write them)."""
        by_shard: UpdatesByShard = {}
        for key, value in values.items():
            where = await self._router.route(key, writing=value is not None)
            if isinstance(where, ChunkAddress):
                add_update(by_shard, where, value)
        await self._writer.write_all(by_shard)

    async def _delete_object(self, key: str) -> None:
        await self._inner.delete(key)
        self._reader.forget(key)
        path, name = split_key(key)
        self._catalog.remember(path, name, None)

    async def delete_dir(self, prefix: str) -> None:
        """Delete every key under the directory ``prefix/``, shards whole."""
        self._check_writable([as_dir(prefix)])
        await self.erase_prefix(as_dir(prefix))

    async def erase_prefix(self, prefix: str) -> None:
        """ZEP 2 ``erase_prefix``: shards wholly under the prefix are deleted without
        reading them; shards partly under it lose only the chunks under it."""
        self._check_writable([prefix])
        found = await self._lister.scan(prefix)
        whole = [s.key for s in found.shards if s.info.chunk_prefix.startswith(prefix)]
        partial = [s for s in found.shards if not s.info.chunk_prefix.startswith(prefix)]
        doomed: UpdatesByShard = {}
        async for chunk, _ in self._lister.chunks_in(partial, prefix):
            add_update(doomed, chunk, None)
        metadata = [k for k in found.plain if await self._router.route(k) == "metadata"]
        await gather(
            self._writer.write_all(doomed),
            *(self._writer.delete_shard(k) for k in whole),
            *(self._delete_object(k) for k in found.plain + found.stale if k not in metadata),
        )
        # Metadata last: an interrupted erase never leaves shards without their array.
        await gather(*(self._delete_object(k) for k in metadata))

    # -- listing -------------------------------------------------------------------

    async def list(self) -> AsyncIterator[str]:
        """Every key, chunks named from the shard indices (never shard objects)."""
        async for key in self._lister.list_prefix(""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        """Every key that starts with ``prefix``, chunks named from the shard indices."""
        async for key in self._lister.list_prefix(prefix):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        """The names directly below the directory ``prefix`` (chunk keys' first segments
        from the shard indices)."""
        async for name in self._lister.list_dir(prefix):
            yield name
