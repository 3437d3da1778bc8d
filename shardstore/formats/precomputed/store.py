"""PrecomputedShardedStore: a neuroglancer precomputed sharded directory as a
``MutableMapping[int, bytes]`` keyed by uint64 chunk ids.

Reads are batched per round, all shards at once: the shard index entries of
the minishards asked for, then those minishard indices, then the chunk data
(three rounds cold, one once the minishard indices are cached). Later rounds
are read at the version the first saw (local files by ``stat``, S3 by
``If-Match``), so a shard replaced in between is read again, never mixed.
In-memory stores, which cannot check versions, are read a whole shard at a
time. The format cannot update a chunk in place: a write rebuilds each
affected shard once, through :meth:`InnerStore.update`, under the same locks
and conditional writes as the indexed format.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any

import numpy as np
from zarr.abc.store import RangeByteRequest

from shardstore import sync_bridge
from shardstore.errors import ChunkKeyError, ReadOnlyError, ShardConflictError, ShardFormatError
from shardstore.formats.precomputed import (
    PrecomputedSharding,
    decode_chunk,
    decode_minishard_index,
    locate_ids,
    minishard_index_range,
    shard_file_name,
    shard_number_of_name,
    split_shard,
)
from shardstore.inner import STALE, InnerStore, adapt
from shardstore.inner.base import DEFAULT_ATTEMPTS, failure
from shardstore.reading.ranges import MERGE_GAP, merge_ranges
from shardstore.reading.stale import Attempt, until_fresh
from shardstore.tasks import gather
from shardstore.writing.updates import Update, rebuilt_shard

__all__ = ["PrecomputedShardedStore"]

Minishard = dict[int, tuple[int, int]]
"""A decoded minishard index: chunk id -> (offset in the shard file, stored nbytes)."""
_MINISHARDS_CACHED = 4096
"""Minishard indices remembered (least recently used out)."""


def _chunk_id(key: Any) -> int:
    if isinstance(key, bool) or not isinstance(key, int | np.integer) or not 0 <= int(key) < 2**64:
        raise ChunkKeyError(f"{key!r} is not a chunk id: ids are integers in [0, 2**64)")
    return int(key)


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
            sharding
            if isinstance(sharding, PrecomputedSharding)
            else PrecomputedSharding.from_json(sharding, "sharding")
        )
        self.read_only = read_only
        self._inner: InnerStore = adapt(inner, storage_options)
        self._max_age = cache_max_age
        self._attempts = write_attempts
        self._whole_shards = self._inner.capabilities.in_memory
        self._minishards: OrderedDict[tuple[str, int], tuple[Minishard, Hashable | None, float]] = (
            OrderedDict()
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

    # -- reads ---------------------------------------------------------------------

    async def get_many(self, ids: Iterable[int]) -> list[bytes | None]:
        """The chunks' raw bytes (None: absent), every shard in the same rounds."""
        wanted = np.array([_chunk_id(i) for i in ids], dtype=np.uint64)
        if not len(wanted):
            return []
        shards, minishards = locate_ids(self.sharding, wanted)
        keys = [shard_file_name(self.sharding, int(s)) for s in shards]
        if self._whole_shards:
            return await self._get_from_whole_shards(wanted, keys)
        stored = await self._locate_and_read(wanted, keys, [int(m) for m in minishards])
        return [
            None if raw is None else decode_chunk(self.sharding, raw, key)
            for raw, key in zip(stored, keys, strict=True)
        ]

    async def _get_from_whole_shards(self, ids: np.ndarray, keys: list[str]) -> list[bytes | None]:
        distinct = sorted(set(keys))
        with failure("read", distinct[0]):
            blobs = await self._inner.get_many([(k, None) for k in distinct])
        chunks = {
            k: {} if blob is None else split_shard(self.sharding, blob, k)
            for k, blob in zip(distinct, blobs, strict=True)
        }
        return [chunks[k].get(int(i)) for i, k in zip(ids, keys, strict=True)]

    async def _locate_and_read(
        self, ids: np.ndarray, keys: list[str], minishards: list[int]
    ) -> list[bytes | None]:
        """Stored bytes of each chunk: minishard indices (cached or read, all shards in
        two rounds), then the data ranges at the version those were read at. Only the
        chunks of a shard replaced in between are read again (``until_fresh``); a range
        cut short at that very version is damage (ShardFormatError)."""
        out: list[bytes | None] = [None] * len(ids)
        truncated: str | None = None

        async def attempt(pending: list[int], now: Attempt) -> list[int]:
            nonlocal truncated
            found = await self._minishard_indices({(keys[i], minishards[i]) for i in pending})
            todo = []
            for slot in pending:
                table, version = found[(keys[slot], minishards[slot])]
                where = table.get(int(ids[slot]))
                if where is None:
                    continue
                if where[1] == 0:
                    out[slot] = b""  # nothing to read (an empty range is no valid HTTP Range)
                else:
                    todo.append((slot, keys[slot], where, version))
            read = await self._versioned(
                [(key, RangeByteRequest(off, off + n)) for _, key, (off, n), _ in todo],
                [version for *_, version in todo],
            )
            changed: set[str] = set()
            for (slot, key, (off, nbytes), version), (value, seen) in zip(todo, read, strict=True):
                if value is STALE or value is None:
                    changed.add(key)  # replaced or deleted since its index was read
                elif len(value) != nbytes:
                    truncated = (
                        f"shard {key!r}: truncated: chunk {int(ids[slot])} at [{off}, {off + nbytes}) "
                        f"lies past the end of the object ({len(value)} of its {nbytes} bytes there)"
                    )
                    if seen is not None and seen == version:
                        raise ShardFormatError(truncated)  # read at the version indexed: damage
                    changed.add(key)
                else:
                    out[slot] = value
            for key in changed:
                self.forget(key)
            again = [slot for slot in pending if keys[slot] in changed]
            for slot in again:
                out[slot] = None
            return again

        try:
            await until_fresh(
                attempt, list(range(len(ids))), shard_of=keys.__getitem__, what="chunks of them"
            )
        except ShardConflictError:
            if truncated is not None:  # cut short at every attempt: damage, not other writers
                raise ShardFormatError(truncated) from None
            raise
        return out

    async def _minishard_indices(
        self, wanted: set[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[Minishard, Hashable | None]]:
        """The minishard indices asked for, with the shard version each was read at:
        from the cache, else shard index entries then indices, all in two rounds. An
        index cut short at the version its entry was read at is damage; the indices
        of a shard replaced in between are read again (``until_fresh``)."""
        found: dict[tuple[str, int], tuple[Minishard, Hashable | None]] = {}
        missing = []
        versions: dict[str, Hashable | None] = {}
        for where in sorted(wanted):
            cached = self._cached(where, versions)
            if cached is None:
                missing.append(where)
            else:
                found[where] = cached
        await until_fresh(
            lambda todo, now: self._read_minishard_indices(todo, found, last=now.last),
            missing,
            shard_of=lambda where: where[0],
            what="their minishard indices",
        )
        return found

    async def _read_minishard_indices(
        self,
        missing: list[tuple[str, int]],
        found: dict[tuple[str, int], tuple[Minishard, Hashable | None]],
        *,
        last: bool,
    ) -> list[tuple[str, int]]:
        """One try at the indices ``missing``, into ``found``; those of shards replaced
        between the two rounds are returned, to be read again."""
        sent = time.monotonic()
        entries = await self._versioned(
            [(key, RangeByteRequest(16 * m, 16 * m + 16)) for key, m in missing], [None] * len(missing)
        )
        ranges: list[tuple[tuple[str, int], range, Hashable | None]] = []
        for (key, m), (entry, version) in zip(missing, entries, strict=True):
            place = None if entry is None else minishard_index_range(self.sharding, entry, m, key)
            if place is None or not len(place):
                found[(key, m)] = ({}, version)  # no shard, or an empty minishard
            else:
                ranges.append(((key, m), place, version))
        raws = await self._versioned(
            [(key, RangeByteRequest(p.start, p.stop)) for (key, _), p, _ in ranges],
            [version for *_, version in ranges],
        )
        again: list[tuple[str, int]] = []
        for ((key, m), place, version), (raw, seen) in zip(ranges, raws, strict=True):
            got = -1 if raw is STALE or raw is None else len(raw)  # -1: replaced or deleted since
            if 0 <= got != len(place) and ((seen is not None and seen == version) or last):
                raise ShardFormatError(  # cut short at the version its entry was read at: damage
                    f"shard {key!r}: truncated: the index of minishard {m} at [{place.start}, "
                    f"{place.stop}) lies past the end of the object ({got} of its {len(place)} bytes there)"
                )
            if raw is STALE or raw is None or len(raw) != len(place):
                self.forget(key)
                again.append((key, m))
                continue
            rows = decode_minishard_index(self.sharding, raw, key)
            table = {int(i): (int(o), int(n)) for i, o, n in rows.tolist()}
            found[(key, m)] = (table, version)
            self._remember((key, m), table, version, sent)
        return again

    async def _versioned(
        self, requests: list[tuple[str, RangeByteRequest]], expected: list[Hashable | None]
    ) -> list[tuple[bytes | None, Hashable | None]]:
        """Range reads with the versions read, each refused (STALE) if its object is
        no longer at the version expected. Nearby ranges of one object (at one expected
        version) are read as one request, as the indexed reader does."""
        if not requests:
            return []
        groups: dict[tuple[str, Hashable | None], list[tuple[int, int, int]]] = {}
        for slot, ((key, r), version) in enumerate(zip(requests, expected, strict=True)):
            groups.setdefault((key, version), []).append((slot, r.start, r.end))
        spans = [
            (where, span) for where, ranges in groups.items() for span in merge_ranges(ranges, MERGE_GAP)
        ]
        with failure("read", requests[0][0]):
            read = await self._inner.get_many_versioned(
                [(key, RangeByteRequest(span[0], span[1])) for (key, _), span in spans],
                [version for (_, version), _ in spans],
            )
        out: list[tuple[bytes | None, Hashable | None]] = [(None, None)] * len(requests)
        for (_, (span_start, _, members)), (value, seen) in zip(spans, read, strict=True):
            for slot, start, stop in members:
                part = (
                    value
                    if value is None or value is STALE
                    else value[start - span_start : stop - span_start]
                )
                out[slot] = (part, seen)
        return out

    # -- the minishard index cache -------------------------------------------------

    def _cached(
        self, where: tuple[str, int], versions: dict[str, Hashable | None]
    ) -> tuple[Minishard, Hashable | None] | None:
        """A cached minishard index still valid: its shard at the version it was read
        at (one ``stat`` per shard and call, in ``versions``) or young enough."""
        entry = self._minishards.get(where)
        if entry is None:
            return None
        table, version, fetched = entry
        if self._inner.capabilities.versions:
            if where[0] not in versions:
                versions[where[0]] = self._inner.version(where[0])
            fresh = versions[where[0]] == version
        else:
            fresh = time.monotonic() - fetched <= self._max_age
        if not fresh:
            del self._minishards[where]
            return None
        self._minishards.move_to_end(where)
        return table, version

    def _remember(
        self, where: tuple[str, int], table: Minishard, version: Hashable | None, sent: float
    ) -> None:
        if version is None and self._inner.capabilities.versions:
            return  # read while a crashed append's tail was there: do not trust it
        self._minishards[where] = (table, version, sent)
        if len(self._minishards) > _MINISHARDS_CACHED:
            self._minishards.popitem(last=False)

    def forget(self, shard_key: str) -> None:
        """Drop what is cached of a shard (it was written elsewhere in this process)."""
        for where in [w for w in self._minishards if w[0] == shard_key]:
            del self._minishards[where]

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
        found = await self._minishard_indices({(key, m) for m in range(self.sharding.num_minishards)})
        return {m: table for (_, m), (table, _) in found.items()}

    async def ids(self) -> list[int]:
        """Every chunk id present, in ascending order (reads every minishard index)."""
        keys = await self.shard_keys()
        everything = {(k, m) for k in keys for m in range(self.sharding.num_minishards)}
        if self._whole_shards:
            blobs = await self._inner.get_many([(k, None) for k in keys])
            return sorted(
                i for k, b in zip(keys, blobs, strict=True) if b for i in split_shard(self.sharding, b, k)
            )
        found = await self._minishard_indices(everything)
        return sorted(i for table, _ in found.values() for i in table)

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
