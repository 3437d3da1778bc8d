"""PrecomputedShardedStore: a neuroglancer precomputed sharded directory as a
``MutableMapping[int, bytes]`` keyed by uint64 chunk ids.

Reads go through the store's own read path (:class:`~shardstore.reading.reader.ShardReader`),
as the chunks of a zarr array in this format do: every shard in the same rounds,
the shard index entries of the minishards asked for, then those minishard indices
(three rounds cold, one once the minishard indices are cached), then the chunk data,
later rounds at the version the first saw (local files by ``stat``, object stores by
a conditional read), so a shard replaced in between is read again, never mixed.
In-memory stores, which cannot check versions, are read a whole shard at a time. The
format cannot update a chunk in place: a write rebuilds each affected shard once,
through :meth:`InnerStore.update`, under the same locks and conditional writes as
the indexed format.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import shardstore.sync_bridge as sync_bridge
from shardstore.errors import ChunkKeyError, ReadOnlyError
from shardstore.formats.base import ChunkTable
from shardstore.formats.precomputed import (
    PrecomputedSharding,
    decode_chunk,
    locate_ids,
    shard_file_name,
    shard_number_of_name,
)
from shardstore.inner import InnerStore, adapt
from shardstore.inner.base import DEFAULT_ATTEMPTS, failure
from shardstore.options import ReadPolicy, StoreOptions
from shardstore.reading.cache import IndexCache, ShardCache
from shardstore.reading.reader import ShardReader
from shardstore.tasks import gather
from shardstore.writing.updates import Update, rebuilt_shard

__all__ = ["PrecomputedShardedStore"]

Minishard = dict[int, tuple[int, int]]
"""A decoded minishard index: chunk id -> (offset in the shard file, stored nbytes)."""
_INDEX_CACHE_BYTES = 64 * 2**20
"""Bytes of minishard indices remembered (least recently used out)."""


def _chunk_id(key: Any) -> int:
    if isinstance(key, bool) or not isinstance(key, int | np.integer) or not 0 <= int(key) < 2**64:
        raise ChunkKeyError(f"{key!r} is not a chunk id: ids are integers in [0, 2**64)")
    return int(key)


@dataclass(frozen=True)
class _ShardFile:
    """A shard file, as the read path sees a shard (no zarr array's: no grid)."""

    key: str
    shard_format: PrecomputedSharding
    nominal_nbytes: int | None = None

    def places_in_grid(self) -> tuple[int, ...] | None:
        return None


@dataclass(frozen=True)
class _Chunk:
    """A chunk id in its shard file, as the read path sees a chunk."""

    shard: _ShardFile
    position: int

    @property
    def key(self) -> str:
        return f"chunk {self.position}"


class PrecomputedShardedStore(MutableMapping[int, bytes]):
    """The chunks of a neuroglancer precomputed sharded directory, by uint64 id.

    ``inner`` is anything :class:`~shardstore.ShardingStore` accepts (a path, URL
    with ``storage_options``, fsspec mapper, zarr store or mapping): the directory
    holding the ``<shard>.shard`` files. ``sharding`` is the format's JSON
    ``"sharding"`` object (or a :class:`PrecomputedSharding`). Values are the
    chunks' raw bytes (``data_encoding`` is applied and undone here). Minishard
    indices are cached for ``cache_max_age`` seconds where a read cannot check
    them for free (local files check each use by ``stat``); a write through this
    store drops what it cached of the shards it wrote. A write tries
    ``write_attempts`` conditional writes against other writers. A ``read_only``
    store refuses writes.
    """

    def __init__(
        self,
        inner: Any,
        sharding: Mapping[str, Any] | PrecomputedSharding,
        *,
        read_only: bool = False,
        cache_max_age: float = 1.0,
        write_attempts: int = DEFAULT_ATTEMPTS,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.sharding = (
            PrecomputedSharding.from_json(sharding, "sharding") if isinstance(sharding, Mapping) else sharding
        )
        self.read_only = read_only
        self._inner: InnerStore = adapt(inner, storage_options)
        self._attempts = write_attempts
        # chunk ranges by minishard indices; in memory, whole shards (no versions to check)
        options = StoreOptions(read_strategy="chunk", cache_max_age=cache_max_age)
        policy = ReadPolicy.resolve(options, self._inner.capabilities)
        self._reader = ShardReader(
            self._inner, IndexCache(_INDEX_CACHE_BYTES), ShardCache(policy.shard_cache_bytes), policy
        )

    def __repr__(self) -> str:
        return f"PrecomputedShardedStore({self._inner!r}, {self.sharding.to_json()!r})"

    @property
    def raw(self) -> InnerStore:
        """The inner store: shard files by name."""
        return self._inner

    def shard_key(self, chunk_id: int) -> str:
        """The name of the shard file holding ``chunk_id``."""
        shards, _ = locate_ids(self.sharding, np.array([_chunk_id(chunk_id)], dtype=np.uint64))
        return shard_file_name(self.sharding, int(shards[0]))

    def _shard(self, key: str) -> _ShardFile:
        return _ShardFile(key, self.sharding)

    def forget(self, shard_key: str) -> None:
        """Drop what is cached of a shard (it was written elsewhere in this process)."""
        self._reader.forget(shard_key)

    # -- reads ---------------------------------------------------------------------

    async def get_many(self, ids: Iterable[int]) -> list[bytes | None]:
        """The chunks' raw bytes (None: absent), every shard in the same rounds."""
        wanted = np.array([_chunk_id(i) for i in ids], dtype=np.uint64)
        if not len(wanted):
            return []
        shards, _ = locate_ids(self.sharding, wanted)
        chunks = [
            (_Chunk(self._shard(shard_file_name(self.sharding, int(s))), int(i)), None)
            for i, s in zip(wanted.tolist(), shards.tolist(), strict=True)
        ]
        with failure("read", chunks[0][0].shard.key):
            stored = await self._reader.read_chunks(chunks)
        return [
            None if raw is None else decode_chunk(self.sharding, bytes(raw), chunk.shard.key)
            for raw, (chunk, _) in zip(stored, chunks, strict=True)
        ]

    # -- writes --------------------------------------------------------------------

    async def update_many(self, chunks: Mapping[int, bytes | None]) -> None:
        """Write (None: delete) chunks, each affected shard rebuilt once, all
        concurrently; a shard left empty is deleted."""
        if self.read_only:
            raise ReadOnlyError(f"{self!r} is read-only: no chunk was written")
        by_shard: dict[str, dict[int, bytes | None]] = {}
        for chunk_id, value in chunks.items():
            key = self.shard_key(chunk_id)
            if value is not None and not isinstance(value, bytes | bytearray | memoryview):
                raise TypeError(f"chunk {chunk_id}: values are bytes, not {type(value).__name__}")
            by_shard.setdefault(key, {})[int(chunk_id)] = None if value is None else bytes(value)
        await gather(*(self._rewrite(key, changes) for key, changes in by_shard.items()))

    async def _rewrite(self, key: str, changes: dict[int, bytes | None]) -> None:
        updates: dict[int, list[Update]] = {chunk_id: [value] for chunk_id, value in changes.items()}
        keep_empty = not self._inner.capabilities.ordered_deletes

        def change(old: bytes | None) -> bytes | None:
            return rebuilt_shard(self.sharding, key, old, updates, keep_empty=keep_empty)

        try:
            with failure("commit", key):
                await self._inner.update(key, change, attempts=self._attempts)
        finally:
            self.forget(key)

    # -- listing -------------------------------------------------------------------

    async def shard_keys(self) -> list[str]:
        """The shard files present (other files in the directory are not ours)."""
        return sorted(
            [k async for k in self._inner.list_dir("") if shard_number_of_name(self.sharding, k) is not None]
        )

    async def minishards(self, key: str) -> dict[int, Minishard]:
        """Every minishard index of the shard file ``key`` by minishard (empty ones
        too), read as chunk reads read them: the shard index, then the indices."""
        return (await self._tables([key]))[key]

    async def ids(self) -> list[int]:
        """Every chunk id present, in ascending order (reads every minishard index)."""
        tables = await self._tables(await self.shard_keys())
        return sorted(i for minishards in tables.values() for table in minishards.values() for i in table)

    async def _tables(self, keys: list[str]) -> dict[str, dict[int, Minishard]]:
        """Every minishard table of each shard file (in memory: from the whole shards)."""
        every = range(self.sharding.num_minishards)
        if self._inner.capabilities.in_memory:
            fetched = await self._reader.fetch_shards([self._shard(k) for k in keys])
            out: dict[str, dict[int, Minishard]] = {}
            for key, (snapshot, error) in zip(keys, fetched, strict=True):
                if error is not None:
                    raise error
                assert snapshot is not None
                out[key] = _by_minishard(self.sharding, snapshot.index, every)
            return out
        found = await self._reader.part_tables([((k, m), self._shard(k)) for k in keys for m in every])
        return {k: {m: _as_minishard(found[(k, m)][0]) for m in every} for k in keys}

    # -- MutableMapping --------------------------------------------------------------

    def __getitem__(self, chunk_id: int) -> bytes:
        value = sync_bridge.run(self.get_many([chunk_id]))[0]
        if value is None:
            raise KeyError(chunk_id)
        return value

    def __setitem__(self, chunk_id: int, value: bytes) -> None:
        sync_bridge.run(self.update_many({chunk_id: value}))

    def get(self, chunk_id: int, default: Any = None) -> Any:
        """The chunk's bytes, ``default`` if absent; ChunkKeyError for what is no chunk
        id (Mapping.get would answer ``default``, hiding e.g. an id that overflowed)."""
        value = sync_bridge.run(self.get_many([_chunk_id(chunk_id)]))[0]
        return default if value is None else value

    def __delitem__(self, chunk_id: int) -> None:
        if _chunk_id(chunk_id) not in self:
            raise KeyError(chunk_id)
        sync_bridge.run(self.update_many({chunk_id: None}))

    def __contains__(self, chunk_id: object) -> bool:
        try:
            return sync_bridge.run(self.get_many([chunk_id]))[0] is not None  # type: ignore[list-item]
        except ChunkKeyError:
            return False

    def __iter__(self) -> Iterator[int]:
        return iter(sync_bridge.run(self.ids()))

    def __len__(self) -> int:
        return len(sync_bridge.run(self.ids()))

    def update(self, other: Any = (), /, **kwargs: bytes) -> None:
        """Write many chunks, each affected shard once (MutableMapping.update would
        rebuild a shard per chunk)."""
        if kwargs:
            raise TypeError("chunk ids are integers: pass a mapping or pairs")
        sync_bridge.run(self.update_many(dict(other)))


def _as_minishard(table: ChunkTable | None) -> Minishard:
    assert table is None or isinstance(table, dict)
    return {} if table is None else table


def _by_minishard(sharding: PrecomputedSharding, table: ChunkTable, every: range) -> dict[int, Minishard]:
    """A whole shard's table split by minishard."""
    assert isinstance(table, dict)
    out: dict[int, Minishard] = {m: {} for m in every}
    ids = list(table)
    for chunk_id, minishard in zip(ids, sharding.index_parts(ids), strict=True):
        out[minishard][chunk_id] = table[chunk_id]
    return out
