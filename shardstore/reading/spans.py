"""Ranged reads a shard at a time: the chunks a read wants of shards whose format has
one index, located with numpy over each shard's index and read as a few spans per
shard, then handed on as one snapshot per shard.

The chunk-at-a-time path (:meth:`ShardReader._read_ranges`) does the same with a
Python object per chunk; a slab's row of 64 chunks cost about a millisecond more
so. Versions, stale shards and damage are handled as there: each span is read at the
version its index was read at, a shard replaced meanwhile is read again afresh
(:func:`~shardstore.reading.stale.until_fresh`), and a chunk running past the end of
its shard is a ShardFormatError naming it.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from zarr.abc.store import RangeByteRequest

from shardstore.errors import ShardFormatError
from shardstore.formats.base import ABSENT, ChunkTable, table_rows
from shardstore.inner import STALE, ChunkBytes, InnerStore
from shardstore.inner.base import ReadInto, failure
from shardstore.reading.cache import IndexCache, ShardSnapshot
from shardstore.reading.indices import IndexReader
from shardstore.reading.ranges import MERGE_GAP, merge_spans
from shardstore.reading.refs import ShardRef
from shardstore.reading.stale import Attempt, until_fresh

__all__ = ["SpanPlan", "plan_spans", "span_snapshots"]


@dataclass(frozen=True)
class SpanPlan:
    """What to read of several shards: spans ``[start, stop)``, each of one shard
    (``span_shard``), in the order of the shards; and for each chunk wanted that is
    present, in the order wanted: its shard, which of that shard's chunks wanted it
    is, its place, where it lies and its span (0 for an empty chunk: nothing to read)."""

    shard: npt.NDArray[np.intp]
    chunk: npt.NDArray[np.intp]
    places: npt.NDArray[np.intp]
    offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    span_of: npt.NDArray[np.intp]
    span_shard: npt.NDArray[np.intp]
    starts: npt.NDArray[np.int64]
    stops: npt.NDArray[np.int64]


def plan_spans(
    tables: Sequence[ChunkTable | None], places: Sequence[npt.NDArray[np.intp]], gap: int = MERGE_GAP
) -> SpanPlan:
    """The spans to read for the chunks at ``places[k]`` of shards with tables
    ``tables[k]`` (None: no shard, nothing to read), found for all shards at once:
    ranges of a shard at most ``gap`` apart share a span (:func:`merge_spans`)."""
    counts = np.array(
        [0 if t is None else len(p) for t, p in zip(tables, places, strict=True)], dtype=np.intp
    )
    found = [table_rows(t, p) for t, p in zip(tables, places, strict=True) if t is not None]
    rows = np.concatenate(found) if found else np.zeros((0, 2), dtype=np.uint64)
    shard = np.repeat(np.arange(len(tables), dtype=np.intp), counts)
    chunk = np.arange(len(shard), dtype=np.intp) - np.repeat(np.cumsum(counts) - counts, counts)
    wanted = np.concatenate([p for t, p in zip(tables, places, strict=True) if t is not None] or [shard[:0]])
    present = rows[:, 0] != ABSENT
    shard, chunk, wanted = shard[present], chunk[present], wanted[present]
    offsets, sizes = rows[present, 0].astype(np.int64), rows[present, 1].astype(np.int64)
    stored = sizes > 0
    span_of = np.zeros(len(offsets), dtype=np.intp)
    starts = stops = np.zeros(0, dtype=np.int64)
    span_shard = np.zeros(0, dtype=np.intp)
    if stored.any():
        # each shard's ranges moved past the last one's, more than ``gap`` apart: one merge for all
        owner, first, last = shard[stored], offsets[stored], offsets[stored] + sizes[stored]
        top = np.zeros(len(tables), dtype=np.int64)
        np.maximum.at(top, owner, last)
        room = top + gap + 1
        base = np.cumsum(room) - room
        starts, stops, span_of[stored] = merge_spans(first + base[owner], last + base[owner], gap)
        span_shard = np.empty(len(starts), dtype=np.intp)
        span_shard[span_of[stored]] = owner
        starts, stops = starts - base[span_shard], stops - base[span_shard]
    return SpanPlan(shard, chunk, wanted, offsets, sizes, span_of, span_shard, starts, stops)


def _snapshots(
    shards: Sequence[ShardRef],
    keys: Sequence[Sequence[str]],
    plan: SpanPlan,
    values: Sequence[Any],
    stale: set[int],
    sent: float,
) -> dict[int, ShardSnapshot]:
    """The snapshot of each shard not ``stale``, out of the bytes ``values`` of the
    spans of ``plan``: a shard's one span as it is (the common case: the chunks a read
    wants of a shard lie together), else its spans joined. ShardFormatError names a
    chunk that runs past the end of its shard object."""
    lengths = np.array([0 if v is None or v is STALE else len(v) for v in values], dtype=np.int64)
    stored = plan.sizes > 0
    span_of = plan.span_of[stored]
    ends = plan.starts + lengths
    past = np.zeros(len(plan.sizes), dtype=bool)
    past[stored] = plan.offsets[stored] + plan.sizes[stored] > ends[span_of]
    if stale:  # (np.isin costs more than the rest of this check)
        past &= ~np.isin(plan.shard, list(stale))
    if past.any():
        cut = int(np.flatnonzero(past)[0])
        k = int(plan.shard[cut])
        got = max(0, int(ends[plan.span_of[cut]] - plan.offsets[cut]))
        raise ShardFormatError(
            f"shard {shards[k].key!r}: chunk {keys[k][int(plan.chunk[cut])]!r} runs past the end of the "
            f"shard object (wanted {int(plan.sizes[cut])} bytes, got {got})"
        )
    span_bounds = np.searchsorted(plan.span_shard, np.arange(len(shards) + 1))
    where = np.zeros(len(plan.sizes), dtype=np.int64)  # (an empty chunk: no bytes anywhere)
    if len(lengths):
        before = np.cumsum(lengths) - lengths
        firsts = before[np.minimum(span_bounds[:-1], len(lengths) - 1)]
        bases = before - firsts[plan.span_shard]  # where each span starts in its shard's data
        where[stored] = plan.offsets[stored] - plan.starts[span_of] + bases[span_of]
    rows = np.stack([where, plan.sizes], axis=1).astype(np.uint64)
    chunk_bounds = np.searchsorted(plan.shard, np.arange(len(shards) + 1)).tolist()
    snapshots: dict[int, ShardSnapshot] = {}
    for k, (lo, hi, first, last) in enumerate(
        zip(chunk_bounds, chunk_bounds[1:], span_bounds.tolist(), span_bounds[1:].tolist(), strict=False)
    ):
        if k in stale:
            continue
        data = values[first] if last - first == 1 else b"".join(values[first:last])
        table = shards[k].shard_format.empty_table()
        if isinstance(table, np.ndarray):
            table[plan.places[lo:hi]] = rows[lo:hi]
        else:
            table.update(zip(plan.places[lo:hi].tolist(), map(tuple, rows[lo:hi].tolist()), strict=True))
        snapshots[k] = ShardSnapshot(
            data if isinstance(data, bytes | memoryview) else bytes(data), table, sent
        )
    return snapshots


async def span_snapshots(
    inner: InnerStore,
    indices: IndexReader,
    index_cache: IndexCache,
    wanted: Sequence[tuple[ShardRef, list[int], list[str]]],
    into: ReadInto | None = None,
) -> list[ShardSnapshot]:
    """Snapshots holding the chunks ``wanted[i][1]`` (chunk keys ``wanted[i][2]``, named in
    errors) of shards whose format has one index: the indices (cached or read in one
    round), then the spans of every shard in one more, into memory ``into`` gives
    where given (see :meth:`~shardstore.inner.InnerStore.get_many_into`)."""
    got: list[ShardSnapshot | None] = [None] * len(wanted)
    places = [np.asarray(p, dtype=np.intp) for _, p, _ in wanted]

    async def attempt(todo: list[int], now: Attempt) -> list[int]:
        tables = await indices.tables([(wanted[i][0], places[i]) for i in todo], fresh=not now.first)
        plan = plan_spans([table for table, _ in tables], [places[i] for i in todo])
        keys = [wanted[todo[k]][0].key for k in plan.span_shard.tolist()]
        versions = [tables[k][1] for k in plan.span_shard.tolist()]
        requests = [
            (key, RangeByteRequest(start, stop))
            for key, start, stop in zip(keys, plan.starts.tolist(), plan.stops.tolist(), strict=True)
        ]
        with failure("read", keys[0] if keys else ""):
            read: list[tuple[ChunkBytes | None, Hashable | None]]
            if not requests:
                read = []
            elif into is None:
                read = list(await inner.get_many_versioned(requests, versions))
            else:
                read = await inner.get_many_into(requests, versions, into)
        sent = time.monotonic()
        values = [value for value, _ in read]
        stale = {
            int(k)
            for k, value, version in zip(plan.span_shard.tolist(), values, versions, strict=True)
            if value is STALE or (value is None and version is not None)  # replaced or gone since
        }
        for k in stale:
            index_cache.drop_shard(wanted[todo[k]][0].key)
        shards = [wanted[i][0] for i in todo]
        found = _snapshots(shards, [wanted[i][2] for i in todo], plan, values, stale, sent)
        for k, snapshot in found.items():
            got[todo[k]] = snapshot
        return [todo[k] for k in sorted(stale)]

    await until_fresh(
        attempt, list(range(len(wanted))), shard_of=lambda i: wanted[i][0].key, what="chunks of them"
    )
    return got  # type: ignore[return-value]
