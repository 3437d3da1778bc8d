"""Chunks read by ranges: nearby ranges of a shard come back as views of the one
request that read them, and a read's snapshot of a shard is that request's bytes,
not a copy of each chunk joined again."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from zarr.abc.store import RangeByteRequest

from shardstore.formats.base import ShardFormat
from shardstore.formats.indexed.format import IndexedFormat
from shardstore.inner import adapt
from shardstore.reading.indices import read_merged
from shardstore.reading.ranges import MERGE_GAP
from shardstore.reading.reader import _gathered


@dataclass(frozen=True)
class _Shard:
    key: str
    shard_format: ShardFormat
    nominal_nbytes: int | None = None

    def places_in_grid(self) -> tuple[int, ...] | None:
        return None


BLOB = np.random.default_rng(0).integers(0, 256, 4 * MERGE_GAP, dtype=np.uint8).tobytes()


def _read(ranges: list[tuple[str, int, int]]) -> list[bytes | memoryview | None]:
    inner = adapt({"s": BLOB, "t": BLOB[:100]})
    requests = [(key, RangeByteRequest(start, stop)) for key, start, stop in ranges]
    got = asyncio.run(read_merged(inner, requests, [None] * len(requests)))
    return [value for value, _ in got]


def test_nearby_ranges_of_one_object_are_views_of_one_read() -> None:
    near = [("s", 10, 20), ("s", 30, 50), ("s", 50, 60)]
    far = ("s", 3 * MERGE_GAP, 3 * MERGE_GAP + 5)  # past the gap: its own request
    values = _read([*near, far, ("t", 0, 7)])
    for (_, start, stop), value in zip([*near, far], values[:4], strict=True):
        assert value is not None and bytes(value) == BLOB[start:stop]
    assert values[4] == BLOB[:7]
    merged = values[:3]
    assert all(isinstance(v, memoryview) for v in merged)
    assert len({id(v.obj) for v in merged}) == 1  # type: ignore[union-attr]
    assert isinstance(values[3], bytes) and isinstance(values[4], bytes)  # read alone: as read


def test_a_snapshot_of_chunks_read_together_is_their_one_read() -> None:
    fmt = IndexedFormat((2, 2))
    near = [("s", 10, 20), ("s", 30, 50), ("s", 50, 60)]
    values = _read(near)
    snapshot = _gathered(_Shard("s", fmt), [3, 0, 2], values, sent=0.0)
    assert snapshot.data is values[0].obj  # type: ignore[union-attr]
    for place, (_, start, stop) in zip([3, 0, 2], near, strict=True):
        where = snapshot.chunk(place)
        assert where is not None
        assert bytes(snapshot.view(where[0], where[0] + where[1])) == BLOB[start:stop]
    assert snapshot.chunk(1) is None


def test_a_snapshot_of_chunks_read_apart_joins_them() -> None:
    fmt = IndexedFormat((2, 2))
    pieces = [("s", 10, 20), ("s", 30, 40), ("s", 3 * MERGE_GAP, 3 * MERGE_GAP + 9)]
    values = [*_read(pieces[:2]), b"", *_read(pieces[2:])]  # two reads, and an empty chunk
    snapshot = _gathered(_Shard("s", fmt), [0, 1, 2, 3], [values[0], values[1], None, values[3]], sent=0.0)
    assert isinstance(snapshot.data, bytes) and len(snapshot.data) == 10 + 10 + 9
    for place, (_, start, stop) in zip([0, 1, 3], pieces, strict=True):
        where = snapshot.chunk(place)
        assert where is not None
        assert bytes(snapshot.view(where[0], where[0] + where[1])) == BLOB[start:stop]
    assert snapshot.chunk(2) is None
    mixed = _gathered(_Shard("s", fmt), [0, 1], [values[0], b"\x01\x02"], sent=0.0)
    assert bytes(mixed.data) == BLOB[10:20] + b"\x01\x02"
