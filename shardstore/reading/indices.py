"""Where chunks lie: the parts of shard indices that locate them, read for every
shard at once and cached by ``(shard, part)``.

A format locates a chunk through one index at a fixed place (the indexed
format), or through a part of its index: an entry of a first-level index that
says where the part's own index lies (a neuroglancer minishard). Either way the
parts wanted are read for all shards in one inner round per level, nearby ranges
of one object in one request. A part is kept with the object version it was read
at, where the inner store tells one: a second level is read at that version, and
a shard replaced in between answers STALE and is read again
(:func:`~shardstore.reading.stale.until_fresh`); chunk ranges located by a part
are read at that version too. "Absent" from a cached part is checked afresh once
the part may be out of date (local files: by a ``stat``; elsewhere: after
``max_age``), so that a chunk another writer added is seen.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import cast

import numpy as np
import numpy.typing as npt
from zarr.abc.store import ByteRequest, RangeByteRequest

from shardstore.errors import ShardFormatError
from shardstore.formats.base import ABSENT, ChunkTable, table_entry, table_rows
from shardstore.inner import STALE, ChunkBytes, InnerStore
from shardstore.inner.base import failure
from shardstore.reading.cache import IndexCache, IndexEntry
from shardstore.reading.ranges import MERGE_GAP, merge_ranges
from shardstore.reading.refs import ChunkRef, ShardRef
from shardstore.reading.stale import until_fresh

__all__ = ["IndexReader", "Location", "PartTables", "read_merged"]

Location = tuple[int, int, Hashable | None]
"""Where a chunk's stored bytes lie: ``(offset, nbytes, version of the shard)``."""
PartTables = dict[tuple[str, int], tuple[ChunkTable | None, Hashable | None]]
"""Tables of index parts by ``(shard key, part)``, with the version read (None: no shard)."""

_CHANGES = 65536
"""Shards whose last change through this store is remembered (see ``forget``)."""


async def read_merged(
    inner: InnerStore, requests: Sequence[tuple[str, ByteRequest]], expected: Sequence[Hashable | None]
) -> list[tuple[ChunkBytes | None, Hashable | None]]:
    """Reads with the versions read, each refused (STALE) where its object is no longer
    at the version expected. Nearby ranges of one object at one expected version are
    read as one request; other requests (a suffix) go as they are."""
    if not requests:
        return []
    groups: dict[tuple[str, Hashable | None], list[tuple[int, int, int]]] = {}
    alone: list[int] = []
    for slot, ((key, request), version) in enumerate(zip(requests, expected, strict=True)):
        if isinstance(request, RangeByteRequest):
            groups.setdefault((key, version), []).append((slot, request.start, request.end))
        else:
            alone.append(slot)
    spans = [(where, span) for where, ranges in groups.items() for span in merge_ranges(ranges, MERGE_GAP)]
    with failure("read", requests[0][0]):
        read = await inner.get_many_versioned(
            [(key, RangeByteRequest(span[0], span[1])) for (key, _), span in spans]
            + [requests[slot] for slot in alone],
            [version for (_, version), _ in spans] + [expected[slot] for slot in alone],
        )
    out: list[tuple[ChunkBytes | None, Hashable | None]] = [(None, None)] * len(requests)
    for (_, (span_start, _, members)), (value, seen) in zip(spans, read[: len(spans)], strict=True):
        # views of the span, not copies: a span holds many chunks, and copying each one
        # costs as much as the reading did
        view = value if value is None or value is STALE or len(members) == 1 else memoryview(value)
        for slot, start, stop in members:
            part = view if view is None or view is STALE else view[start - span_start : stop - span_start]
            out[slot] = (part, seen)
    for slot, got in zip(alone, read[len(spans) :], strict=True):
        out[slot] = got
    return out


class IndexReader:
    """Index parts of the shards in ``inner``, through ``cache``.

    ``check_versions``: the store tells an object's version cheaply (a ``stat``), so a
    cached part is checked before "absent" is believed; otherwise a part older than
    ``max_age`` seconds is read again first (None: never)."""

    def __init__(
        self, inner: InnerStore, cache: IndexCache, *, check_versions: bool, max_age: float | None
    ) -> None:
        self._inner = inner
        self._cache = cache
        self._check_versions = check_versions
        self._max_age = max_age
        self._lock = threading.Lock()
        self._changed: OrderedDict[str, float] = OrderedDict()

    def forget(self, shard_key: str) -> None:
        """The shard changed (a write through this store): its parts go, and a part that
        a read sent before now brings back is not cached."""
        with self._lock:
            self._changed.pop(shard_key, None)
            self._changed[shard_key] = time.monotonic()
            if len(self._changed) > _CHANGES:
                self._changed.popitem(last=False)
        self._cache.drop_shard(shard_key)

    def cacheable(self, shard_key: str, sent: float) -> bool:
        """Whether a read sent at ``sent`` saw the shard as it is now, as far as this
        store's own writes go (a write may have landed while it was under way)."""
        changed = self._changed.get(shard_key)
        return changed is None or changed < sent

    def keep(
        self, shard: ShardRef, part: int, table: ChunkTable, version: Hashable | None, sent: float
    ) -> None:
        """Cache a part read by a request sent at ``sent`` (whole-shard reads bring them too)."""
        if version is None and self._inner.capabilities.versions:
            return  # read while a crashed append's tail was there: do not trust it
        if self.cacheable(shard.key, sent):
            self._cache.put((shard.key, part), IndexEntry(table, version, sent))

    # -- chunks -------------------------------------------------------------------------

    async def locate(self, chunks: Sequence[ChunkRef], *, fresh: bool = False) -> list[Location | None]:
        """Where each chunk's stored bytes lie, None where absent (cached parts first,
        unless ``fresh``)."""
        parts = _parts_of(chunks)
        wanted = {(chunk.shard.key, part): chunk.shard for chunk, part in zip(chunks, parts, strict=True)}
        since = time.monotonic()
        found = await self.part_tables(list(wanted.items()), fresh=fresh)

        def entry(chunk: ChunkRef, part: int) -> Location | None:
            table, version = found[(chunk.shard.key, part)]
            where = None if table is None else table_entry(table, chunk.position)
            return None if where is None else (*where, version)

        absent_from = {
            (chunk.shard.key, part)
            for chunk, part in zip(chunks, parts, strict=True)
            if found[(chunk.shard.key, part)][0] is not None and entry(chunk, part) is None
        }
        doubtful = [(where, wanted[where]) for where in absent_from if self._absence_unchecked(where, since)]
        if doubtful:
            found.update(await self.part_tables(doubtful, fresh=True))
        return [entry(chunk, part) for chunk, part in zip(chunks, parts, strict=True)]

    async def tables(
        self, wanted: Sequence[tuple[ShardRef, npt.NDArray[np.intp]]], *, fresh: bool = False
    ) -> list[tuple[ChunkTable | None, Hashable | None]]:
        """The index of each shard of a format with one index, with the version it was
        read at, for a read of the chunks at places ``wanted[i][1]``: found as
        :meth:`locate` finds chunks, a shard at a time instead of a chunk at a time."""
        where = [((shard.key, 0), shard) for shard, _ in wanted]
        since = time.monotonic()
        found = await self.part_tables(where, fresh=fresh)
        doubtful = [
            (key, shard)
            for (key, shard), (_, places) in zip(where, wanted, strict=True)
            if (table := found[key][0]) is not None
            and (table_rows(table, places)[:, 0] == ABSENT).any()
            and self._absence_unchecked(key, since)
        ]
        if doubtful:
            found.update(await self.part_tables(doubtful, fresh=True))
        return [found[key] for key, _ in where]

    def _absence_unchecked(self, where: tuple[str, int], since: float) -> bool:
        """Whether the part came from the cache (read before ``since``) and may no longer
        be current: its shard's version changed (where a ``stat`` tells) or it is older
        than ``max_age``."""
        cached = self._cache.get(where)
        if cached is None or cached.fetched_at >= since:
            return False
        if self._check_versions:
            return self._inner.version(where[0]) != cached.version
        return self._max_age is not None and time.monotonic() - cached.fetched_at > self._max_age

    # -- parts --------------------------------------------------------------------------

    async def part_tables(
        self, wanted: Sequence[tuple[tuple[str, int], ShardRef]], *, fresh: bool = False
    ) -> PartTables:
        """The tables of the parts ``((shard key, part), shard)``: cached ones (unless
        ``fresh``), the rest read for every shard at once, a level a round."""
        found: PartTables = {}
        missing: list[tuple[ShardRef, int]] = []
        versions: dict[str, Hashable | None] = {}
        for where, shard in dict(wanted).items():
            cached = None if fresh else self._usable(where, versions)
            if cached is None:
                missing.append((shard, where[1]))
            else:
                found[where] = (cached.table, cached.version)
        if missing:  # (all cached: the common warm read, no task, no thread hop)
            await until_fresh(
                lambda todo, now: self._read_parts(todo, found, last=now.last),
                missing,
                shard_of=lambda item: item[0].key,
                what="their indices",
            )
        return found

    def _usable(self, where: tuple[str, int], versions: dict[str, Hashable | None]) -> IndexEntry | None:
        """A cached part, unless the store tells versions cheaply (one ``stat`` per shard
        and call, kept in ``versions``) and its shard has changed since: then it goes,
        before a read located by it is wasted."""
        cached = self._cache.get(where)
        if cached is None or not self._check_versions:
            return cached
        if where[0] not in versions:
            versions[where[0]] = self._inner.version(where[0])
        if versions[where[0]] != cached.version:
            self._cache.drop(where)
            return None
        return cached

    async def _read_parts(
        self, todo: list[tuple[ShardRef, int]], found: PartTables, *, last: bool
    ) -> list[tuple[ShardRef, int]]:
        """One try at the parts ``todo``, into ``found``; those of shards replaced between
        the two levels are returned, to be read again."""
        sent = time.monotonic()
        firsts = await read_merged(
            self._inner, [(s.key, s.shard_format.part_request(p)) for s, p in todo], [None] * len(todo)
        )
        seconds: list[tuple[ShardRef, int, RangeByteRequest, Hashable | None]] = []
        tables: list[tuple[ShardRef, int, ChunkTable, Hashable | None]] = []
        read: dict[int, list[int]] = {}  # each format's parts read, by the format's id
        for k, ((shard, part), (raw, version)) in enumerate(zip(todo, firsts, strict=True)):
            if raw is None or raw is STALE:
                found[(shard.key, part)] = (None, version)  # no shard (yet)
            else:
                read.setdefault(id(shard.shard_format), []).append(k)
        for ks in read.values():  # (one format, as a rule: that of one array)
            located = todo[ks[0]][0].shard_format.read_parts(
                [todo[k][1] for k in ks],
                [cast(ChunkBytes, firsts[k][0]) for k in ks],
                [todo[k][0].key for k in ks],
            )
            for k, where in zip(ks, located, strict=True):
                (shard, part), version = todo[k], firsts[k][1]
                if isinstance(where, RangeByteRequest):
                    seconds.append((shard, part, where, version))
                else:
                    tables.append((shard, part, where, version))
        self._found(tables, sent, found)
        raws = await read_merged(
            self._inner, [(s.key, where) for s, _, where, _ in seconds], [v for *_, v in seconds]
        )
        again: list[tuple[ShardRef, int]] = []
        for (shard, part, where, version), (raw, seen) in zip(seconds, raws, strict=True):
            wanted = where.end - where.start
            got = -1 if raw is None or raw is STALE else len(raw)  # -1: replaced or deleted since
            if 0 <= got != wanted and ((seen is not None and seen == version) or last):
                raise ShardFormatError(  # cut short at the version its entry was read at: damage
                    f"shard {shard.key!r}: truncated: index part {part} at [{where.start}, {where.end}) "
                    f"lies past the end of the object ({got} of its {wanted} bytes there)"
                )
            if raw is None or raw is STALE or got != wanted:
                self.forget(shard.key)
                again.append((shard, part))
                continue
            self._found(
                [(shard, part, shard.shard_format.decode_part(part, raw, shard.key), version)], sent, found
            )
        return again

    def _found(
        self, tables: list[tuple[ShardRef, int, ChunkTable, Hashable | None]], sent: float, found: PartTables
    ) -> None:
        """Parts read (a shard, its part, the part's table, the shard's version), each
        checked against the shard's size where the version tells it (before any range
        is requested: each format's all at once), then kept and noted in ``found``."""
        sized: dict[int, list[tuple[ShardRef, ChunkTable, int]]] = {}
        for shard, _, table, version in tables:
            size = self._inner.object_size(version)
            if size is not None:
                sized.setdefault(id(shard.shard_format), []).append((shard, table, size))
        for checked in sized.values():
            checked[0][0].shard_format.check_tables(
                [table for _, table, _ in checked],
                [size for *_, size in checked],
                [s.key for s, *_ in checked],
            )
        for shard, part, table, version in tables:
            self.keep(shard, part, table, version, sent)
            found[(shard.key, part)] = (table, version)


def _parts_of(chunks: Sequence[ChunkRef]) -> list[int]:
    """The index part of each chunk, asked of each shard's format once."""
    by_shard: dict[str, list[int]] = {}
    for slot, chunk in enumerate(chunks):
        by_shard.setdefault(chunk.shard.key, []).append(slot)
    parts = [0] * len(chunks)
    for slots in by_shard.values():
        fmt = chunks[slots[0]].shard.shard_format
        for slot, part in zip(slots, fmt.index_parts([chunks[s].position for s in slots]), strict=True):
            parts[slot] = part
    return parts
