"""Listing through shards: the chunk keys a sharded array holds are the entries
present in its shards' indices, so listings read indices, never shard bodies."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from shardstore.addressing import ChunkAddress, ShardAddress, shard_at
from shardstore.catalog import ArrayCatalog
from shardstore.formats.base import ChunkTable, table_entry
from shardstore.inner import InnerStore
from shardstore.reading.reader import ShardReader
from shardstore.tasks import gather

__all__ = ["Scanned", "ShardLister", "as_dir"]

_INDEX_BATCH = 512
"""Shard indices read per inner batch while listing."""


def _nbytes(table: ChunkTable, chunk: int) -> int:
    where = table_entry(table, chunk)
    assert where is not None  # listed as present
    return where[1]


def as_dir(prefix: str) -> str:
    return prefix if prefix == "" or prefix.endswith("/") else prefix + "/"


@dataclass
class Scanned:
    """The inner objects under a prefix, by what they are to the store."""

    shards: list[ShardAddress] = field(default_factory=list)
    """Shard objects of sharded arrays."""
    plain: list[str] = field(default_factory=list)
    """Keys that pass through (metadata, unsharded arrays, foreign files)."""
    stale: list[str] = field(default_factory=list)
    """Shard files of an array sharded by chunk ids that are not its shards now: an
    interrupted resize left them in a directory the metadata no longer names. Never
    read or listed; deleted with their array, reported by ``leftovers``."""


class ShardLister:
    """Lists keys under a prefix: pass-through keys as ``inner`` has them, chunk
    keys of the sharded arrays ``catalog`` knows from their shards' indices (read
    by ``reader``). ``settle`` is awaited first, so that a listing inside a
    ``batch()`` sees the batch's writes."""

    def __init__(
        self,
        inner: InnerStore,
        catalog: ArrayCatalog,
        reader: ShardReader,
        settle: Callable[[], Awaitable[None]],
    ) -> None:
        self._inner = inner
        self._catalog = catalog
        self._reader = reader
        self._settle = settle

    async def scan(self, prefix: str) -> Scanned:
        """Inner objects that may hold keys under ``prefix``, by what they are."""
        await self._settle()
        around = await self._catalog.sharded_array_around(prefix)
        inner_prefix = prefix
        if around is not None and prefix.startswith(around.chunk_prefix):
            inner_prefix = around.chunk_prefix  # shard keys differ from the chunk keys below
        found = Scanned()
        async for key in self._inner.list_prefix(inner_prefix):
            info = await self._catalog.array_for_key(key)
            shard = None if info is None else shard_at(info, key)
            if shard is None and info is None and key.endswith(".shard"):
                info = await self._catalog.array_for_shard_file(key)
                shard = None if info is None else shard_at(info, key)
                if shard is None and info is not None:
                    if key.startswith(prefix):
                        found.stale.append(key)
                    continue
            if shard is not None:
                found.shards.append(shard)
            elif key.startswith(prefix):
                found.plain.append(key)
        return found

    async def chunks_in(
        self, shards: list[ShardAddress], prefix: str
    ) -> AsyncIterator[tuple[ChunkAddress, int]]:
        """Chunks under ``prefix`` present in the shards' indices, with their sizes."""
        for start in range(0, len(shards), _INDEX_BATCH):
            batch = shards[start : start + _INDEX_BATCH]
            for shard, index in zip(batch, await self._reader.read_indices(batch), strict=True):
                if index is None:
                    continue
                for pos, key in shard.present_keys(index):
                    if key.startswith(prefix):
                        yield ChunkAddress(key, shard, pos), _nbytes(index, pos)

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        found = await self.scan(prefix)
        for key in found.plain:
            yield key
        async for chunk, _ in self.chunks_in(found.shards, prefix):
            yield chunk.key

    async def size_under(self, prefix: str, size_of: Callable[[str], Awaitable[int | None]]) -> int:
        """The total size of the keys under ``prefix``: chunks' from their shards'
        indices, each pass-through key's as ``size_of`` tells it (a metadata document
        as zarr reads it, without the entry that records the sharding)."""
        found = await self.scan(prefix)
        total = sum(s or 0 for s in await gather(*(size_of(k) for k in found.plain)))
        async for _, nbytes in self.chunks_in(found.shards, prefix):
            total += nbytes
        return total

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        prefix = as_dir(prefix)
        await self._settle()
        around = await self._catalog.sharded_array_around(prefix)
        if around is None or around.chunk_prefix == prefix + "c/":
            # No shard key sits directly below: the inner names are the logical ones.
            async for name in self._inner.list_dir(prefix):
                yield name
            return
        names = {key[len(prefix) :].split("/", 1)[0] async for key in self.list_prefix(prefix)}
        for name in sorted(names):
            yield name
