"""Every shard format honours the ShardFormat interface the read and write paths use."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstore.errors import ShardFormatError
from shardstore.formats.base import ShardFormat
from shardstore.formats.indexed import IndexedFormat
from shardstore.formats.precomputed import PrecomputedSharding, locate_ids

INDEXED = IndexedFormat((4, 4), "end", True)
PRECOMPUTED = PrecomputedSharding(0, "murmurhash3_x86_128", 2, 0, "gzip", "gzip")
FORMATS = [INDEXED, IndexedFormat((2, 8), "start"), PRECOMPUTED, PrecomputedSharding(1, "identity", 1, 0)]


def chunk_ids(fmt: ShardFormat) -> st.SearchStrategy[int]:
    if isinstance(fmt, IndexedFormat):
        return st.integers(0, fmt.n_chunks - 1)
    return st.integers(0, 2**64 - 1)  # shard_bits 0: every id is in shard 0


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_configuration_round_trips(fmt: ShardFormat) -> None:
    assert type(fmt).from_config(fmt.to_config(), "test") == fmt


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_build_then_split_round_trips_with_no_problems(fmt: ShardFormat, data: st.DataObject) -> None:
    chunks = data.draw(st.dictionaries(chunk_ids(fmt), st.binary(min_size=1, max_size=40), min_size=1))
    blob = fmt.build(chunks)
    assert fmt.split(blob, "0.shard") == chunks
    assert fmt.problems(blob, "0.shard") == []


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_the_index_request_finds_the_first_level_index(fmt: ShardFormat) -> None:
    request = fmt.index_request()
    blob = fmt.build({1: b"abc", 3: b"defg"})
    start = getattr(request, "start", None)
    assert start == 0 or getattr(request, "suffix", None) is not None
    if start == 0:
        assert request.end <= len(blob)  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
def test_a_truncated_shard_is_a_format_error_naming_its_key(fmt: ShardFormat) -> None:
    blob = fmt.build({1: b"abc", 3: b"defg"})
    with pytest.raises(ShardFormatError, match=r"0\.shard"):
        fmt.split(blob[: len(blob) // 2], "0.shard")
    assert fmt.problems(blob[: len(blob) // 2], "0.shard")


def test_only_the_indexed_format_with_its_index_at_the_end_is_appendable() -> None:
    assert INDEXED.appendable
    assert not IndexedFormat((4, 4), "start").appendable
    assert not PRECOMPUTED.appendable


def test_only_the_indexed_format_lays_out_dense_shards_for_callers_to_fill() -> None:
    """Precomputed shards order chunks by minishard and may gzip them: no fixed place
    for a chunk's bytes before they are known."""
    assert PRECOMPUTED.dense_shards(16, 2) is None
    blob, area = INDEXED.dense_shards(3, 1)[0]  # type: ignore[index]
    area[:] = bytes(range(48))
    assert INDEXED.split(bytes(blob), "0.shard") == {p: bytes(range(3 * p, 3 * p + 3)) for p in range(16)}


def test_precomputed_ids_of_one_shard_land_in_it() -> None:
    fmt = PrecomputedSharding(0, "identity", 1, 2)
    ids = np.arange(64, dtype=np.uint64)
    shards, _ = locate_ids(fmt, ids)
    mine = {int(i): b"x" for i in ids[shards == 2]}
    assert fmt.split(fmt.build(mine), "2.shard") == mine


def test_an_indexed_format_can_be_given_as_the_sharding_of_new_arrays() -> None:
    import zarr

    from shardstore import ShardingStore

    backing: dict[str, bytes] = {}
    store = ShardingStore(backing, IndexedFormat((2, 2), "start", True))
    zarr.create_array(store, name="a", shape=(8, 8), chunks=(2, 2), dtype="u1")[:] = 3
    zarr.create_array(store, name="line", shape=(8,), chunks=(2,), dtype="u1")[:] = 1  # other rank: plain
    by_path = ShardingStore(backing, {"b": IndexedFormat((4, 1))})
    zarr.create_array(by_path, name="b", shape=(8, 8), chunks=(2, 2), dtype="u1")[:] = 5
    assert sorted(k for k in backing if k.startswith("a/c/")) == ["a/c/0/0", "a/c/0/1", "a/c/1/0", "a/c/1/1"]
    assert sorted(k for k in backing if k.startswith("b/c/")) == [f"b/c/0/{j}" for j in range(4)]
    assert len([k for k in backing if k.startswith("line/c/")]) == 4
    assert (zarr.open_array(ShardingStore(backing), path="a")[:] == 3).all()
