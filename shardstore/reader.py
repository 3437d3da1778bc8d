"""The read path: chunk bytes via shard indices, from the index cache or the inner store.

Indices come from the :class:`~shardstore.index_cache.IndexCache` or one
inner batch, chunk ranges from one more. Where the inner store can check an
object's version in the same read (local files), a cached index is checked
for free and a stale one re-read: never garbage.
"""

from __future__ import annotations

from collections.abc import Hashable

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from shardstore.addressing import ChunkAddress, ShardAddress
from shardstore.errors import ShardFormatError
from shardstore.format import MISSING, ShardIndex, ShardLayout, decode_index
from shardstore.index_cache import IndexCache
from shardstore.inner import STALE, InnerStore

__all__ = ["ShardReader"]


def index_request(layout: ShardLayout) -> ByteRequest:
    if layout.index_location == "start":
        return RangeByteRequest(0, layout.index_nbytes)
    return SuffixByteRequest(layout.index_nbytes)


def sub_range(offset: int, nbytes: int, byte_range: ByteRequest | None) -> tuple[int, int]:
    """Absolute [start, stop) of a byte request on a chunk stored at [offset, offset + nbytes)."""
    if byte_range is None:
        lo, hi = 0, nbytes
    elif isinstance(byte_range, RangeByteRequest):
        lo, hi = min(byte_range.start, nbytes), min(byte_range.end, nbytes)
    elif isinstance(byte_range, OffsetByteRequest):
        lo, hi = min(byte_range.offset, nbytes), nbytes
    else:
        lo, hi = nbytes - min(byte_range.suffix, nbytes), nbytes
    return offset + lo, offset + max(hi, lo)


MERGE_GAP = 64 * 1024
"""Ranges of one shard closer than this are read as one request: a request costs more
than reading a few unwanted bytes, on object stores by far."""


def merge_ranges(
    ranges: list[tuple[int, int, int]], gap: int
) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
    """Group (slot, start, stop) ranges into spans (start, stop, members), merging
    ranges whose distance is at most ``gap`` (overlapping and shared ranges too)."""
    spans: list[tuple[int, int, list[tuple[int, int, int]]]] = []
    for member in sorted(ranges, key=lambda r: r[1]):
        _, start, stop = member
        if spans and start - spans[-1][1] <= gap:
            span_start, span_stop, members = spans[-1]
            spans[-1] = (span_start, max(span_stop, stop), [*members, member])
        else:
            spans.append((start, stop, [member]))
    return spans


class ShardReader:
    def __init__(self, inner: InnerStore, cache: IndexCache, *, validate: bool) -> None:
        self._inner = inner
        self._cache = cache
        self._validate = validate

    def forget(self, shard_key: str) -> None:
        """The shard changed (a write through this store): its cached index goes."""
        self._cache.drop(shard_key)

    async def read_chunks(self, chunks: list[tuple[ChunkAddress, ByteRequest | None]]) -> list[bytes | None]:
        """Chunk bytes (ranges of them): shard indices from the cache or one inner batch,
        then the ranges in one batch, nearby ranges of a shard merged into one request.
        Where a cached index turns out stale (the read checks the shard's version for
        free), those chunks are read again afresh."""
        results: list[bytes | None] = [None] * len(chunks)
        todo = list(range(len(chunks)))
        for fresh in (False, True):
            entries = await self.index_entries([chunks[i][0] for i in todo], fresh=fresh)
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
                versions[chunks[i][0].shard.key] = version if self._validate else None
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
                if value is STALE:
                    self._cache.drop(key)
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
            if not stale:
                break
            todo = stale
        return results

    async def index_entries(
        self, chunks: list[ChunkAddress], *, fresh: bool = False
    ) -> list[tuple[int, int, Hashable | None] | None]:
        """``(offset, nbytes, shard version)`` of each chunk, None where absent."""
        shards = {c.shard.key: c.shard for c in chunks}
        found = await self.shard_indices(list(shards.values()), fresh=fresh)
        out: list[tuple[int, int, Hashable | None] | None] = []
        for chunk in chunks:
            index, version = found[chunk.shard.key]
            offset, nbytes = (MISSING, MISSING) if index is None else map(int, index[chunk.position])
            out.append(None if offset == MISSING else (offset, nbytes, version))
        return out

    async def shard_indices(
        self, shards: list[ShardAddress], *, fresh: bool = False
    ) -> dict[str, tuple[ShardIndex | None, Hashable | None]]:
        """Indices (and versions) of shards: cached ones, the rest in one inner batch."""
        found: dict[str, tuple[ShardIndex | None, Hashable | None]] = {}
        missing = []
        for shard in shards:
            cached = None if fresh else self._cache.get(shard.key)
            if cached is None:
                missing.append(shard)
            else:
                found[shard.key] = cached
        if missing:
            raws = await self._inner.get_many_versioned(
                [(s.key, index_request(s.layout)) for s in missing], [None] * len(missing)
            )
            for shard, (raw, version) in zip(missing, raws, strict=True):
                index = None if raw is None else decode_index(shard.layout, raw, shard.key)
                if index is not None:
                    self._cache.put(shard.key, index, version)
                found[shard.key] = (index, version)
        return found

    async def read_indices(self, shards: list[ShardAddress]) -> list[ShardIndex | None]:
        """Fresh indices for listings and maintenance (never from the cache)."""
        found = await self.shard_indices(shards, fresh=True)
        return [found[s.key][0] for s in shards]
