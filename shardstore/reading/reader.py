"""The read path: chunk bytes from cached whole shards, whole-shard fetches, or
ranges located by shard indices.

A batch of chunk reads is served per shard in one of three ways, all shards in
one inner round: from a cached whole shard; by fetching the whole shard in one
request (its table parsed from the bytes) when the strategy says so or the
batch wants at least half of the shard's chunks; or by range reads located
through the parts of the shards' indices that hold them
(:class:`~shardstore.reading.indices.IndexReader`: cached, or one more round a
level). Where the inner store can check an object's version in the same read
(local files, object stores), a range is read at the version its index part was
read at, and a stale one read again: never garbage. Concurrent fetches of one
shard share one request. Every format is read the same way: what differs is
asked of the shard's :class:`~shardstore.formats.base.ShardFormat`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence, Set
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
from zarr.abc.store import ByteRequest, RangeByteRequest

from shardstore.errors import ShardFormatError
from shardstore.formats.base import ChunkTable
from shardstore.inner import STALE, ChunkBytes, InnerStore
from shardstore.inner.base import NOT_MODIFIED, ReadInto, ReadThen
from shardstore.options import ReadPolicy
from shardstore.reading.cache import IndexCache, ShardCache, ShardSnapshot
from shardstore.reading.indices import IndexReader, Location, PartTables, read_merged
from shardstore.reading.ranges import sub_range
from shardstore.reading.refs import ChunkRef, ShardRef
from shardstore.reading.spans import span_snapshots
from shardstore.reading.stale import Attempt, until_fresh
from shardstore.tasks import gather

__all__ = ["EachShard", "ShardReader"]

log = logging.getLogger(__name__)


_Fetched = tuple[ShardSnapshot | None, Exception | None]
"""A whole-shard fetch's outcome, shared with the reads that joined it."""
EachShard: TypeAlias = Callable[[int, ShardSnapshot], None]
"""What takes a shard of a read as soon as it is read (see :meth:`ShardReader.fetch_shards`)."""

REPEAT_READS = 3
REPEAT_WINDOW = 1.0
"""``"repeat"``: the REPEAT_READS-th batch to read a shard, each within this many
seconds of the last, fetches it whole (a slab reads a shard once or twice; a
whole-array or random read pass comes back to it again and again)."""
_TOUCHES = 4096
"""Shards whose recent reads are remembered for "repeat"."""

ChunkRead = tuple[ChunkRef, ByteRequest | None]
"""A chunk, and the range of its stored bytes wanted (None: all)."""


def _covers(shard: ShardRef, positions: set[int]) -> bool:
    """Whether ``positions`` are every chunk of the shard inside the array."""
    places = shard.places_in_grid()
    return places is not None and len(positions) >= len(places) and positions.issuperset(places)


@dataclass
class _Ways:
    """How a read serves each of its shards (by their places in the read): from the
    cache (``cached[i]`` not None), revalidated (``recheck``: with the snapshot kept),
    fetched whole (``whole``; those in ``passing`` not cached), or by ranges."""

    shards: list[ShardRef]
    cached: list[ShardSnapshot | None]
    recheck: list[tuple[int, ShardSnapshot]]
    whole: list[int]
    passing: set[str]
    ranged: list[int]


@dataclass(frozen=True)
class _Chunk:
    """A chunk of a shard read by :meth:`ShardReader.read_shards` (a ChunkRef)."""

    key: str
    shard: ShardRef
    position: int


def _gathered(
    shard: ShardRef, places: list[int], values: Sequence[ChunkBytes | None], sent: float
) -> ShardSnapshot:
    """A snapshot holding just the chunks read of a shard (absent where None): the one
    object they are all views of (chunks read by one request), else a join of them."""
    table = shard.shard_format.empty_table()
    present = [(place, value) for place, value in zip(places, values, strict=True) if value is not None]
    pieces = [value for _, value in present]
    within = _views_of_one(pieces)
    if within is not None:
        data, starts = within
    else:
        data = b"".join(pieces)
        starts = np.cumsum([0, *map(len, pieces)])[:-1].tolist()
    for (place, value), start in zip(present, starts, strict=True):
        table[place] = (start, len(value))  # (a row of an index array, or a dict entry)
    return ShardSnapshot(data, table, sent)


def _views_of_one(pieces: list[ChunkBytes]) -> tuple[bytes, list[int]] | None:
    """The one bytes object every piece is a view of, and where each starts in it;
    None where they are not all (non-empty) views of one."""
    base = pieces[0].obj if pieces and isinstance(pieces[0], memoryview) else None
    if not isinstance(base, bytes):
        return None
    if not all(isinstance(p, memoryview) and p.obj is base and p.nbytes and p.c_contiguous for p in pieces):
        return None
    origin = _address(base)
    return base, [_address(p) - origin for p in pieces]


def _address(buffer: ChunkBytes) -> int:
    """Where a buffer's first byte lies in memory."""
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)


class ShardReader:
    """Chunk reads from the shards in ``inner``, through the index cache ``indices``
    and the shard cache ``shards``, as ``policy`` (a resolved ReadPolicy) says."""

    def __init__(
        self, inner: InnerStore, indices: IndexCache, shards: ShardCache, policy: ReadPolicy
    ) -> None:
        """Reads through ``indices`` and ``shards`` as ``policy`` says (see ReadPolicy)."""
        self._inner = inner
        self._index_cache = indices
        self._shards = shards
        self._check_versions = policy.validate and inner.capabilities.versions
        self._indices = IndexReader(
            inner, indices, check_versions=self._check_versions, max_age=policy.max_age
        )
        self._whole = policy.whole
        self._whole_limit = policy.whole_limit
        self._max_age = policy.max_age
        self._revalidate = policy.revalidate
        self._lock = threading.Lock()
        self._inflight: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Future[_Fetched]] = {}
        self._joined: set[asyncio.Future[_Fetched]] = set()
        """Fetches in flight that another read has joined (see :meth:`fetch_shards`)."""
        self._touched: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def cache_usage(self) -> dict[str, tuple[int, int]]:
        """Entries and bytes held by the index cache ("indices") and the shard cache ("shards")."""
        indices, shards = self._index_cache, self._shards
        return {"indices": (len(indices), indices.nbytes), "shards": (len(shards), shards.nbytes)}

    def forget(self, shard_key: str) -> None:
        """The shard changed (a write through this store): what is cached of it goes,
        and what a read sent before now brings back is not cached, nor shared with a
        read that starts from now on (a fetch under way is joined no more)."""
        self._indices.forget(shard_key)
        self._shards.drop(shard_key)
        with self._lock:
            for key in [key for key in self._inflight if key[1] == shard_key]:
                del self._inflight[key]

    async def read_chunks(self, chunks: Sequence[ChunkRead]) -> list[ChunkBytes | None]:
        """Chunk bytes (ranges of them), each shard served from the shard cache, by
        one whole-shard fetch, or by range reads; the fetches and range reads of
        all shards in one inner round (after one more for uncached indices)."""
        results: list[ChunkBytes | None] = [None] * len(chunks)
        by_shard: dict[str, list[int]] = {}
        for i, (chunk, _) in enumerate(chunks):
            by_shard.setdefault(chunk.shard.key, []).append(i)
        members = list(by_shard.values())
        ways = self._ways([(chunks[m[0]][0].shard, {chunks[i][0].position for i in m}) for m in members])
        for snapshot, m in zip(ways.cached, members, strict=True):
            if snapshot is not None:
                self._serve(snapshot, m, chunks, results)

        async def whole() -> None:
            for snapshot, m in zip(await self._snapshots(ways), members, strict=True):
                if snapshot is not None:  # (only those fetched or revalidated)
                    self._serve(snapshot, m, chunks, results)

        ranged = [i for s in ways.ranged for i in members[s]]
        rounds = [whole() if ways.whole or ways.recheck else None]
        rounds.append(self._read_ranges(ranged, chunks, results) if ranged else None)
        await gather(*(r for r in rounds if r is not None))
        return results

    async def read_shards(
        self,
        wanted: Sequence[tuple[ShardRef, list[int], list[str]]],
        into: ReadInto | None = None,
        each: EachShard | None = None,
    ) -> list[ShardSnapshot | None]:
        """For a read that wants the places ``wanted[i][1]`` (chunk keys ``wanted[i][2]``,
        named in errors) of each shard: the shards as snapshots, served as
        :meth:`read_chunks` serves them, in one inner round (after one more for uncached
        indices). A shard read by ranges comes as a snapshot of the wanted chunks alone,
        not cached: the caller reads every chunk out of a snapshot alike. ``into``: memory
        to read into what is not cached (shards passing through, see
        :meth:`fetch_shards`, and spans of chunks). ``each``: what takes the shards
        passing through as they are read, where the inner store ``hands_as_read``
        (see :meth:`fetch_shards`); None in the list for those."""
        ways = self._ways([(shard, set(places)) for shard, places, _ in wanted])
        got: list[ShardSnapshot | None] = list(ways.cached)

        async def whole() -> None:
            for i, snapshot in enumerate(await self._snapshots(ways, into, each)):
                got[i] = got[i] or snapshot

        spanned = [s for s in ways.ranged if wanted[s][0].shard_format.one_index]
        chunkwise = [s for s in ways.ranged if not wanted[s][0].shard_format.one_index]

        async def spans() -> None:
            found = await span_snapshots(
                self._inner, self._indices, self._index_cache, [wanted[s] for s in spanned], into
            )
            for s, snapshot in zip(spanned, found, strict=True):
                got[s] = snapshot

        async def ranges() -> None:
            refs = [
                _Chunk(key, wanted[s][0], p) for s in chunkwise for p, key in zip(*wanted[s][1:], strict=True)
            ]
            values: list[ChunkBytes | None] = [None] * len(refs)
            await self._read_ranges(list(range(len(refs))), [(r, None) for r in refs], values)
            sent, start = time.monotonic(), 0
            for s in chunkwise:
                n = len(wanted[s][1])
                got[s] = _gathered(wanted[s][0], wanted[s][1], values[start : start + n], sent)
                start += n

        rounds = [
            whole() if ways.whole or ways.recheck else None,
            spans() if spanned else None,
            ranges() if chunkwise else None,
        ]
        await gather(*(r for r in rounds if r is not None))
        return got

    def _ways(self, wanted: Sequence[tuple[ShardRef, set[int]]]) -> _Ways:
        """How each shard of a read is served, by the places wanted of it."""
        shards = [shard for shard, _ in wanted]
        ways = _Ways(shards, [self._cached(shard.key) for shard in shards], [], [], set(), [])
        for i, (shard, positions) in enumerate(wanted):
            if ways.cached[i] is not None:
                continue
            if (
                self._revalidate
                and (kept := self._shards.get(shard.key)) is not None
                and kept.version is not None
            ):
                ways.recheck.append((i, kept))
            elif self._wants_whole(shard, positions):
                ways.whole.append(i)
                if _covers(shard, positions):
                    ways.passing.add(shard.key)
            else:
                ways.ranged.append(i)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "read chunks of %d shard(s): %d from the shard cache, %d revalidated, %d fetched whole, "
                "%d by index and ranges",
                len(wanted),
                len(wanted) - len(ways.whole) - len(ways.recheck) - len(ways.ranged),
                len(ways.recheck),
                len(ways.whole),
                len(ways.ranged),
            )
        return ways

    async def _snapshots(
        self, ways: _Ways, into: ReadInto | None = None, each: EachShard | None = None
    ) -> list[ShardSnapshot | None]:
        """The shards ``ways`` fetches whole or revalidates, fetched in one round (None
        for the others, and for those given to ``each``)."""
        got: list[ShardSnapshot | None] = [None] * len(ways.shards)

        async def fetched() -> None:
            shards = [ways.shards[i] for i in ways.whole]
            given = None if each is None else lambda j, snapshot: each(ways.whole[j], snapshot)
            outcomes = await self.fetch_shards(shards, passing=ways.passing, into=into, each=given)
            for i, (snapshot, error) in zip(ways.whole, outcomes, strict=True):
                if error is not None:
                    raise error
                got[i] = snapshot

        async def revalidated() -> None:
            fresh = await self._revalidated([(ways.shards[i], kept) for i, kept in ways.recheck])
            for (i, _), snapshot in zip(ways.recheck, fresh, strict=True):
                got[i] = snapshot

        rounds = [fetched() if ways.whole else None, revalidated() if ways.recheck else None]
        await gather(*(r for r in rounds if r is not None))
        return got

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

    def _wants_whole(self, shard: ShardRef, positions: set[int]) -> bool:
        nominal = shard.nominal_nbytes
        small = self._whole_limit is None or (nominal is not None and nominal <= self._whole_limit)
        again = self._whole in ("repeat", "first") and self._repeated(shard.key)
        if small and (self._whole == "always" or again):
            return True
        if not shard.shard_format.one_index:
            return False  # chunks located by parts of the index: read by those
        if self._index_cache.get((shard.key, 0)) is not None:
            return False  # the index is known: merged ranges read no more than needed
        # one round trip instead of two, for a small shard or most of a big one
        if small and self._whole == "first":
            return True
        places = shard.places_in_grid()
        return places is not None and 2 * len(positions) >= len(places)

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
        chunks: Sequence[ChunkRead],
        results: list[ChunkBytes | None],
    ) -> None:
        for i in members:
            chunk, byte_range = chunks[i]
            entry = snapshot.chunk(chunk.position)
            if entry is not None:
                results[i] = snapshot.view(*sub_range(*entry, byte_range))

    async def _revalidated(self, shards: list[tuple[ShardRef, ShardSnapshot]]) -> list[ShardSnapshot]:
        """Cached shards asked for again in one batch, each only if it changed."""
        sent = time.monotonic()
        raws = await self._inner.get_many_if_modified([(shard.key, kept.version) for shard, kept in shards])
        fresh: list[ShardSnapshot] = []
        for (shard, kept), (raw, version) in zip(shards, raws, strict=True):
            if raw is NOT_MODIFIED:
                fresh.append(kept)
                continue
            snapshot, error = self._snapshot(shard, raw, version, sent)
            if error is not None:
                raise error
            assert snapshot is not None
            fresh.append(snapshot)
        return fresh

    async def fetch_shards(
        self,
        shards: Sequence[ShardRef],
        *,
        passing: Set[str] = frozenset(),
        into: ReadInto | None = None,
        each: EachShard | None = None,
    ) -> list[_Fetched]:
        """Whole shards in one inner batch, each as a snapshot (an absent shard as
        an empty one); a fetch of the same shard already under way is joined. The
        shards ``passing`` names are wanted whole by this read alone (all their
        chunks): they pass through without entering the shard cache, so that a
        bulk read does not push out what repeated reads keep there. A batch of such
        shards alone is read into memory ``into`` gives, where given and the store
        reads into memory (:meth:`~shardstore.inner.InnerStore.get_many_into`): a
        bulk read's caller gives memory a group read before it no longer needs.
        Where the store also ``hands_as_read``, such shards go to
        ``each(i, snapshot)`` (``i``: the place in ``shards``) on a worker thread, as
        soon as each is read, and come as ``(None, None)``: each shard's
        memory is free for the next as soon as ``each`` is done with it. A shard
        another read has joined the fetch of by then comes as its snapshot instead,
        for both; one joined later is fetched again by the read that joined. What
        ``each`` raises fails the call, as a damaged shard does."""
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[_Fetched]] = []
        mine: list[tuple[int, ShardRef, asyncio.Future[_Fetched]]] = []
        with self._lock:
            for i, shard in enumerate(shards):
                future = self._inflight.get((loop, shard.key))
                if future is None:
                    future = self._inflight[(loop, shard.key)] = loop.create_future()
                    mine.append((i, shard, future))
                else:
                    self._joined.add(future)
                waits.append(future)
        given: set[int] = set()
        if mine:
            given = await self._fetch(loop, mine, passing, into, each)
        # (shielded: a read cancelled while it waits must not cancel a fetch others wait for)
        outcomes = [await asyncio.shield(future) for future in waits]
        abandoned = [
            i
            for i, (snapshot, error) in enumerate(outcomes)
            if snapshot is None and error is None and i not in given
        ]
        if abandoned:  # the fetch we joined was cancelled, or gave the shard to its each first: fetch those
            again = await self.fetch_shards([shards[i] for i in abandoned], passing=passing, into=into)
            for i, outcome in zip(abandoned, again, strict=True):
                outcomes[i] = outcome
        return outcomes

    async def _fetch(
        self,
        loop: asyncio.AbstractEventLoop,
        mine: list[tuple[int, ShardRef, asyncio.Future[_Fetched]]],
        passing: Set[str],
        into: ReadInto | None,
        each: EachShard | None,
    ) -> set[int]:
        """Fetches ``mine`` (place in the call, shard, the future its outcome goes to):
        the places of those given to ``each`` (see :meth:`fetch_shards`)."""
        sent = time.monotonic()
        outcomes: list[_Fetched] = [(None, None)] * len(mine)
        keys = [shard.key for _, shard, _ in mine]
        given: set[int] = set()
        try:
            raws: Sequence[tuple[ChunkBytes | None, Hashable | None]]
            requests: list[tuple[str, ByteRequest | None]] = [(key, None) for key in keys]
            then: ReadThen | None = None
            if into is not None and all(key in passing for key in keys):
                if each is not None and self._inner.capabilities.hands_as_read:
                    then = self._handing(mine, sent, each, outcomes, given)
                raws = await self._inner.get_many_into(requests, [None] * len(keys), into, then)
            else:
                raws = await self._inner.get_many_versioned(requests, [None] * len(keys))
            if then is None:
                outcomes = [
                    self._snapshot(shard, raw, version, sent, keep=shard.key not in passing)
                    for (_, shard, _), (raw, version) in zip(mine, raws, strict=True)
                ]
        except Exception as exc:
            outcomes = [(None, exc)] * len(mine)
        finally:  # joiners always get an outcome, (None, None) if this task was cancelled
            with self._lock:
                for (_, shard, future), outcome in zip(mine, outcomes, strict=True):
                    if self._inflight.get((loop, shard.key)) is future:  # (not forgotten since)
                        del self._inflight[(loop, shard.key)]
                    self._joined.discard(future)
                    future.set_result(outcome)
        return given

    def _handing(
        self,
        mine: list[tuple[int, ShardRef, asyncio.Future[_Fetched]]],
        sent: float,
        each: EachShard,
        outcomes: list[_Fetched],
        given: set[int],
    ) -> ReadThen:
        """What gives each shard of a fetch to ``each`` as it is read (its place noted
        in ``given``), unless another read has joined its fetch (its snapshot then
        noted in ``outcomes``, for both); its failure (a damaged shard, or what
        ``each`` or anything else raised) noted in ``outcomes``, never raised on the
        reading thread."""

        def then(k: int, raw: ChunkBytes | None, version: Hashable | None) -> None:
            i, shard, future = mine[k]
            try:
                snapshot, error = self._snapshot(shard, raw, version, sent, keep=False)
                with self._lock:
                    joined = future in self._joined
                if snapshot is not None and not joined:
                    given.add(i)
                    each(i, snapshot)
                    snapshot = None
            except Exception as exc:
                snapshot, error = None, exc
            if snapshot is not None or error is not None:
                outcomes[k] = (snapshot, error)

        return then

    def _snapshot(
        self,
        shard: ShardRef,
        raw: ChunkBytes | None,
        version: Hashable | None,
        sent: float,
        *,
        keep: bool = True,
    ) -> _Fetched:
        """The shard as fetched; cached unless not ``keep`` (its index is, either way)."""
        fmt = shard.shard_format
        try:
            table = fmt.empty_table() if raw is None else fmt.parse(raw, shard.key)
        except ShardFormatError as exc:
            return None, exc
        snapshot = ShardSnapshot(b"" if raw is None else raw, table, sent, version)
        if self._indices.cacheable(shard.key, sent):
            if keep:
                self._shards.put(shard.key, snapshot)
            if raw is not None and fmt.one_index:  # its table is its one index
                self._indices.keep(shard, 0, table, version, sent)
        return snapshot, None

    async def _read_ranges(
        self,
        todo: list[int],
        chunks: Sequence[ChunkRead],
        results: list[ChunkBytes | None],
    ) -> None:
        """Range reads located by indices (cached or read in one batch), nearby ranges
        of a shard merged. Where a cached index turns out stale (the read checks the
        shard's version for free), those chunks are read again afresh."""

        async def attempt(todo: list[int], now: Attempt) -> list[int]:
            entries = await self.index_entries([chunks[i][0] for i in todo], fresh=not now.first)
            wanted: list[tuple[int, RangeByteRequest, Hashable | None]] = []
            for i, entry in zip(todo, entries, strict=True):
                if entry is None:
                    continue
                offset, nbytes, version = entry
                start, stop = sub_range(offset, nbytes, chunks[i][1])
                if start == stop:
                    results[i] = b""
                else:  # read at the version its index was read at (checked where the store can)
                    wanted.append((i, RangeByteRequest(start, stop), version))
            values = await read_merged(
                self._inner, [(chunks[i][0].shard.key, r) for i, r, _ in wanted], [v for *_, v in wanted]
            )
            stale: list[int] = []
            for (i, where, version), (value, _) in zip(wanted, values, strict=True):
                key = chunks[i][0].shard.key
                if value is STALE or (value is None and version is not None):  # replaced or gone
                    self._index_cache.drop_shard(key)
                    stale.append(i)
                elif value is None or len(value) != where.end - where.start:
                    raise ShardFormatError(
                        f"shard {key!r}: chunk {chunks[i][0].key!r} runs past the end of the shard object "
                        f"(wanted {where.end - where.start} bytes, got {0 if value is None else len(value)})"
                    )
                else:
                    results[i] = value
            return stale

        await until_fresh(attempt, todo, shard_of=lambda i: chunks[i][0].shard.key, what="chunks of them")

    async def index_entries(
        self, chunks: Sequence[ChunkRef], *, fresh: bool = False
    ) -> list[Location | None]:
        """``(offset, nbytes, shard version)`` of each chunk, None where absent (see
        :meth:`IndexReader.locate`)."""
        return await self._indices.locate(chunks, fresh=fresh)

    async def part_tables(
        self, wanted: Sequence[tuple[tuple[str, int], ShardRef]], *, fresh: bool = False
    ) -> PartTables:
        """Tables of index parts ``((shard key, part), shard)``, cached or read (see
        :meth:`IndexReader.part_tables`)."""
        return await self._indices.part_tables(wanted, fresh=fresh)

    async def shard_indices(
        self, shards: Sequence[ShardRef], *, fresh: bool = False
    ) -> dict[str, tuple[ChunkTable | None, Hashable | None]]:
        """Whole tables (and versions) of shards: a format's one index (cached, or read
        for all shards in one round), else the table of the whole shard, fetched."""
        one = [s for s in shards if s.shard_format.one_index]
        whole = [s for s in shards if not s.shard_format.one_index]
        found: dict[str, tuple[ChunkTable | None, Hashable | None]] = {}
        if one:
            parts = await self._indices.part_tables([((s.key, 0), s) for s in one], fresh=fresh)
            found.update({key: got for (key, _), got in parts.items()})
        if whole:
            for shard, (snapshot, error) in zip(whole, await self.fetch_shards(whole), strict=True):
                if error is not None:
                    raise error
                assert snapshot is not None
                found[shard.key] = (snapshot.index if snapshot.data else None, snapshot.version)
        return found

    async def read_indices(self, shards: Sequence[ShardRef]) -> list[ChunkTable | None]:
        """Fresh indices for listings and maintenance (never from the cache)."""
        found = await self.shard_indices(shards, fresh=True)
        return [found[s.key][0] for s in shards]
