"""The read path: chunk bytes from cached whole shards, whole-shard fetches, or
ranges located by shard indices.

A batch of chunk reads is served per shard in one of three ways, all shards in
one inner round: from a cached whole shard; by fetching the whole shard in one
request (its index parsed from the bytes) when the strategy says so or the
batch wants at least half of the shard's chunks; or by range reads located
through the shard's index, which comes from the index cache or one more round.
Where the inner store can check an object's version in the same read (local
files), a cached index is checked for free and a stale one re-read: never
garbage. Concurrent fetches of one shard share one request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from zarr.abc.store import ByteRequest, RangeByteRequest

from shardstore.addressing import ChunkAddress, ShardAddress
from shardstore.errors import ShardFormatError
from shardstore.formats.base import ChunkTable, table_entry
from shardstore.formats.indexed import (
    IndexedFormat,
)
from shardstore.formats.precomputed import PrecomputedSharding
from shardstore.formats.precomputed.store import PrecomputedShardedStore
from shardstore.inner import STALE, ChunkBytes, InnerStore, slice_range
from shardstore.inner.base import NOT_MODIFIED
from shardstore.inner.subdirectory import SubdirectoryInner
from shardstore.options import ReadPolicy
from shardstore.reading.cache import IndexCache, IndexEntry, ShardCache, ShardSnapshot
from shardstore.reading.ranges import MERGE_GAP, merge_ranges, sub_range
from shardstore.reading.stale import Attempt, until_fresh
from shardstore.tasks import gather

__all__ = ["ShardReader"]

log = logging.getLogger(__name__)


async def _nothing() -> list[Any]:
    return []


_Fetched = tuple[ShardSnapshot | None, Exception | None]
"""A whole-shard fetch's outcome, shared with the reads that joined it."""

REPEAT_READS = 3
REPEAT_WINDOW = 1.0
"""``"repeat"``: the REPEAT_READS-th batch to read a shard, each within this many
seconds of the last, fetches it whole (a slab reads a shard once or twice; a
whole-array or random read pass comes back to it again and again)."""
_TOUCHES = 4096
"""Shards whose recent reads are remembered for "repeat"."""
_CHANGES = 65536
"""Shards whose last change through this store is remembered (see ``forget``)."""


class ShardReader:
    """Chunk reads from the shards in ``inner``, through the index cache ``indices``
    and the shard cache ``shards``, as ``policy`` (a resolved ReadPolicy) says."""

    def __init__(
        self, inner: InnerStore, indices: IndexCache, shards: ShardCache, policy: ReadPolicy
    ) -> None:
        """Reads through ``indices`` and ``shards`` as ``policy`` says (see ReadPolicy)."""
        self._inner = inner
        self._indices = indices
        self._shards = shards
        self._check_versions = policy.validate and inner.capabilities.versions
        self._whole = policy.whole
        self._whole_limit = policy.whole_limit
        self._max_age = policy.max_age
        self._revalidate = policy.revalidate
        self._lock = threading.Lock()
        self._inflight: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Future[_Fetched]] = {}
        self._touched: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._changed: OrderedDict[str, float] = OrderedDict()
        self._id_stores: dict[str, PrecomputedShardedStore] = {}  # by an array's chunk prefix

    def cache_usage(self) -> dict[str, tuple[int, int]]:
        """Entries and bytes held by the index cache ("indices") and the shard cache ("shards")."""
        indices, shards = self._indices, self._shards
        return {"indices": (len(indices), indices.nbytes), "shards": (len(shards), shards.nbytes)}

    def forget(self, shard_key: str) -> None:
        """The shard changed (a write through this store): what is cached of it goes,
        and what a read sent before now brings back is not cached."""
        with self._lock:
            self._changed.pop(shard_key, None)
            self._changed[shard_key] = time.monotonic()
            if len(self._changed) > _CHANGES:
                self._changed.popitem(last=False)
        self._indices.drop(shard_key)
        self._shards.drop(shard_key)
        for prefix, store in list(self._id_stores.items()):
            if shard_key.startswith(prefix):
                store.forget(shard_key[len(prefix) :])

    def _cacheable(self, shard_key: str, sent: float) -> bool:
        """Whether a read sent at ``sent`` saw the shard as it is now, as far as this
        store's own writes go (a write may have landed while it was under way)."""
        changed = self._changed.get(shard_key)
        return changed is None or changed < sent

    async def read_chunks(
        self, chunks: list[tuple[ChunkAddress, ByteRequest | None]]
    ) -> list[ChunkBytes | None]:
        """Chunk bytes (ranges of them), each shard served from the shard cache, by
        one whole-shard fetch, or by range reads; the fetches and range reads of
        all shards in one inner round (after one more for uncached indices)."""
        results: list[ChunkBytes | None] = [None] * len(chunks)
        by_shard: dict[str, list[int]] = {}
        for i, (chunk, _) in enumerate(chunks):
            by_shard.setdefault(chunk.shard.key, []).append(i)
        whole: list[tuple[ShardAddress, list[int]]] = []
        recheck: list[tuple[ShardAddress, list[int], ShardSnapshot]] = []
        ranged: list[int] = []
        by_id: list[int] = []
        for key, members in by_shard.items():
            shard = chunks[members[0]][0].shard
            snapshot = self._cached(key)
            if snapshot is not None:
                self._serve(snapshot, members, chunks, results)
            elif (
                self._revalidate and (kept := self._shards.get(key)) is not None and kept.version is not None
            ):
                recheck.append((shard, members, kept))
            elif self._wants_whole(shard, {chunks[i][0].position for i in members}):
                whole.append((shard, members))
            elif shard.indexed is None:
                by_id.extend(members)
            else:
                ranged.extend(members)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "read %d chunk(s) of %d shard(s): %d from the shard cache, %d revalidated, "
                "%d fetched whole, %d chunk(s) by index and ranges",
                len(chunks),
                len(by_shard),
                len(by_shard) - len(whole) - len(recheck) - len({chunks[i][0].shard.key for i in ranged}),
                len(recheck),
                len(whole),
                len(ranged),
            )
        rounds = [
            self._read_whole(whole, chunks, results) if whole else None,
            self._revalidated(recheck, chunks, results) if recheck else None,
            self._read_ranges(ranged, chunks, results) if ranged else None,
            self._read_chunk_ids(by_id, chunks, results) if by_id else None,
        ]
        await gather(*(r for r in rounds if r is not None))
        return results

    async def _read_chunk_ids(
        self,
        todo: list[int],
        chunks: list[tuple[ChunkAddress, ByteRequest | None]],
        results: list[ChunkBytes | None],
    ) -> None:
        """Chunks of shards keyed by chunk id (the neuroglancer format), read as its
        key-value store reads them: shard index entry, minishard index (cached), data
        ranges, every shard of an array in the same rounds."""
        arrays: dict[str, list[int]] = {}
        for i in todo:
            arrays.setdefault(chunks[i][0].shard.info.shard_prefix, []).append(i)

        async def read(members: list[int]) -> None:
            values = await self._id_store(chunks[members[0]][0].shard).get_many(
                [chunks[i][0].position for i in members]
            )
            for i, value in zip(members, values, strict=True):
                results[i] = None if value is None else slice_range(value, chunks[i][1])

        await gather(*(read(members) for members in arrays.values()))

    def _id_store(self, shard: ShardAddress) -> PrecomputedShardedStore:
        """The key-value store over the directory of an array's chunk-id shards."""
        prefix, fmt = shard.info.shard_prefix, shard.shard_format
        with self._lock:
            store = self._id_stores.get(prefix)
            if store is None or store.sharding != fmt:
                assert isinstance(fmt, PrecomputedSharding)
                store = PrecomputedShardedStore(
                    SubdirectoryInner(self._inner, prefix),
                    fmt,
                    cache_max_age=float("inf") if self._max_age is None else self._max_age,
                )
                self._id_stores[prefix] = store
            return store

    def _cached(self, key: str) -> ShardSnapshot | None:
        snapshot = self._shards.get(key)
        if snapshot is None:
            return None
        if self._check_versions:
            usable = self._inner.version(key) == snapshot.version
        else:
            usable = self._max_age is None or time.monotonic() - snapshot.fetched_at <= self._max_age
        if not usable:
            if not self._revalidate:
                self._shards.drop(key)
            return None
        return snapshot

    def _wants_whole(self, shard: ShardAddress, positions: set[int]) -> bool:
        nominal = shard.info.nominal_shard_nbytes
        small = self._whole_limit is None or (nominal is not None and nominal <= self._whole_limit)
        again = self._whole in ("repeat", "first") and self._repeated(shard.key)
        if small and (self._whole == "always" or again):
            return True
        if shard.indexed is None:
            return False  # chunk ids: read by minishard indices, see _read_chunk_ids
        if self._indices.get(shard.key) is not None:
            return False  # the index is known: merged ranges read no more than needed
        # one round trip instead of two, for a small shard or most of a big one
        return (small and self._whole == "first") or 2 * len(positions) >= len(shard.in_grid_positions())

    def _repeated(self, key: str) -> bool:
        """Notes a read of the shard; whether it is the REPEAT_READS-th in a row."""
        now = time.monotonic()
        with self._lock:
            count, last = self._touched.pop(key, (0, now))
            count = count + 1 if now - last <= REPEAT_WINDOW else 1
            self._touched[key] = (count, now)
            if len(self._touched) > _TOUCHES:
                self._touched.popitem(last=False)
        return count >= REPEAT_READS

    @staticmethod
    def _serve(
        snapshot: ShardSnapshot,
        members: list[int],
        chunks: list[tuple[ChunkAddress, ByteRequest | None]],
        results: list[ChunkBytes | None],
    ) -> None:
        for i in members:
            chunk, byte_range = chunks[i]
            entry = snapshot.chunk(chunk.position)
            if entry is not None:
                results[i] = snapshot.view(*sub_range(*entry, byte_range))

    async def _read_whole(
        self,
        shards: list[tuple[ShardAddress, list[int]]],
        chunks: list[tuple[ChunkAddress, ByteRequest | None]],
        results: list[ChunkBytes | None],
    ) -> None:
        fetched = await self.fetch_shards([shard for shard, _ in shards])
        for (_, members), (snapshot, error) in zip(shards, fetched, strict=True):
            if error is not None:
                raise error
            assert snapshot is not None
            self._serve(snapshot, members, chunks, results)

    async def _revalidated(
        self,
        shards: list[tuple[ShardAddress, list[int], ShardSnapshot]],
        chunks: list[tuple[ChunkAddress, ByteRequest | None]],
        results: list[ChunkBytes | None],
    ) -> None:
        """Cached shards asked for again in one batch, each only if it changed."""
        sent = time.monotonic()
        raws = await self._inner.get_many_if_modified(
            [(shard.key, kept.version) for shard, _, kept in shards]
        )
        for (shard, members, kept), (raw, version) in zip(shards, raws, strict=True):
            if raw is NOT_MODIFIED:
                snapshot = kept
            else:
                fresh, error = self._snapshot(shard, raw, version, sent)
                if error is not None:
                    raise error
                assert fresh is not None
                snapshot = fresh
            self._serve(snapshot, members, chunks, results)

    async def fetch_shards(self, shards: list[ShardAddress]) -> list[_Fetched]:
        """Whole shards in one inner batch, each as a snapshot (an absent shard as
        an empty one); a fetch of the same shard already under way is joined."""
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[_Fetched]] = []
        mine: list[tuple[ShardAddress, asyncio.Future[_Fetched]]] = []
        with self._lock:
            for shard in shards:
                future = self._inflight.get((loop, shard.key))
                if future is None:
                    future = self._inflight[(loop, shard.key)] = loop.create_future()
                    mine.append((shard, future))
                waits.append(future)
        if mine:
            await self._fetch(loop, mine)
        outcomes = [await future for future in waits]
        abandoned = [i for i, (snapshot, error) in enumerate(outcomes) if snapshot is None and error is None]
        if abandoned:  # the fetch we joined was cancelled: fetch those ourselves
            again = await self.fetch_shards([shards[i] for i in abandoned])
            for i, outcome in zip(abandoned, again, strict=True):
                outcomes[i] = outcome
        return outcomes

    async def _fetch(
        self, loop: asyncio.AbstractEventLoop, mine: list[tuple[ShardAddress, asyncio.Future[_Fetched]]]
    ) -> None:
        sent = time.monotonic()
        outcomes: list[_Fetched] = [(None, None)] * len(mine)
        try:
            raws = await self._inner.get_many_versioned([(s.key, None) for s, _ in mine], [None] * len(mine))
            outcomes = [
                self._snapshot(shard, raw, version, sent)
                for (shard, _), (raw, version) in zip(mine, raws, strict=True)
            ]
        except Exception as exc:
            outcomes = [(None, exc)] * len(mine)
        finally:  # joiners always get an outcome, (None, None) if this task was cancelled
            with self._lock:
                for (shard, future), outcome in zip(mine, outcomes, strict=True):
                    del self._inflight[(loop, shard.key)]
                    future.set_result(outcome)

    def _snapshot(
        self, shard: ShardAddress, raw: bytes | None, version: Hashable | None, sent: float
    ) -> _Fetched:
        try:
            if raw is None:
                empty: ChunkTable = shard.indexed.empty_index() if shard.indexed else {}
                snapshot = ShardSnapshot(b"", empty, sent, version)
            else:
                snapshot = ShardSnapshot(raw, shard.shard_format.parse(raw, shard.key), sent, version)
        except ShardFormatError as exc:
            return None, exc
        if self._cacheable(shard.key, sent):
            self._shards.put(shard.key, snapshot)
            if raw is not None and not isinstance(snapshot.index, dict):
                self._indices.put(shard.key, IndexEntry(snapshot.index, version, sent))
        return snapshot, None

    async def _read_ranges(
        self,
        todo: list[int],
        chunks: list[tuple[ChunkAddress, ByteRequest | None]],
        results: list[ChunkBytes | None],
    ) -> None:
        """Range reads located by indices (cached or read in one batch), nearby ranges
        of a shard merged. Where a cached index turns out stale (the read checks the
        shard's version for free), those chunks are read again afresh."""

        async def attempt(todo: list[int], now: Attempt) -> list[int]:
            entries = await self.index_entries([chunks[i][0] for i in todo], fresh=not now.first)
            wanted: dict[str, list[tuple[int, int, int]]] = {}  # shard key -> (slot, start, stop)
            versions: dict[str, Hashable | None] = {}
            for i, entry in zip(todo, entries, strict=True):
                if entry is None:
                    continue
                offset, nbytes, version = entry
                start, stop = sub_range(offset, nbytes, chunks[i][1])
                if start == stop:
                    results[i] = b""
                    continue
                wanted.setdefault(chunks[i][0].shard.key, []).append((i, start, stop))
                versions[chunks[i][0].shard.key] = version  # checked for free where the store can
            spans = [
                (key, span) for key, ranges in wanted.items() for span in merge_ranges(ranges, MERGE_GAP)
            ]
            values = (
                await self._inner.get_many_versioned(
                    [(key, RangeByteRequest(span[0], span[1])) for key, span in spans],
                    [versions[k] for k, _ in spans],
                )
                if spans
                else []
            )
            stale: list[int] = []
            for (key, (span_start, _, members)), (value, _) in zip(spans, values, strict=True):
                if value is STALE or (value is None and versions[key] is not None):  # replaced or gone
                    self._indices.drop(key)
                    stale.extend(i for i, _, _ in members)
                    continue
                for i, start, stop in members:
                    part = None if value is None else value[start - span_start : stop - span_start]
                    if part is None or len(part) != stop - start:
                        raise ShardFormatError(
                            f"shard {key!r}: chunk {chunks[i][0].key!r} runs past the end of the shard "
                            f"object (wanted {stop - start} bytes, got {0 if part is None else len(part)})"
                        )
                    results[i] = part
            return stale

        await until_fresh(attempt, todo, shard_of=lambda i: chunks[i][0].shard.key, what="chunks of them")

    async def index_entries(
        self, chunks: list[ChunkAddress], *, fresh: bool = False
    ) -> list[tuple[int, int, Hashable | None] | None]:
        """``(offset, nbytes, shard version)`` of each chunk, None where absent.

        A present chunk's range read checks the version for itself; "absent" from a
        cached index is checked here (local files: by a ``stat``; elsewhere: the
        index is read again once older than ``max_age``), so that a chunk another
        writer added is not reported missing for longer than that."""
        shards = {c.shard.key: c.shard for c in chunks}
        since = time.monotonic()
        found = await self.shard_indices(list(shards.values()), fresh=fresh)

        def entry(chunk: ChunkAddress) -> tuple[int, int, Hashable | None] | None:
            table, version = found[chunk.shard.key]
            where = None if table is None else table_entry(table, chunk.position)
            return None if where is None else (*where, version)

        absent_from = {c.shard.key for c in chunks if found[c.shard.key][0] is not None and entry(c) is None}
        doubtful = [shards[key] for key in absent_from if self._absence_unchecked(key, since)]
        if doubtful:
            found.update(await self.shard_indices(doubtful, fresh=True))
        return [entry(chunk) for chunk in chunks]

    def _absence_unchecked(self, key: str, since: float) -> bool:
        """Whether the shard's index came from the cache (read before ``since``) and may
        no longer be current: its version changed (where a ``stat`` tells) or it is
        older than ``max_age``."""
        cached = self._indices.get(key)
        if cached is None or cached.fetched_at >= since:
            return False
        if self._check_versions:
            return self._inner.version(key) != cached.version
        return self._max_age is not None and time.monotonic() - cached.fetched_at > self._max_age

    async def shard_indices(
        self, shards: list[ShardAddress], *, fresh: bool = False
    ) -> dict[str, tuple[ChunkTable | None, Hashable | None]]:
        """Indices (and versions) of shards: cached ones, the rest in one inner batch
        (shards of formats without one fixed index: their tables, from whole shards)."""
        found: dict[str, tuple[ChunkTable | None, Hashable | None]] = {}
        indexed: list[tuple[ShardAddress, IndexedFormat]] = []
        whole: list[ShardAddress] = []
        for shard in shards:
            cached = None if fresh else self._indices.get(shard.key)
            if cached is not None:
                found[shard.key] = (cached.table, cached.version)
            elif shard.indexed is None:
                whole.append(shard)
            else:
                indexed.append((shard, shard.indexed))
        if not indexed and not whole:  # all cached: the common warm read, no task, no thread hop
            return found
        sent = time.monotonic()
        raws, fetched = await gather(
            self._inner.get_many_versioned(
                [(s.key, fmt.index_request()) for s, fmt in indexed], [None] * len(indexed)
            )
            if indexed
            else _nothing(),
            self.fetch_shards(whole) if whole else _nothing(),
        )
        for (shard, fmt), (raw, version) in zip(indexed, raws, strict=True):
            index = None if raw is None else fmt.decode_index(raw, shard.key)
            size = self._inner.object_size(version)
            if index is not None and size is not None:  # before any range is requested
                fmt.check_ranges(index, size, shard.key)
            if index is not None and self._cacheable(shard.key, sent):
                self._indices.put(shard.key, IndexEntry(index, version, sent))
            found[shard.key] = (index, version)
        for shard, (snapshot, error) in zip(whole, fetched, strict=True):
            if error is not None:
                raise error
            assert snapshot is not None
            found[shard.key] = (snapshot.index if snapshot.data else None, snapshot.version)
        return found

    async def read_indices(self, shards: list[ShardAddress]) -> list[ChunkTable | None]:
        """Fresh indices for listings and maintenance (never from the cache)."""
        found = await self.shard_indices(shards, fresh=True)
        return [found[s.key][0] for s in shards]
