"""Property tests for the binary shard format, and its failure modes."""

from __future__ import annotations

import itertools
import math

import google_crc32c
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from shardstore.errors import ShardFormatError
from shardstore.formats.indexed import (
    MISSING,
    IndexedFormat,
)

layouts = st.builds(
    IndexedFormat,
    st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
    st.sampled_from(["start", "end"]),
    st.booleans(),
)


@st.composite
def layouts_and_chunks(draw: st.DrawFn) -> tuple[IndexedFormat, dict[int, bytes]]:
    layout = draw(layouts)
    positions = draw(st.sets(st.integers(0, layout.n_chunks - 1)))
    return layout, {p: draw(st.binary(max_size=40)) for p in positions}


@given(layouts_and_chunks())
def test_build_then_split_roundtrip(case: tuple[IndexedFormat, dict[int, bytes]]) -> None:
    layout, chunks = case
    shard = layout.build(chunks)
    assert len(shard) == sum(map(len, chunks.values())) + layout.index_nbytes
    assert layout.split(shard, "k") == chunks


@given(layouts_and_chunks())
def test_index_is_little_endian_pairs_in_c_order(case: tuple[IndexedFormat, dict[int, bytes]]) -> None:
    layout, chunks = case
    shard = layout.build(chunks)
    raw = shard[: layout.index_nbytes] if layout.index_location == "start" else shard[-layout.index_nbytes :]
    pairs = np.frombuffer(raw[: 16 * layout.n_chunks], dtype="<u8").reshape(-1, 2)
    for pos in range(layout.n_chunks):
        if pos in chunks:
            offset, nbytes = map(int, pairs[pos])
            assert shard[offset : offset + nbytes] == chunks[pos]
        else:
            assert tuple(map(int, pairs[pos])) == (MISSING, MISSING)
    if layout.index_checksum:
        assert int.from_bytes(raw[-4:], "little") == google_crc32c.value(raw[:-4])


@given(layouts)
def test_index_encode_decode_roundtrip(layout: IndexedFormat) -> None:
    index = layout.empty_index()
    n = len(index[::2])
    index[::2, 0] = np.arange(n, dtype=np.uint64) * 10  # disjoint ranges
    index[::2, 1] = np.arange(n, dtype=np.uint64) % 10
    assert np.array_equal(layout.decode_index(layout.encode_index(index), "k"), index)


def test_spec_example_index_size() -> None:
    # sharding_indexed v1.0: 4 chunks with [bytes, crc32c] index codecs -> 68 bytes
    assert IndexedFormat((2, 2), "end", True).index_nbytes == 68
    assert IndexedFormat((32, 2)).index_nbytes == 1024


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([[0, 3], [0, 3]], "duplicated entries: chunk 0 .* and chunk 1"),
        ([[0, 3], [2, 1]], "overlapping ranges: chunk 0 .* and chunk 1"),
        ([[2**60, 1], [0, 3]], "impossible range"),
        ([[0, MISSING], [0, 3]], "only one of offset/nbytes"),
    ],
)
def test_inconsistent_indices_are_damage(pairs: list[list[int]], message: str) -> None:
    """Each chunk has bytes of its own: overlapping or duplicated entries are damage."""
    layout = IndexedFormat((2,))
    shard = b"abcd" + layout.encode_index(np.array(pairs, dtype=np.uint64))
    with pytest.raises(ShardFormatError, match=message):
        layout.split(shard, "k")


def test_empty_chunks_are_data() -> None:
    layout = IndexedFormat((2,))
    shard = layout.build({0: b"", 1: b"ab"})
    assert layout.split(shard, "k") == {0: b"", 1: b"ab"}


LAYOUT = IndexedFormat((2, 2))


def _shard() -> bytes:
    return LAYOUT.build({0: b"aaaa", 3: b"bb"})


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (lambda s: s[:10], "fewer than its 64-byte index"),
        (lambda s: s[:-1], "only one of offset|outside the data area"),
        (lambda s: b"", "fewer than"),
    ],
)
def test_truncated_shards(corrupt: object, message: str) -> None:
    with pytest.raises(ShardFormatError, match=message) as info:
        LAYOUT.split(corrupt(_shard()), "arr/c/0/0")  # type: ignore[operator]
    assert "arr/c/0/0" in str(info.value)


def _with_entry(pos: int, offset: int, nbytes: int) -> bytes:
    index = LAYOUT.empty_index()
    index[0] = (0, 4)
    index[pos] = (offset, nbytes)
    return b"aaaabb" + LAYOUT.encode_index(index)


@pytest.mark.parametrize(
    ("offset", "nbytes", "message"),
    [
        (4, 3, "outside the data area"),  # runs into the index
        (100, 1, "outside the data area"),  # past the end
        (2**63, 2**63, "impossible range"),  # would overflow uint64
        (MISSING, 5, "only one of offset/nbytes"),
        (5, MISSING, "only one of offset/nbytes"),
    ],
)
def test_bad_index_entries(offset: int, nbytes: int, message: str) -> None:
    with pytest.raises(ShardFormatError, match=message) as info:
        LAYOUT.split(_with_entry(2, offset, nbytes), "arr/c/1")
    assert ("arr/c/1" in str(info.value) and "chunk 2" in str(info.value)) or "entry 2" in str(info.value)


def test_index_at_start_ranges_exclude_the_index() -> None:
    layout = IndexedFormat((2,), "start")
    index = np.array([[0, 4], [MISSING, MISSING]], dtype=np.uint64)  # offset 0 is inside the index
    with pytest.raises(ShardFormatError, match="outside the data area"):
        layout.check_ranges(index, 40, "k")


def test_checksum_mismatch() -> None:
    layout = IndexedFormat((2, 2), "end", True)
    shard = bytearray(layout.build({1: b"xyz"}))
    shard[-1] ^= 0xFF
    with pytest.raises(ShardFormatError, match="checksum mismatch"):
        layout.split(bytes(shard), "k")


@given(st.binary(min_size=64, max_size=200))
def test_garbage_never_escapes_as_other_errors(garbage: bytes) -> None:
    """Random bytes either parse into in-bounds chunks or raise ShardFormatError."""
    try:
        chunks = LAYOUT.split(garbage, "k")
    except ShardFormatError:
        return
    assert all(len(v) <= len(garbage) - 64 for v in chunks.values())
    assert len(chunks) <= math.prod(LAYOUT.chunks_per_shard)


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 50)), max_size=30), st.integers(0, 100))
def test_merge_ranges_covers_every_range_and_keeps_gaps(pairs: list[tuple[int, int]], gap: int) -> None:
    from shardstore.reading.ranges import merge_ranges

    ranges = [(i, start, start + length) for i, (start, length) in enumerate(pairs)]
    spans = merge_ranges(ranges, gap)
    members = sorted(m for _, _, ms in spans for m in ms)
    assert members == sorted(ranges)  # every range in exactly one span
    for start, stop, ms in spans:
        assert all(start <= s and e <= stop for _, s, e in ms)
        assert start == min(s for _, s, _ in ms) and stop == max(e for _, _, e in ms)
    for (_, prev_stop, _), (next_start, _, _) in itertools.pairwise(spans):
        assert next_start - prev_stop > gap  # spans stay apart only where the gap is large


@given(layouts, st.integers(1, 9), st.integers(1, 3), st.data())
def test_dense_shards_are_what_build_makes_of_the_same_chunks(
    layout: IndexedFormat, chunk_nbytes: int, count: int, data: st.DataObject
) -> None:
    """Shard objects laid out for every chunk present, filled in place, are byte for
    byte the shards build() makes; filling one leaves the others as they were. Also
    in memory given again (``empty``), which still holds what it held before."""
    used: list[np.ndarray] = []

    def used_before(rows: int, nbytes: int) -> np.ndarray:
        used.append(np.full((rows + 1, nbytes), 0xAB, dtype=np.uint8))
        return used[-1][:rows]

    again = data.draw(st.booleans())
    objects = (
        layout.dense_shards(chunk_nbytes, count, used_before)
        if again
        else layout.dense_shards(chunk_nbytes, count)
    )
    assert len(objects) == count
    assert (
        all(np.shares_memory(np.frombuffer(blob, np.uint8), used[0]) for blob, _ in objects)
        if again
        else not used
    )
    every = [
        {
            p: data.draw(st.binary(min_size=chunk_nbytes, max_size=chunk_nbytes))
            for p in range(layout.n_chunks)
        }
        for _ in objects
    ]
    for (_, area), chunks in zip(objects, every, strict=True):
        assert area.nbytes == layout.n_chunks * chunk_nbytes and not area.readonly
        area[:] = b"".join(chunks[p] for p in range(layout.n_chunks))
    for (blob, _), chunks in zip(objects, every, strict=True):
        assert bytes(blob) == layout.build(chunks)
        assert layout.split(bytes(blob), "k") == chunks


_ranges = st.one_of(st.just((MISSING, MISSING)), st.tuples(st.integers(0, 600), st.integers(0, 80)))
"""An index entry: absent, or a range (overlapping others, out of order, past the end...)."""
_odd = st.sampled_from([(MISSING, 5), (0, MISSING), (2**60, 5), (0, 2**60)])
"""An entry half empty, or absurdly large."""


@st.composite
def raw_indices(draw: st.DrawFn) -> tuple[IndexedFormat, list[bytes], list[int]]:
    """A layout, several raw indices of it (many sound, some damaged), and shard sizes."""
    layout = draw(layouts)
    raws, sizes = [], []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):  # a sound shard, as built
            chunks = {
                p: draw(st.binary(max_size=20)) for p in draw(st.sets(st.integers(0, layout.n_chunks - 1)))
            }
            shard = layout.build(chunks)
            raw = shard[layout.index_slice(len(shard))]
            size = len(shard) - draw(st.sampled_from([0, 0, 0, 1]))  # (a byte short: out of bounds)
        else:
            pairs = draw(st.lists(_ranges, min_size=layout.n_chunks, max_size=layout.n_chunks))
            if draw(st.integers(0, 3)) == 0:
                pairs[draw(st.integers(0, layout.n_chunks - 1))] = draw(_odd)
            raw = layout.encode_index(np.array(pairs, dtype=np.uint64))
            size = draw(st.integers(0, 700))
        if draw(st.integers(0, 9)) == 0:
            raw = raw[:-1]  # cut short
        raws.append(raw)
        sizes.append(size)
    return layout, raws, sizes


def _one_by_one(layout: IndexedFormat, raws: list[bytes], sizes: list[int]) -> object:
    """What decoding and checking each index in turn gives: the tables, or the first error."""
    try:
        tables = [layout.decode_index(raw, f"s/{k}") for k, raw in enumerate(raws)]
        for k, (table, size) in enumerate(zip(tables, sizes, strict=True)):
            layout.check_table(table, size, f"s/{k}")
    except ShardFormatError as exc:
        return str(exc)
    return [table.tolist() for table in tables]


@st.composite
def whole_shards(draw: st.DrawFn) -> tuple[IndexedFormat, bytes]:
    """A layout and a whole shard object of it: mostly every chunk present, one after
    another with gaps as a writer lays them out, then now and then one entry changed
    (onto another, past the end, absent, half empty...); the first may start in the
    index, the last may run past the end."""
    layout = draw(layouts)
    base = layout.index_nbytes if layout.index_location == "start" else 0
    pairs, at = [], base - (draw(st.sampled_from([0, 0, 1])) if base else 0)  # (1: into the index)
    for _ in range(layout.n_chunks):
        at += draw(st.sampled_from([0, 0, 0, 3, -1])) if at > base else 0  # (-1: onto the last byte before)
        nbytes = draw(st.integers(0, 9))
        pairs.append((at, nbytes))
        at += nbytes
    if draw(st.integers(0, 2)) == 0:
        pairs[draw(st.integers(0, layout.n_chunks - 1))] = draw(st.one_of(_ranges, _odd))
    data_end = at + draw(st.sampled_from([0, 0, 2, -1]))  # (a byte short: the last runs past)
    data = bytes(max(data_end - base, 0))
    raw = layout.encode_index(np.array(pairs, dtype=np.uint64))
    return layout, (raw + data if layout.index_location == "start" else data + raw)


@given(whole_shards())
def test_a_whole_shard_parses_as_its_index_and_ranges_check_one_after_the_other(
    case: tuple[IndexedFormat, bytes],
) -> None:
    """parse checks an index whose chunks are all present and in order with four numpy
    calls: the same table, or the same error, as decode_index then check_ranges."""
    layout, blob = case
    try:
        want: object = layout.decode_index(blob[layout.index_slice(len(blob))], "s/0")
        layout.check_ranges(want, len(blob), "s/0")  # type: ignore[arg-type]
    except ShardFormatError as exc:
        want = str(exc)
    try:
        got: object = layout.parse(blob, "s/0")
    except ShardFormatError as exc:
        got = str(exc)
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == np.uint64 and got.tolist() == want.tolist()
    else:
        assert got == want


@given(raw_indices())
def test_indices_decoded_and_checked_together_are_as_one_by_one(
    case: tuple[IndexedFormat, list[bytes], list[int]],
) -> None:
    """read_parts and check_tables check many indices with numpy at once: the same
    tables, or the same error (the first damaged index's, or the first out of bounds)."""
    layout, raws, sizes = case
    keys = [f"s/{k}" for k in range(len(raws))]
    want = _one_by_one(layout, raws, sizes)
    try:
        tables = layout.read_parts([0] * len(raws), raws, keys)
    except ShardFormatError as exc:
        assert isinstance(want, str)
        # (a damaged index raises before any is checked against its shard's size)
        assert str(exc) == _one_by_one(layout, raws, [2**40] * len(raws))
        return
    try:
        layout.check_tables(tables, sizes, keys)
    except ShardFormatError as exc:
        assert str(exc) == want
        return
    assert [np.asarray(table).tolist() for table in tables] == want
