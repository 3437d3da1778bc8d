"""Ranged reads a shard at a time (shardstore.reading.spans): the chunks a read wants
of each shard are located with numpy over the shards' indices, read as a few spans,
and come back as one snapshot per shard holding exactly those chunks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from shardstore.errors import ShardFormatError
from shardstore.formats.base import ShardFormat
from shardstore.formats.indexed.format import IndexedFormat
from shardstore.inner import LocalInner, adapt
from shardstore.reading.cache import IndexCache
from shardstore.reading.indices import IndexReader
from shardstore.reading.ranges import MERGE_GAP, merge_ranges
from shardstore.reading.spans import plan_spans, span_snapshots

FORMAT = IndexedFormat((4, 4))


@dataclass(frozen=True)
class _Shard:
    key: str
    shard_format: ShardFormat = FORMAT
    nominal_nbytes: int | None = None

    def places_in_grid(self) -> tuple[int, ...] | None:
        return None


# chunk sizes: mostly small, some empty, some big enough to leave gaps past MERGE_GAP
_size = st.one_of(st.integers(1, 300), st.just(0), st.integers(MERGE_GAP // 2, MERGE_GAP + 100))
_shard = st.dictionaries(st.integers(0, 15), _size, max_size=16)


def _chunks(sizes: dict[int, int], salt: int) -> dict[int, bytes]:
    return {p: bytes((salt + p + i) % 251 for i in range(n)) for p, n in sizes.items()}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), _shard), min_size=1, max_size=5), st.data())
def test_spans_cover_each_shards_chunks_as_merge_ranges_groups_them(
    shards: list[dict[int, int] | None], data: st.DataObject
) -> None:
    tables = [None if s is None else FORMAT.parse(FORMAT.build(_chunks(s, 0)), "k") for s in shards]
    places = [np.array(data.draw(st.lists(st.integers(0, 15), unique=True)), dtype=np.intp) for _ in shards]
    plan = plan_spans(tables, places)
    for k, (table, wanted) in enumerate(zip(tables, places, strict=True)):
        mine = plan.shard == k
        present = (
            [] if table is None else [i for i, p in enumerate(wanted.tolist()) if table[p, 0] != 2**64 - 1]
        )
        assert plan.chunk[mine].tolist() == present
        assert plan.places[mine].tolist() == [int(wanted[i]) for i in present]
        stored = [
            (i, int(table[p, 0]), int(table[p, 0] + table[p, 1]))  # type: ignore[index]
            for i, p in enumerate(plan.places[mine].tolist())
            if table[p, 1] > 0  # type: ignore[index]
        ]
        spans = plan.span_shard == k
        expected = [(a, b) for a, b, _ in merge_ranges(stored, MERGE_GAP)]
        assert list(zip(plan.starts[spans].tolist(), plan.stops[spans].tolist(), strict=True)) == expected
        for offset, size, span in zip(plan.offsets[mine], plan.sizes[mine], plan.span_of[mine], strict=True):
            if size:
                assert plan.span_shard[span] == k
                assert plan.starts[span] <= offset and offset + size <= plan.stops[span]
    assert np.all(np.diff(plan.span_shard) >= 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(_shard, min_size=1, max_size=4), st.data())
def test_each_snapshot_holds_exactly_the_chunks_wanted(
    shards: list[dict[int, int]], data: st.DataObject
) -> None:
    objects = {f"s{k}": FORMAT.build(_chunks(s, k)) for k, s in enumerate(shards)}
    inner = adapt(dict(objects))
    reader = IndexReader(inner, IndexCache(1 << 20), check_versions=False, max_age=None)
    wanted = [
        (_Shard(f"s{k}"), data.draw(st.lists(st.integers(0, 15), unique=True, min_size=1)), [])
        for k in range(len(shards) + 1)  # and a shard that is not there
    ]
    wanted = [(shard, places, [f"{shard.key}/{p}" for p in places]) for shard, places, _ in wanted]
    snapshots = asyncio.run(span_snapshots(inner, reader, IndexCache(1 << 20), wanted))
    for (shard, places, _), snapshot in zip(wanted, snapshots, strict=True):
        chunks = _chunks(shards[int(shard.key[1:])], int(shard.key[1:])) if shard.key in objects else {}
        for place in range(16):
            where = snapshot.chunk(place)
            if place in places and place in chunks:
                assert where is not None
                assert bytes(snapshot.view(where[0], where[0] + where[1])) == chunks[place]
            else:
                assert where is None


def test_a_chunk_past_the_end_of_its_shard_is_named() -> None:
    blob = FORMAT.build({1: b"abc", 2: b"defgh"})
    index = np.frombuffer(blob[-FORMAT.index_nbytes :], dtype="<u8").reshape(-1, 2).copy()
    index[2, 1] = 1000  # chunk 2 claims 1000 bytes of an object of 264
    damaged = blob[:8] + FORMAT.encode_index(index)
    inner = adapt({"s": damaged})
    reader = IndexReader(inner, IndexCache(1 << 20), check_versions=False, max_age=None)
    wanted = [(_Shard("s"), [1, 2], ["a/c/1", "a/c/2"])]
    with pytest.raises(ShardFormatError, match=r"'s'.*'a/c/2'.*past the end"):
        asyncio.run(span_snapshots(inner, reader, IndexCache(1 << 20), wanted))


def test_a_shard_replaced_after_its_index_was_cached_is_read_afresh(tmp_path: Path) -> None:
    inner = LocalInner(tmp_path)
    cache = IndexCache(1 << 20)
    reader = IndexReader(inner, cache, check_versions=False, max_age=None)  # trusts its cache
    asyncio.run(inner.set("s", FORMAT.build({0: b"old", 1: b"chunk"})))
    wanted = [(_Shard("s"), [0, 1], ["a/c/0", "a/c/1"])]
    first = asyncio.run(span_snapshots(inner, reader, cache, wanted))[0]
    assert first.chunk(0) is not None and len(cache) == 1
    asyncio.run(inner.set("s", FORMAT.build({0: b"a longer chunk", 1: b"another chunk"})))
    again = asyncio.run(span_snapshots(inner, reader, cache, wanted))[0]  # its cached index is stale
    for place, value in [(0, b"a longer chunk"), (1, b"another chunk")]:
        where = again.chunk(place)
        assert where is not None and bytes(again.view(where[0], where[0] + where[1])) == value
