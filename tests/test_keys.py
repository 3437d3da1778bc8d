"""Property tests for the key grammar and the chunk -> shard mapping."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given

from shardstore.errors import InvalidKeyError
from shardstore.formats.indexed import IndexedFormat, block_coords
from shardstore.keys import (
    ChunkKeyGrammar,
    candidate_array_paths,
    check_key,
)

grammars = st.sampled_from(
    [
        ChunkKeyGrammar("default", "/"),
        ChunkKeyGrammar("default", "."),
        ChunkKeyGrammar("v2", "/"),
        ChunkKeyGrammar("v2", "."),
    ]
)
coords_st = st.lists(st.integers(0, 10**6), min_size=0, max_size=4).map(tuple)
paths = st.lists(st.sampled_from(["a", "g", "c", "0", "x.y", "12", "données", "\udcff"]), max_size=3).map(
    "/".join
)


@given(grammars, coords_st)
def test_encode_decode_roundtrip(grammar: ChunkKeyGrammar, coords: tuple[int, ...]) -> None:
    assert grammar.decode_rank(grammar.encode(coords), len(coords)) == coords


@given(grammars, coords_st, paths)
def test_array_path_is_a_candidate(grammar: ChunkKeyGrammar, coords: tuple[int, ...], path: str) -> None:
    key = (f"{path}/" if path else "") + grammar.encode(coords)
    assert path in candidate_array_paths(key)


def test_zarr_encodings_spelled_as_zarr_writes_them() -> None:
    assert ChunkKeyGrammar("default", "/").encode((1, 2)) == "c/1/2"
    assert ChunkKeyGrammar("default", ".").encode((1, 2)) == "c.1.2"
    assert ChunkKeyGrammar("default", "/").encode(()) == "c"
    assert ChunkKeyGrammar("v2", ".").encode((1, 2)) == "1.2"
    assert ChunkKeyGrammar("v2", "/").encode(()) == "0"
    assert ChunkKeyGrammar("v2", ".").decode_rank("0", 0) == ()
    assert ChunkKeyGrammar("v2", ".").decode_rank("0", 1) == (0,)


@pytest.mark.parametrize("tail", ["c/01", "c/-1", "c/1a", "c//1", "d/1", "c/+1", "c/1/"])
def test_non_canonical_tails_are_not_chunk_keys(tail: str) -> None:
    assert ChunkKeyGrammar("default", "/").decode(tail) is None


def test_keys_without_chunk_shape_have_no_candidates() -> None:
    assert candidate_array_paths("a/zarr.json") == []
    assert candidate_array_paths("a/.zattrs") == []
    assert candidate_array_paths("a/c/x") == []


@pytest.mark.parametrize("key", ["/abs", "a/../b", "..", "a/.."])
def test_escaping_keys_rejected(key: str) -> None:
    with pytest.raises(InvalidKeyError, match="invalid key"):
        check_key(key)


@st.composite
def grid_case(draw: st.DrawFn) -> tuple[np.ndarray, tuple[int, ...]]:
    ndim = draw(st.integers(1, 4))
    cps = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    coords = draw(
        st.lists(st.lists(st.integers(0, 50), min_size=ndim, max_size=ndim), min_size=1, max_size=20)
    )
    return np.array(coords, dtype=np.int64), cps


def _locate(coords: tuple[int, ...], cps: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    grid = tuple(c + 1 for c in coords)  # (the indexed format's mapping needs no grid)
    return IndexedFormat(cps).locate(coords, grid)


@given(grid_case())
def test_locate_inverts_chunk_coords_in_shard(case: tuple[np.ndarray, tuple[int, ...]]) -> None:
    coords, cps = case
    for row in coords:
        shard, pos = _locate(tuple(int(c) for c in row), cps)
        assert shard == tuple(int(c) for c in row // np.array(cps))  # floor division, as ZEP 2 says
        assert (block_coords(shard, cps)[pos] == row).all()


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
def test_positions_are_c_order(cps: tuple[int, ...]) -> None:
    all_coords = block_coords((0,) * len(cps), cps)
    pos = [_locate(tuple(int(c) for c in row), cps)[1] for row in all_coords]
    assert pos == list(range(int(np.prod(cps))))
    assert [tuple(r) for r in all_coords] == sorted(tuple(r) for r in all_coords)


@given(grammars, st.lists(st.lists(st.integers(0, 10**12), min_size=2, max_size=2), max_size=20), paths)
def test_many_keys_decode_at_once_as_one_by_one(
    grammar: ChunkKeyGrammar, rows: list[list[int]], path: str
) -> None:
    prefix = f"{path}/" if path else ""
    keys = [prefix + grammar.encode(r) for r in rows]
    got = grammar.decode_many(keys, prefix, 2)
    if not rows:
        assert got is None
    else:
        assert got is not None and got.tolist() == rows
        assert [grammar.decode_rank(k[len(prefix) :], 2) for k in keys] == [tuple(r) for r in got.tolist()]


@pytest.mark.parametrize(
    "bad",
    [
        "a/c/01/2",  # a leading zero
        "a/c/1/2/3",  # another rank
        "a/c/1",
        "a/c/+1/2",
        "a/c/1/ 2",
        "a/c/1//2",
        "a/c/1/2x",
        "b/c/1/2",  # another array
        "a/c/1.2",  # another separator
        "a/c/1\n2",  # a newline for a separator (as the keys are parsed joined by newlines)
        "a/c/99999999999999999999/2",  # beyond int64
    ],
)
def test_many_keys_decode_at_once_only_when_every_one_is_canonical(bad: str) -> None:
    grammar = ChunkKeyGrammar("default", "/")
    assert grammar.decode_many(["a/c/3/4", bad, "a/c/5/6"], "a/", 2) is None
    assert grammar.decode_many(["a/c/3/4", "a/c/5/6"], "a/", 2) is not None


@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=3).flatmap(
        lambda cps: st.tuples(
            st.just(tuple(cps)),
            st.lists(st.tuples(*(st.integers(0, 40) for _ in cps)), min_size=1, max_size=30),
        )
    )
)
def test_chunks_locate_at_once_as_one_by_one(case: tuple[tuple[int, ...], list[tuple[int, ...]]]) -> None:
    cps, coords = case
    fmt = IndexedFormat(cps)
    grid = tuple(41 for _ in cps)
    shards, places = fmt.locate_many(np.asarray(coords, dtype=np.int64), grid)
    assert [(tuple(s), p) for s, p in zip(shards.tolist(), places.tolist(), strict=True)] == [
        fmt.locate(c, grid) for c in coords
    ]
