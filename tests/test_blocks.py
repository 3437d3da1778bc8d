"""A shard's chunks as a block of an array: where a shard's block starts in a
selection, views of blocks, and a shard's raw chunks as one array; checked against
chunk-by-chunk placement."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
from hypothesis import given

from shardstore.blocks import block_view, chunks_of_block, shard_origins, stacked_chunks
from shardstore.formats.indexed import IndexedFormat

CHUNK = (3, 2)
BLOCK = (2, 3)


def _chunks_of(array: np.ndarray, origin: tuple[int, int]) -> list[np.ndarray]:
    """The block's chunks one by one, in C order of their places."""
    out = []
    for i in range(BLOCK[0]):
        for j in range(BLOCK[1]):
            r, c = origin[0] + i * CHUNK[0], origin[1] + j * CHUNK[1]
            out.append(array[r : r + CHUNK[0], c : c + CHUNK[1]])
    return out


@given(st.integers(0, 5), st.integers(0, 5))
def test_a_block_view_is_the_blocks_chunks_in_place(r: int, c: int) -> None:
    array = np.arange(20 * 20).reshape(20, 20)
    view = block_view(array, (r, c), BLOCK, CHUNK)
    assert view is not None
    stacked = np.stack(_chunks_of(array, (r, c)))
    np.testing.assert_array_equal(chunks_of_block(stacked, BLOCK), view)
    view[...] = -chunks_of_block(stacked, BLOCK)  # written through: a view, not a copy
    region = (slice(r, r + BLOCK[0] * CHUNK[0]), slice(c, c + BLOCK[1] * CHUNK[1]))
    np.testing.assert_array_equal(array[region], -np.arange(20 * 20).reshape(20, 20)[region])


def test_a_block_past_the_arrays_end_has_no_view() -> None:
    assert block_view(np.zeros((7, 7)), (2, 2), BLOCK, CHUNK) is None


@given(st.permutations(range(6)), st.integers(0, 3))
def test_raw_chunks_side_by_side_in_any_order_are_one_array(order: list[int], gap: int) -> None:
    chunks = [np.full(CHUNK, p, dtype="<i4") for p in range(6)]
    fmt = IndexedFormat(BLOCK)
    body = b"\0" * 4 * gap + b"".join(chunks[p].tobytes() for p in order)
    table = fmt.empty_index()
    for slot, p in enumerate(order):
        table[p] = (4 * gap + slot * 24, 24)
    stacked = stacked_chunks(body, table, np.dtype("<i4"), CHUNK)
    assert stacked is not None
    np.testing.assert_array_equal(stacked, np.stack(chunks))


def test_raw_chunks_that_are_not_side_by_side_are_not_one_array() -> None:
    fmt = IndexedFormat(BLOCK)
    body = bytes(24 * 7)
    full = fmt.empty_index()
    full[:, 0] = np.arange(6) * 24
    full[:, 1] = 24
    assert stacked_chunks(body, full, np.dtype("<i4"), CHUNK) is not None
    for place, row in [(0, (2**64 - 1, 2**64 - 1)), (1, (12, 24)), (2, (0, 24)), (5, (24 * 6, 20))]:
        table = full.copy()
        table[place] = row  # absent, off the grid of slots, a duplicate, short
        assert stacked_chunks(body, table, np.dtype("<i4"), CHUNK) is None
    assert stacked_chunks(bytes(24 * 5), full, np.dtype("<i4"), CHUNK) is None  # past the end


@given(st.integers(0, 2), st.integers(0, 2), st.booleans(), st.booleans())
def test_shards_are_whole_blocks_only_with_every_chunk_at_its_place(
    r: int, c: int, drop_one: bool, swap: bool
) -> None:
    """A selection of the chunks of two shards side by side, starting at (r, c) of the
    output: whole blocks unless a chunk is missing or two trade places."""
    starts, places, shard_of = [], [], []
    for shard in range(2):
        for p in range(6):
            i, j = divmod(p, BLOCK[1])
            starts.append((r + i * CHUNK[0], c + shard * BLOCK[1] * CHUNK[1] + j * CHUNK[1]))
            places.append(p)
            shard_of.append(shard)
    if swap:
        starts[0], starts[1] = starts[1], starts[0]
    if drop_one:
        del starts[-1], places[-1], shard_of[-1]
    origins = shard_origins(
        np.asarray(starts, dtype=np.int64),
        np.asarray(places, dtype=np.int64),
        np.asarray(shard_of, dtype=np.intp),
        2,
        BLOCK,
        CHUNK,
    )
    assert origins[0].tolist() == ([-1, -1] if swap else [r, c])
    assert origins[1].tolist() == ([-1, -1] if drop_one else [r, c + BLOCK[1] * CHUNK[1]])
