"""A shard's chunks as a block of an array: which chunks of each shard a selection
covers as a box of its block, views of blocks, and a shard's raw chunks as one
array; checked against chunk-by-chunk placement."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
from hypothesis import given

from shardstore.blocks import Box, block_view, chunks_of_block, is_block, shard_boxes, stacked_chunks
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


@given(st.integers(0, 5), st.integers(0, 5), st.sampled_from(["C", "F", "strided"]))
def test_a_block_view_is_the_blocks_chunks_in_place(r: int, c: int, layout: str) -> None:
    """Also over arrays in Fortran order or with gaps between elements (an output
    array zarr made so, or a selection with a step): always a view, never a copy."""
    values = np.arange(20 * 20).reshape(20, 20)
    if layout == "strided":
        array = np.zeros((40, 60), dtype=values.dtype)[::2, ::3]
        array[...] = values
    else:
        array = np.array(values, order=layout)
    view = block_view(array, (r, c), BLOCK, CHUNK)
    assert view is not None
    stacked = np.stack(_chunks_of(array, (r, c)))
    np.testing.assert_array_equal(chunks_of_block(stacked, BLOCK), view)
    view[...] = -chunks_of_block(stacked, BLOCK)  # written through: a view, not a copy
    region = (slice(r, r + BLOCK[0] * CHUNK[0]), slice(c, c + BLOCK[1] * CHUNK[1]))
    np.testing.assert_array_equal(array[region], -values[region])


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


@given(st.permutations(range(6)), st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True))
def test_raw_chunks_at_any_rows_of_the_index_are_one_array(order: list[int], rows: list[int]) -> None:
    """Some of a shard's chunks (a box of its block that is no whole block), in the
    order of the rows asked for."""
    chunks = [np.full(CHUNK, p, dtype="<i4") for p in range(6)]
    body = b"".join(chunks[p].tobytes() for p in order)
    table = IndexedFormat(BLOCK).empty_index()
    for slot, p in enumerate(order):
        table[p] = (slot * 24, 24)
    stacked = stacked_chunks(body, table[rows], np.dtype("<i4"), CHUNK)
    assert stacked is not None
    np.testing.assert_array_equal(stacked, np.stack([chunks[p] for p in rows]))


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
    output: whole blocks unless a chunk is missing (five of six: no box) or two trade
    places."""
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
    boxes = shard_boxes(
        np.asarray(starts, dtype=np.int64),
        np.asarray(places, dtype=np.int64),
        np.asarray(shard_of, dtype=np.intp),
        2,
        BLOCK,
        CHUNK,
    )
    assert boxes[0] == (None if swap else Box((r, c), (0, 0), BLOCK))
    assert boxes[1] == (None if drop_one else Box((r, c + BLOCK[1] * CHUNK[1]), (0, 0), BLOCK))
    assert [is_block(box, BLOCK) for box in boxes] == [not swap, not drop_one]


BIG_BLOCK = (4, 5)


@given(st.data())
def test_any_box_of_a_block_is_found_and_anything_else_is_not(data: st.DataObject) -> None:
    """The chunks of a box of a shard's block (any corner, any extent), each where a
    selection starting at ``at`` puts it: that box; with one chunk left out, or one
    moved, no box (unless what is left is a smaller box)."""
    low = (data.draw(st.integers(0, BIG_BLOCK[0] - 1)), data.draw(st.integers(0, BIG_BLOCK[1] - 1)))
    extent = (
        data.draw(st.integers(1, BIG_BLOCK[0] - low[0])),
        data.draw(st.integers(1, BIG_BLOCK[1] - low[1])),
    )
    at = (data.draw(st.integers(0, 9)), data.draw(st.integers(0, 9)))
    coords = [(low[0] + i, low[1] + j) for i in range(extent[0]) for j in range(extent[1])]
    coords = data.draw(st.permutations(coords))  # zarr's order is no concern
    starts = [(at[0] + (i - low[0]) * CHUNK[0], at[1] + (j - low[1]) * CHUNK[1]) for i, j in coords]
    places = [i * BIG_BLOCK[1] + j for i, j in coords]

    def boxes(starts: list[tuple[int, int]], places: list[int]) -> list[Box | None]:
        return shard_boxes(
            np.asarray(starts, dtype=np.int64).reshape(-1, 2),
            np.asarray(places, dtype=np.int64),
            np.zeros(len(places), dtype=np.intp),
            1,
            BIG_BLOCK,
            CHUNK,
        )

    assert boxes(starts, places) == [Box(at, low, extent)]
    if len(coords) > 1:
        k = data.draw(st.integers(0, len(coords) - 1))
        left = coords[:k] + coords[k + 1 :]
        rows, cols = {i for i, _ in left}, {j for _, j in left}
        still_a_box = (
            len(left) == len(rows) * len(cols)
            and max(rows) - min(rows) + 1 == len(rows)
            and (max(cols) - min(cols) + 1 == len(cols))
        )
        found = boxes(starts[:k] + starts[k + 1 :], places[:k] + places[k + 1 :])[0]
        assert (found is not None) is still_a_box
        moved = list(starts)
        moved[k] = (moved[k][0] + 1, moved[k][1])  # not where its place says
        assert boxes(moved, places) == [None]


def test_a_shard_no_chunk_of_which_is_selected_is_no_box() -> None:
    starts = np.asarray([(0, 0)], dtype=np.int64)
    got = shard_boxes(starts, np.asarray([0]), np.asarray([1], dtype=np.intp), 3, BLOCK, CHUNK)
    assert got == [None, Box((0, 0), (0, 0), (1, 1)), None]
