"""The internal API of shardstore's own tools (maintenance, layouts, convert,
rechunk): what they may ask of a store beyond zarr's Store API, and nothing
else. A store hands it out as ``store.internals``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shardstore.addressing import ChunkAddress, ShardAddress
from shardstore.catalog import ArrayCatalog
from shardstore.formats.base import ChunkTable
from shardstore.inner import InnerStore
from shardstore.inner.base import ReadInto
from shardstore.listing import ShardLister
from shardstore.metadata import ArrayInfo, ShardingPolicy, is_metadata_key, unreadable_document
from shardstore.metadata_gateway import MetadataGateway
from shardstore.reading.cache import ShardSnapshot
from shardstore.reading.reader import EachShard, ShardReader
from shardstore.routing import KeyRouter, RoutedChunks
from shardstore.writing.updates import BuiltShard, ShardToBuild
from shardstore.writing.writer import ShardWriter

__all__ = ["StoreInternals"]


@dataclass(frozen=True)
class StoreInternals:
    """One store's parts, seen through the few operations tools need."""

    raw: InnerStore
    """The inner store as shardstore sees it: shard objects, not chunk keys."""
    _catalog: ArrayCatalog
    _policy: ShardingPolicy
    _metadata: MetadataGateway
    _reader: ShardReader
    _writer: ShardWriter
    _lister: ShardLister
    _router: KeyRouter
    _check_writable: Callable[[Sequence[str]], None]
    """Raises ReadOnlyError, naming the first of the keys a refused write would write."""
    fetch_concurrency: int
    """Shards one read or write of many chunks works on at once (the store's option)."""

    async def shards_under(self, prefix: str) -> tuple[list[ShardAddress], list[str]]:
        """Shard objects that may hold keys under ``prefix``, and the other inner keys
        under it (which pass through); a batch open on the store is committed first."""
        found = await self._lister.scan(prefix)
        return found.shards, found.plain

    async def unreadable_documents(self, keys: Sequence[str]) -> dict[str, str]:
        """The metadata documents among ``keys`` that are not JSON objects, each with why
        it is damage (:func:`~shardstore.metadata.unreadable_document`): the objects below
        one pass through as stored, shards or not."""
        documents = [k for k in keys if is_metadata_key(k)]
        raws = await self.raw.get_many([(k, None) for k in documents])
        found = [
            (k, None if raw is None else unreadable_document(k, raw))
            for k, raw in zip(documents, raws, strict=True)
        ]
        return {key: problem for key, problem in found if problem is not None}

    async def stale_shard_files(self, prefix: str) -> list[str]:
        """Shard files under ``prefix`` that an interrupted resize of an array sharded by
        chunk ids left outside the directory its metadata names (never read)."""
        return (await self._lister.scan(prefix)).stale

    async def read_indices(self, shards: list[ShardAddress]) -> list[ChunkTable | None]:
        """The shards' indices, read afresh in one batch (None: no such shard)."""
        return await self._reader.read_indices(shards)

    async def compact_shard(self, shard: ShardAddress) -> None:
        """Rewrite one shard compactly (dropping dead bytes), as a commit."""
        self._check_writable(())
        await self._writer.compact(shard)

    async def shard_key_of(self, key: str) -> str | None:
        """The shard object a chunk key is stored in (None: not a chunk of a sharded array)."""
        where = await self._router.route(key)
        return where.shard.key if isinstance(where, ChunkAddress) else None

    def check_writable(self, keys: Sequence[str]) -> None:
        """Raise ReadOnlyError, naming the first of ``keys``, if the store is read-only
        (before a write reads anything)."""
        self._check_writable(keys[:1])

    async def route_chunks(self, keys: Sequence[str], *, reads_nothing: bool = False) -> RoutedChunks | None:
        """Many chunk keys of one sharded array routed at once (see
        :meth:`KeyRouter.route_many`), to read or to write; None where they must be
        read or written key by key through the store, also while a ``batch()`` is
        open, unless the call ``reads_nothing`` (a write of whole chunks): reads see
        the batch's buffered writes only key by key."""
        if self._writer.buffering and not reads_nothing:
            return None
        return await self._router.route_many(keys)

    async def write_shards(
        self, updates: Sequence[tuple[ShardAddress, dict[int, bytes | None] | BuiltShard | ShardToBuild]]
    ) -> None:
        """New values (None: erase) of chunks of several shards by place, or shards built
        whole, or to build whole by their commits, one commit per shard, concurrently;
        done when all are durable (a shard whose every chunk is given is written
        without reading it)."""
        await self._writer.write_all(
            {
                shard.key: (
                    shard,
                    values
                    if isinstance(values, BuiltShard | ShardToBuild)
                    else {place: [value] for place, value in values.items()},
                )
                for shard, values in updates
            }
        )

    async def read_shards(
        self,
        wanted: Sequence[tuple[ShardAddress, list[int], list[str]]],
        into: ReadInto | None = None,
        each: EachShard | None = None,
    ) -> list[ShardSnapshot | None]:
        """The shards of a read of many chunks, as snapshots holding the places wanted
        of each, what is not cached read into memory ``into`` gives; those read whole
        given to ``each`` as they are read where the inner store ``hands_as_read``
        (None in the list: see :meth:`ShardReader.read_shards`)."""
        return await self._reader.read_shards(wanted, into, each)

    async def array_at(self, path: str) -> ArrayInfo | None:
        """What the store knows of the array at ``path`` (None: no array there)."""
        return await self._catalog.lookup(path.strip("/"))

    async def array_of_key(self, key: str) -> ArrayInfo | None:
        """The array a key belongs to, by the key's path (None: none)."""
        return await self._catalog.array_for_key(key)

    async def metadata_written(self, key: str, raw: bytes) -> None:
        """Write a metadata document exactly as given (tools that rewrite one do)."""
        self._check_writable(())
        await self._metadata.write_as_is(key, raw)

    def check_new_array(self, key: str, raw: bytes) -> None:
        """Raise ShardingConfigError if writing this new array document through the
        store would (a dry run of its config checks, for tools writing many arrays)."""
        self._metadata.check_new_array(key, raw)

    async def chunks_per_shard_for(
        self, path: str, shape: tuple[int, ...], dtype: str = "float64"
    ) -> tuple[int, ...] | None:
        """Chunks per shard of the array at ``path``: as recorded if it exists, else as
        the store's config would shard a new array of that shape (None: unsharded, or
        sharded by chunk ids, where no block of the grid makes a shard)."""
        path = path.strip("/")
        info = await self._catalog.lookup(path)
        if info is not None:
            fmt = info.shard_format
        else:
            doc = {"zarr_format": 3, "node_type": "array", "shape": list(shape), "data_type": dtype}
            fmt = self._policy.format_for(path, doc, len(shape))
        return None if fmt is None else fmt.grid_block

    @property
    def write_strategy(self) -> str:
        """The write strategy in effect: "append" only where asked for and the inner
        store can append in place (local files), else "rewrite"."""
        return self._writer.strategy

    def cache_usage(self) -> dict[str, tuple[int, int]]:
        """Entries and bytes held by the index cache ("indices") and the shard cache ("shards")."""
        return self._reader.cache_usage()
